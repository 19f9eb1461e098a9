"""Time every CUDA kernel at GPT-2 124M training shapes and compare it with what the GPU can do.

Shapes: B=8, T=1024, C=768, H=12 (D=64), V=50257, the MLP's 4C and the QKV projection's 3C.
Each kernel is warmed up (which also compiles it), then timed with CUDA events: 7 samples of 5
back-to-back launches, median per launch. Per kernel and dtype:
  GEMMs: TFLOP/s (2 M N K per product), and cuBLAS on the same product (cupy.matmul, fp32
         compute, operands already in its preferred layout): its time and our fraction of it;
  everything else: GB/s over the minimum traffic (each input read once, each output written
         once) and the fraction of the DRAM bandwidth measured first (a device-to-device copy
         of 1 GiB, bytes read plus bytes written; the H200's datasheet says 4.8 TB/s).
Each row is printed as it is measured and the JSON file rewritten after it, so a run stopped
part-way keeps what it measured; the aligned table comes last.

    python scripts/bench_kernels.py [--dtypes bf16,fp16,fp32] [--json PATH]
"""

import itertools
import json
import statistics

import numpy as np

from accounting.tables import table
from tinygrad_like import backend, dtypes, kernels
from tinygrad_like.kernels.adamw.spec import Hyper, constants
from training.args import ArgumentParser, check_dtype, user_errors

try:  # --help and the one-line error on a machine without a GPU need no CuPy
    import cupy

    from tinygrad_like.backend import cuda
except ImportError:
    cupy = cuda = None

B, T, C, H, V = 8, 1024, 768, 12, 50257
BT, D = B * T, C // H
N_PARAMS = 124_439_808  # GPT-2 124M
HEADERS = ["kernel", "dtype", "shape", "ms", "achieved", "cuBLAS ms", "fraction"]


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
    """time_ms(fn), or NaN (the error printed) so one failing kernel does not stop the table."""
    try:
        return time_ms(fn)
    except Exception as e:  # report and go on: this runs once per GPU session
        print(f"ERROR {label}: {type(e).__name__}: {e}", flush=True)
        return float("nan")


