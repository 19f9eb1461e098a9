"""One training step, as the trainer, the accounting report and the benchmark all run it."""


def forward_backward(model, x, y, scaler=None, micro_batches=1, watch=None):
    """Forward and backward of one micro-batch: its loss divided by the number of micro-batches
    and times the fp16 loss scale. watch() runs between the two (the accounting reads the tape
    there). -> the micro-batch's loss (a float, unscaled)."""
    loss = model(x, y)[1]                   # the (B, T, V) logits die right here
    loss = loss / micro_batches if micro_batches > 1 else loss
    scaled = scaler.scale_loss(loss) if scaler else loss
    if watch is not None:
        watch()
    scaled.backward()
    return loss.item()


def train_on(model, optimizer, batches, scaler=None, lr=None, watch=None):
    """One optimizer step over micro-batches [(x, y), ...]: forward_backward each, then the
    fused AdamW step and zero_grad. -> (loss summed over the micro-batches, gradient norm,
    skipped for overflow)."""
    total = sum(forward_backward(model, x, y, scaler, len(batches), watch) for x, y in batches)
    norm, skipped = optimizer.step(scaler, lr=lr)
    optimizer.zero_grad()
    return total, norm, skipped
