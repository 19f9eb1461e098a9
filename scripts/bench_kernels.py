"""Time every CUDA kernel at GPT-2 124M training shapes and compare it with what the GPU can do.

Shapes: B=8, T=1024, C=768, H=12 (D=64), V=50257, the MLP's 4C and the QKV projection's 3C.
Each kernel is warmed up (which also compiles it), then timed with CUDA events: 7 samples of 5
back-to-back launches, median per launch. The table gives, per kernel and dtype:
  GEMMs: TFLOP/s (2 M N K per product) and the fraction of cuBLAS (cupy.matmul on the same
         sizes, fp32 compute, operands already in its preferred layout), the cuBLAS time beside;
  everything else: GB/s over the minimum traffic (each input read once, each output written
         once) and the fraction of the DRAM bandwidth (default: H200, HBM3e, 4.8 TB/s).

Usage: python scripts/bench_kernels.py [--dtypes bf16,fp16,fp32] [--json PATH] [--peak-gbs 4800]
"""
import argparse
import json
import statistics

import cupy
import numpy as np

from tinygrad_like import dtypes
from tinygrad_like.backend import cuda

B, T, C, H, V = 8, 1024, 768, 12, 50257
BT, D = B * T, C // H
N_PARAMS = 124_439_808  # GPT-2 124M


def time_ms(fn, samples=7, repeats=5, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(samples):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / repeats)
    return statistics.median(times)


def measure(label, fn):
    """time_ms(fn), or NaN (with the error printed) so one failing kernel does not stop the table."""
    try:
        return time_ms(fn)
    except Exception as e:  # report and go on: this runs once per GPU session
        print(f"ERROR {label}: {type(e).__name__}: {e}")
        return float("nan")


def rand(shape, dtype, scale=1.0):
    return (cupy.random.standard_normal(shape, dtype=cupy.float32) * scale).astype(dtype)


# (name, kernel, batch, M, K, N, bias): the product is (M x K) @ (K x N) per batch entry.
GEMMS = [
    ("qkv X W + b", "matmul", (), BT, C, 3 * C, True),
    ("attn proj X W + b", "matmul", (), BT, C, C, True),
    ("fc X W + b", "matmul", (), BT, C, 4 * C, True),
    ("fc proj X W + b", "matmul", (), BT, 4 * C, C, True),
    ("lm_head X Wte^T", "matmul_nt", (), BT, C, V, False),
    ("fc dX = dY W^T", "matmul_nt", (), BT, 4 * C, C, False),
    ("fc dW = X^T dY", "matmul_tn", (), C, BT, 4 * C, False),
    ("lm_head dX = dL Wte", "matmul", (), BT, V, C, False),
    ("lm_head dWte = dL^T X", "matmul_tn", (), V, BT, C, False),
    ("attn Q K^T", "matmul_nt", (B, H), T, D, T, False),
    ("attn P V", "matmul", (B, H), T, T, D, False),
]


def gemm_rows(dtype):
    rows = []
    for label, kernel, batch, M, K, N, with_bias in GEMMS:
        a = rand(batch + ((K, M) if kernel == "matmul_tn" else (M, K)), dtype)
        b = rand((batch if batch else ()) + ((N, K) if kernel == "matmul_nt" else (K, N)), dtype, 0.05)
        bias = rand((N,), dtype) if with_bias else None
        args = (a, b) + ((bias,) if with_bias else ())
        ms = measure(f"{kernel} {label} {dtypes.name(dtype)}", lambda: getattr(cuda, kernel)(*args))
        a_nn = cupy.ascontiguousarray(a.swapaxes(-1, -2)) if kernel == "matmul_tn" else a
        b_nn = cupy.ascontiguousarray(b.swapaxes(-1, -2)) if kernel == "matmul_nt" else b
        cublas_ms = measure(f"cupy.matmul {label} {dtypes.name(dtype)}", lambda: cupy.matmul(a_nn, b_nn))
        flops = 2.0 * M * N * K * int(np.prod(batch))
        rows.append({"kernel": f"{kernel}: {label}", "dtype": dtypes.name(dtype),
                     "shape": f"{'x'.join(map(str, batch)) + ' of ' if batch else ''}{M}x{K} @ {K}x{N}",
                     "ms": ms, "tflops": flops / ms / 1e9, "cublas_ms": cublas_ms,
                     "of_cublas": cublas_ms / ms})
        del a, b, bias
    return rows


