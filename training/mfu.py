"""Model FLOPs and the peak they are divided by (MFU = achieved model FLOP/s / peak).

Model FLOPs per token of a training step = 6N + 12 L C T: every parameter costs 2 FLOPs
forward and 4 backward per token (the tied embedding is paid in full as the LM head), and
attention's own matmuls (QK^T and probs V) cost 4 C T forward and 8 C T backward per token per
layer, counting the masked half of the T x T scores as computed (that is what the kernels do).
The other public convention, 6N + 6 L C T, assumes the masked half is skipped.

The peak is this machine's (tinygrad_like/peaks.py): on a CPU its fp32 matmul peak, measured
once per machine and cached, so the progress bar, metrics.jsonl, the accounting report and the
bench all divide by the same number, however busy the host is when a run starts; on a GPU the
datasheet's dense rate for the dtype.
"""

from tinygrad_like import backend, peaks


def training_flops_per_token(config, seq_len, n_params):
    return 6 * n_params + 12 * config.n_layer * config.n_embd * seq_len


def device_peak(device, dtype_name):
    """-> (FLOP/s, a phrase naming where the number comes from)."""
    if device == "cpu":
        cached = peaks.get("cpu")
        rate = cached.flops("fp32")
        return rate, (
            f"fp32 matmul peak of this CPU, {rate / 1e9:.0f} GFLOP/s (measured {cached.when}, "
            f"cached; {peaks.REMEASURE}=1 measures again)"
        )
    return peaks.datasheet(dtype_name, backend.get("cuda").device_name())
