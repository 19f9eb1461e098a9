"""The peak MFU divides by (MFU = achieved model FLOP/s / peak; the model FLOPs per token are
the model's own formula, GPT2Config.flops_per_token).

The peak is this machine's (tinygrad_like/peaks.py): on a CPU its fp32 matmul peak, measured
once per machine and cached, so the progress bar, metrics.jsonl, the accounting report and the
bench all divide by the same number, however busy the host is when a run starts; on a GPU the
datasheet's dense rate for the dtype.
"""

from tinygrad_like import backend, peaks


def device_peak(device, dtype_name):
    """-> (FLOP/s, a phrase naming where the number comes from); None on the meta device,
    which runs nothing."""
    if device == "meta":
        return None, "no peak: the meta device runs nothing"
    if device == "cpu":
        cached = peaks.get("cpu")
        rate = cached.flops("fp32")
        return rate, (
            f"fp32 matmul peak of this CPU, {rate / 1e9:.0f} GFLOP/s (measured {cached.when}, "
            f"cached; {peaks.REMEASURE}=1 measures again)"
        )
    return peaks.datasheet(dtype_name, backend.get("cuda").device_name())