def memory_cases(dtype):
    """(kernel, shape label, fn, minimum bytes moved) for the bandwidth-bound kernels."""
    it = np.dtype(dtype).itemsize
    x, y, dy = rand((BT, C), dtype), rand((BT, C), dtype), rand((BT, C), dtype)
    h, dh = rand((BT, 4 * C), dtype), rand((BT, 4 * C), dtype)
    h32 = rand((BT, 4 * C), dtypes.float32)
    w, b = rand((C,), dtype), rand((C,), dtype)
    _, mean, rstd = cuda.layernorm_fwd(x, w, b)
    s = rand((B, H, T, T), dtype)
    p = cuda.softmax_causal_fwd(s, 0.125)
    logits = rand((BT, V), dtype, 2.0)
    targets = cupy.random.randint(0, V, BT).astype(cupy.int64)
    _, lse = cuda.cross_entropy_fwd(logits, targets)
    dloss = cupy.full((1,), 1.0 / BT, dtype=dtypes.float32)
    wte = rand((V, C), dtype)
    idx = cupy.random.randint(0, V, (B, T)).astype(cupy.int64)
    grad = rand((N_PARAMS,), dtype, 1e-3)
    master, m, v = (rand((N_PARAMS,), dtypes.float32, 1e-2) for _ in range(3))
    v = cupy.abs(v)
    working = None if dtype == dtypes.float32 else master.astype(dtype)
    norm_sq = cuda.grad_norm_sq(grad)
    adamw = dict(lr=6e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, n_decay=N_PARAMS // 2,
                 step=10, inv_scale=1.0, max_norm=1.0)
    stats = 2 * BT * 4  # mean and rstd
    cases = [
        ("add (residual)", f"{BT}x{C}", lambda: cuda.add(x, y), 3 * x.nbytes),
        ("mul by scalar", f"{BT}x{C}", lambda: cuda.mul(x, 0.5), 2 * x.nbytes),
        ("gelu_fwd", f"{BT}x{4 * C}", lambda: cuda.gelu_fwd(h), 2 * h.nbytes),
        ("gelu_bwd", f"{BT}x{4 * C}", lambda: cuda.gelu_bwd(h, dh), 3 * h.nbytes),
        ("layernorm_fwd", f"{BT}x{C}", lambda: cuda.layernorm_fwd(x, w, b), 2 * x.nbytes + stats),
        ("layernorm_bwd", f"{BT}x{C}", lambda: cuda.layernorm_bwd(dy, x, w, mean, rstd), 3 * x.nbytes + stats),
        ("softmax_causal_fwd", f"{B}x{H}x{T}x{T}", lambda: cuda.softmax_causal_fwd(s, 0.125), 2 * s.nbytes),
        ("softmax_causal_bwd", f"{B}x{H}x{T}x{T}", lambda: cuda.softmax_causal_bwd(p, s, 0.125), 3 * s.nbytes),
        ("cross_entropy_fwd", f"{BT}x{V}", lambda: cuda.cross_entropy_fwd(logits, targets), logits.nbytes),
        ("cross_entropy_bwd", f"{BT}x{V}", lambda: cuda.cross_entropy_bwd(logits, lse, targets, dloss),
         2 * logits.nbytes),
        ("embedding_fwd", f"{B}x{T} of {V}x{C}", lambda: cuda.embedding_fwd(wte, idx), 2 * BT * C * it),
        ("embedding_bwd", f"{B}x{T} into {V}x{C}", lambda: cuda.embedding_bwd(x, idx, V), x.nbytes + wte.nbytes),
        ("grad_norm_sq", f"{N_PARAMS}", lambda: cuda.grad_norm_sq(grad), grad.nbytes),
        ("adamw_step", f"{N_PARAMS}",
         lambda: cuda.adamw_step(master, grad, m, v, working, norm_sq, **adamw),
         N_PARAMS * (6 * 4 + it + (0 if working is None else it))),
    ]
    if dtype != dtypes.float32:
        cases.append((f"cast fp32->{dtypes.name(dtype)}", f"{BT}x{4 * C}", lambda: cuda.cast(h32, dtype),
                      h32.nbytes + h.nbytes))
    return cases


def memory_rows(dtype, peak_gbs):
    rows = []
    for kernel, shape, fn, nbytes in memory_cases(dtype):
        ms = measure(f"{kernel} {dtypes.name(dtype)}", fn)
        gbs = nbytes / ms / 1e6
        rows.append({"kernel": kernel, "dtype": dtypes.name(dtype), "shape": shape, "ms": ms,
                     "gb_per_s": gbs, "of_dram": gbs / peak_gbs})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="bf16,fp16,fp32")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--peak-gbs", type=float, default=4800.0,
                        help="DRAM bandwidth for the fraction column (default: H200 HBM3e, 4.8 TB/s)")
    args = parser.parse_args()
    device = cuda.device_name()
    print(f"device: {device}; bandwidth fractions against {args.peak_gbs / 1000:.1f} TB/s "
          f"(H200 HBM3e unless --peak-gbs says otherwise); GEMM fractions against cuBLAS")
    rows = []
    for name in args.dtypes.split(","):
        dtype = dtypes.as_dtype(name)
        rows += gemm_rows(dtype) + memory_rows(dtype, args.peak_gbs)
        cupy.get_default_memory_pool().free_all_blocks()

    header = f"{'kernel':38} {'dtype':5} {'shape':28} {'ms':>9} {'achieved':>14} {'fraction':>16}"
    print(header)
    print("-" * len(header))
    for r in rows:
        if "tflops" in r:
            achieved, fraction = f"{r['tflops']:8.1f} TFLOP/s", f"{r['of_cublas']:5.2f} x cuBLAS"
            fraction += f" ({r['cublas_ms']:.3f} ms)"
        else:
            achieved, fraction = f"{r['gb_per_s']:9.0f} GB/s", f"{100 * r['of_dram']:5.1f}% of DRAM"
        print(f"{r['kernel']:38} {r['dtype']:5} {r['shape']:28} {r['ms']:9.3f} {achieved:>14} {fraction}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "peak_gbs": args.peak_gbs, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
