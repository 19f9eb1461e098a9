"""The peak MFU divides by (MFU = achieved model FLOP/s / peak; the model FLOPs per token are
the model's own formula, GPT2Config.flops_per_token), and MFU as printed.

The peak is this machine's (tinygrad_like/peaks.py): on a CPU the dtype's matmul peak (fp32's,
measured once per machine and cached, unless a run's own GEMMs in the dtype beat it: bf16's by
AVX-512 BF16's dot products), so the progress bar, metrics.jsonl, the accounting report and the
bench all divide by the same number, however busy the host is when a run starts; on a GPU the
datasheet's dense rate for the dtype. No run reaches 100% of a true peak: an MFU above it says
the peak is too low (measured while other processes took the CPU), and is printed as that.
"""

from tinygrad_like import backend, peaks


def device_peak(device, dtype_name, machine=None):
    """-> (FLOP/s, a phrase naming where the number comes from); None on the meta device,
    which runs nothing. machine: the Peaks to read on a CPU (default peaks.get's)."""
    be = backend.get(device)
    if not be.HOLDS_VALUES:
        return None, "no peak: the meta device runs nothing"
    if not be.GPU:
        cached = machine or peaks.get(device)
        rate = cached.flops(dtype_name)
        whose = dtype_name if dtype_name in cached.matmul else "fp32"
        condition = cached.condition()
        return rate, (
            f"{whose} matmul peak of this CPU, {rate / 1e9:.0f} GFLOP/s (measured {cached.when}"
            + (f"; {condition}" if cached.busy else "")
            + f"; cached, {peaks.REMEASURE}=1 measures again)"
        )
    return peaks.datasheet(dtype_name, be.device_name())


def percent(mfu, digits=1):
    """MFU as printed: a percentage, or above 100% a flag that the peak it divides by is too
    low (no run reaches a true peak), never the figure above 100% as if it were one."""
    return f"{mfu:.{digits}%}" if mfu <= 1 else "over 100%: the peak is too low"
