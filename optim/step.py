"""One training step, as the trainer, the accounting report and the benchmark all run it: its
kernels (device_step, which tinygrad_like.compile can capture: no value read on the host but by
host calls) and the reads that follow (train_on)."""

from tinygrad_like import backend


def forward_backward(model, x, y, scaler=None, micro_batches=1, watch=None):
    """Forward and backward of one micro-batch: its loss divided by the number of micro-batches
    (over every rank: the gradients are then summed across ranks) and times the fp16 loss
    scale. watch() runs between the two (the accounting reads the tape there). -> the
    micro-batch's loss, a 0-d device array (unscaled, divided as the gradients are)."""
    loss = model(x, y)[1]  # the (B, T, V) logits die right here
    loss = loss / micro_batches if micro_batches > 1 else loss
    scaled = scaler.scale_loss(loss) if scaler else loss
    if watch is not None:
        watch()
    scaled.backward()
    return loss.data


def device_step(model, optimizer, batches, scaler=None, watch=None):
    """zero_grad, forward_backward each micro-batch [(x, y), ...], the AdamW step (which sums
    the gradients over the ranks) -> ([each micro-batch's loss, a device array], (gradient
    norm, skipped for overflow): AdamW.step's)."""
    optimizer.zero_grad()
    parts = len(batches) * optimizer.comm.size
    losses = [forward_backward(model, x, y, scaler, parts, watch) for x, y in batches]
    return losses, optimizer.step(scaler)


def train_on(model, optimizer, batches, scaler=None, lr=None, watch=None, step=device_step):
    """One optimizer step over this rank's micro-batches at learning rate lr (None: AdamW's)
    -> (the loss of the whole global batch, gradient norm, skipped for overflow); on the
    meta device (None, None, None): no values. step(model, optimizer, batches, scaler, watch):
    device_step, or its capture."""
    if lr is not None:
        optimizer.lr = lr
    losses, (norm, skipped) = step(model, optimizer, batches, scaler, watch)
    if backend.holds_values(losses[0]):
        total = sum(float(backend.of(a).to_numpy(a)) for a in losses)
    else:
        total = None
    return optimizer.comm.sum_scalar(total, what="loss"), norm, skipped