def copy_gbs(nbytes=1 << 30):
    """DRAM bandwidth as a device-to-device copy moves it (GB/s, read + written bytes), on
    random bytes: the memory-bound kernels' ceiling on this card."""
    src = cupy.random.randint(0, 256, nbytes, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    ms = time_ms(lambda: dst.data.copy_from_device_async(src.data, nbytes))
    return 2 * nbytes / ms / 1e6


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
    """Each GEMM, ours and cuBLAS: one row dict at a time."""
    name = dtypes.name(dtype)
    for label, kernel, batch, M, K, N, with_bias in GEMMS:
        a = rand(batch + ((K, M) if kernel == "matmul_tn" else (M, K)), dtype)
        b = rand(batch + ((N, K) if kernel == "matmul_nt" else (K, N)), dtype, 0.05)
        args = (a, b) + ((rand((N,), dtype),) if with_bias else ())
        ms = measure(f"{kernel} {label} {name}", lambda: getattr(cuda, kernel)(*args))
        a_nn = cupy.ascontiguousarray(a.swapaxes(-1, -2)) if kernel == "matmul_tn" else a
        b_nn = cupy.ascontiguousarray(b.swapaxes(-1, -2)) if kernel == "matmul_nt" else b
        cublas_ms = measure(f"cupy.matmul {label} {name}", lambda: cupy.matmul(a_nn, b_nn))
        flops = 2.0 * M * N * K * int(np.prod(batch))
        yield {
            "kernel": f"{kernel}: {label}",
            "dtype": name,
            "shape": f"{'x'.join(map(str, batch)) + ' of ' if batch else ''}{M}x{K} @ {K}x{N}",
            "ms": ms,
            "tflops": flops / ms / 1e9,
            "cublas_ms": cublas_ms,
            "cublas_tflops": flops / cublas_ms / 1e9,
            "of_cublas": cublas_ms / ms,
        }


def memory_cases(dtype):
    """(kernel, shape label, fn, minimum bytes moved) for the bandwidth-bound kernels."""
    gpu, it = kernels.on("cuda"), np.dtype(dtype).itemsize
    x, y, dy = rand((BT, C), dtype), rand((BT, C), dtype), rand((BT, C), dtype)
    h, dh = rand((BT, 4 * C), dtype), rand((BT, 4 * C), dtype)
    h32 = rand((BT, 4 * C), dtypes.float32)
    w, b = rand((C,), dtype), rand((C,), dtype)
    _, mean, rstd = gpu.layernorm_fwd(x, w, b)
    s = rand((B, H, T, T), dtype)
    p = gpu.softmax_causal_fwd(s, 0.125)
    logits = rand((BT, V), dtype, 2.0)
    targets = cupy.random.randint(0, V, BT).astype(cupy.int64)
    _, lse = gpu.cross_entropy_fwd(logits, targets)
    dloss = cupy.full((1,), 1.0 / BT, dtype=dtypes.float32)
    wte = rand((V, C), dtype)
    idx = cupy.random.randint(0, V, (B, T)).astype(cupy.int64)
    grad = rand((N_PARAMS,), dtype, 1e-3)
    master, m, v = (rand((N_PARAMS,), dtypes.float32, 1e-2) for _ in range(3))
    v = cupy.abs(v)
    working = None if dtype == dtypes.float32 else master.astype(dtype)
    norm_sq = gpu.grad_norm_sq(grad)
    adamw = Hyper(  # as AdamW writes them to the device each step
        lr=6e-4,
        beta1=0.9,
        beta2=0.95,
        eps=1e-8,
        weight_decay=0.1,
        n_decay=N_PARAMS // 2,
        step=10,
        inv_scale=1.0,
        max_norm=1.0,
    )
    adamw = cupy.asarray(constants(adamw))
    stats = 2 * BT * 4  # mean and rstd
    rows, rows4, scores = f"{BT}x{C}", f"{BT}x{4 * C}", f"{B}x{H}x{T}x{T}"
    cases = [
        ("add (residual)", rows, lambda: gpu.add(x, y), 3 * x.nbytes),
        ("mul by scalar", rows, lambda: gpu.mul(x, 0.5), 2 * x.nbytes),
        ("gelu_fwd", rows4, lambda: gpu.gelu_fwd(h), 2 * h.nbytes),
        ("gelu_bwd", rows4, lambda: gpu.gelu_bwd(h, dh), 3 * h.nbytes),
        ("layernorm_fwd", rows, lambda: gpu.layernorm_fwd(x, w, b), 2 * x.nbytes + stats),
        (
            "layernorm_bwd",
            rows,
            lambda: gpu.layernorm_bwd(dy, x, w, mean, rstd),
            3 * x.nbytes + stats,
        ),
        ("softmax_causal_fwd", scores, lambda: gpu.softmax_causal_fwd(s, 0.125), 2 * s.nbytes),
        ("softmax_causal_bwd", scores, lambda: gpu.softmax_causal_bwd(p, s, 0.125), 3 * s.nbytes),
        (
            "cross_entropy_fwd",
            f"{BT}x{V}",
            lambda: gpu.cross_entropy_fwd(logits, targets),
            logits.nbytes,
        ),
        (
            "cross_entropy_bwd",
            f"{BT}x{V}",
            lambda: gpu.cross_entropy_bwd(logits, lse, targets, dloss),
            2 * logits.nbytes,
        ),
        (
            "cross_entropy_fwd_bwd",
            f"{BT}x{V}",
            lambda: gpu.cross_entropy_fwd_bwd(logits, targets, dloss),
            2 * logits.nbytes,
        ),
        (
            "embedding_fwd",
            f"{B}x{T} of {V}x{C}",
            lambda: gpu.embedding_fwd(wte, idx),
            2 * BT * C * it,
        ),
        (
            "embedding_bwd",
            f"{B}x{T} into {V}x{C}",
            lambda: gpu.embedding_bwd(x, idx, V),
            x.nbytes + wte.nbytes,
        ),
        ("grad_norm_sq", f"{N_PARAMS}", lambda: gpu.grad_norm_sq(grad), grad.nbytes),
        (
            "adamw_step",
            f"{N_PARAMS}",
            lambda: gpu.adamw_step(master, grad, m, v, working, norm_sq, adamw),
            N_PARAMS * (6 * 4 + it + (0 if working is None else it)),
        ),
    ]
    if dtype != dtypes.float32:
        cases.append(
            (
                f"cast fp32->{dtypes.name(dtype)}",
                rows4,
                lambda: gpu.cast(h32, dtype),
                h32.nbytes + h.nbytes,
            )
        )
    return cases


def memory_rows(dtype, dram_gbs):
    for kernel, shape, fn, nbytes in memory_cases(dtype):
        ms = measure(f"{kernel} {dtypes.name(dtype)}", fn)
        gbs = nbytes / ms / 1e6
        yield {
            "kernel": kernel,
            "dtype": dtypes.name(dtype),
            "shape": shape,
            "ms": ms,
            "gb_per_s": gbs,
            "of_dram": gbs / dram_gbs,
        }


def cells(row):
    """A row's table cells (HEADERS), the same for its progress line and the final table."""
    if "tflops" in row:
        achieved, cublas = f"{row['tflops']:.1f} TFLOP/s", f"{row['cublas_ms']:.3f}"
        fraction = f"{row['of_cublas']:.2f} x cuBLAS ({row['cublas_tflops']:.1f} TFLOP/s)"
    else:
        achieved, cublas = f"{row['gb_per_s']:.0f} GB/s", ""
        fraction = f"{row['of_dram']:.1%} of copy"
    return [
        row["kernel"],
        row["dtype"],
        row["shape"],
        f"{row['ms']:.3f}",
        achieved,
        cublas,
        fraction,
    ]


def parse_args(argv=None):
    p = ArgumentParser(
        description="Time every CUDA kernel at GPT-2 124M training shapes "
        "against cuBLAS and the measured DRAM bandwidth."
    )
    p.add_argument("--dtypes", default="bf16,fp16,fp32", help="comma-separated (default all)")
    p.add_argument("--json", help="also write the rows to this JSON file (after every row)")
    args = p.parse_args(argv)
    with user_errors():
        args.dtypes = args.dtypes.split(",")
        for name in args.dtypes:
            check_dtype(name)
        if cupy is None:
            raise RuntimeError("CuPy is not installed: this benchmark needs a CUDA GPU")
        backend.resolve("cuda")
    return args


def main(argv=None):
    args = parse_args(argv)
    device, dram = cuda.device_name(), copy_gbs()
    print(
        f"device: {device}; device-to-device copy {dram / 1000:.2f} TB/s (read + written; "
        "the memory-bound kernels' fractions are of this); GEMM fractions against cuBLAS",
        flush=True,
    )
    out = {"device": device, "copy_gb_per_s": dram, "rows": []}
    for name in args.dtypes:
        dtype = dtypes.as_dtype(name)
        for row in itertools.chain(gemm_rows(dtype), memory_rows(dtype, dram)):
            out["rows"].append(row)
            print("  ".join(cells(row)), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
        cupy.get_default_memory_pool().free_all_blocks()
    print(table(HEADERS, [cells(r) for r in out["rows"]], align="lllrrrl"))
    if args.json:
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
