"""Model FLOPs and the peak they are divided by (MFU = achieved model FLOP/s / peak).

Model FLOPs per token of a training step = 6N + 12 L C T: every parameter costs 2 FLOPs
forward and 4 backward per token (the tied embedding is paid in full as the LM head), and
attention's own matmuls (QK^T and probs V) cost 4 C T forward and 8 C T backward per token per
layer, counting the masked half of the T x T scores as computed (that is what the kernels do).
The other public convention, 6N + 6 L C T, assumes the masked half is skipped.
"""

import time

import numpy as np

from tinygrad_like import backend

# dense tensor-core peaks from NVIDIA's datasheets (FLOP/s), by a substring of the device name
DATASHEET_PEAKS = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
}


def training_flops_per_token(config, seq_len, n_params):
    return 6 * n_params + 12 * config.n_layer * config.n_embd * seq_len


def best_seconds(fn, repeats=5):
    """The fastest of `repeats` timed calls of fn, after one untimed warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_cpu_matmul_peak(n=1024, repeats=5):
    """The best fp32 GEMM throughput NumPy's BLAS reaches here (FLOP/s): the CPU's practical
    peak, since no datasheet number describes a laptop's sustained AVX throughput."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    return 2 * n**3 / best_seconds(lambda: np.matmul(a, b, out=out), repeats)


def device_peak(device, dtype_name):
    """-> (FLOP/s, a phrase naming where the number comes from)."""
    if device == "cpu":
        peak = measure_cpu_matmul_peak()
        return peak, f"measured fp32 matmul peak of this CPU, {peak / 1e9:.0f} GFLOP/s"
    name = backend.get("cuda").device_name()
    for key, peaks in DATASHEET_PEAKS.items():
        if key in name:
            peak = peaks[dtype_name]
            return peak, f"{key} datasheet dense {dtype_name}, {peak / 1e12:.0f} TFLOP/s"
    peak = 989e12
    return peak, f"unknown GPU {name!r}: assumed H100 dense bf16, 989 TFLOP/s"
