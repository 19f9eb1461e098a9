"""One training step, as the trainer, the accounting report and the benchmark all run it."""

from tinygrad_like import backend


def forward_backward(model, x, y, scaler=None, micro_batches=1, watch=None):
    """Forward and backward of one micro-batch: its loss divided by the number of micro-batches
    (over every rank: the gradients are then summed across ranks) and times the fp16 loss
    scale. watch() runs between the two (the accounting reads the tape there). -> the
    micro-batch's loss (a float, unscaled, divided as the gradients are); None on the meta
    device, which has no values."""
    loss = model(x, y)[1]  # the (B, T, V) logits die right here
    loss = loss / micro_batches if micro_batches > 1 else loss
    scaled = scaler.scale_loss(loss) if scaler else loss
    if watch is not None:
        watch()
    scaled.backward()
    return loss.item() if backend.holds_values(loss.data) else None


def train_on(model, optimizer, batches, scaler=None, lr=None, watch=None):
    """One optimizer step over this rank's micro-batches [(x, y), ...]: zero_grad, then
    forward_backward each, then the AdamW step (which sums the gradients over the ranks).
    -> (the loss of the whole global batch, gradient norm, skipped for overflow); on the
    meta device (None, None, None): no values."""
    comm = optimizer.comm
    optimizer.zero_grad()
    parts = len(batches) * comm.size
    losses = [forward_backward(model, x, y, scaler, parts, watch) for x, y in batches]
    total = comm.sum_scalar(None if None in losses else sum(losses), what="loss")
    norm, skipped = optimizer.step(scaler, lr=lr)
    return total, norm, skipped
