"""The CPU's bf16 GEMM (kernels/gemm/cpu_bf16.py): C = A B of bf16 operands summed in fp32 by
pairs of K, checked against float64 on every layout the GEMMs pass it (transposed views, odd K,
edges of the tiles and of K's blocks); its bits the same for any core count and for C^T = B^T
A^T; and cpu.py's matmul, matmul_nt and matmul_tn of bf16 operands are these sums rounded once
where the CPU has the instruction."""

import numpy as np
import pytest

from tinygrad_like import dtypes, kernels
from tinygrad_like.backend.cpu import compiled
from tinygrad_like.kernels.gemm import cpu_bf16
from tinygrad_like.kernels.gemm.cpu_bf16 import KC, MR, NR, matmul_bf16

SHAPES = [  # M, K, N: a tile, less than one, edges of tiles, of K's blocks, odd K
    (MR, 2, NR),
    (1, 1, 1),
    (5, 3, 7),
    (MR + 1, 2 * KC + 3, NR + 5),
    (67, 130, 3 * NR),
    (16, 4 * KC, 2 * NR - 1),
]


def operands(M, K, N, transpose_a, transpose_b, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((K, M) if transpose_a else (M, K)).astype(dtypes.bfloat16)
    b = rng.standard_normal((N, K) if transpose_b else (K, N)).astype(dtypes.bfloat16)
    return (a.T if transpose_a else a), (b.T if transpose_b else b)


def within_fp32_sum_bound(c, a, b):
    """|C - AB| <= K u |A||B| elementwise (a sum of K exact products, u = 2^-24), AB in float64."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = (a.shape[1] + 1) * 2.0**-24 * (np.abs(a64) @ np.abs(b64))
    return np.all(np.abs(c - a64 @ b64) <= bound)


@pytest.mark.parametrize("flip", [None, False, True], ids=["chosen", "as-is", "flipped"])
@pytest.mark.parametrize("transpose_b", [False, True], ids=["b", "bT"])
@pytest.mark.parametrize("transpose_a", [False, True], ids=["a", "aT"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bf16_gemm_is_the_fp32_sum_of_exact_products(shape, transpose_a, transpose_b, flip):
    a, b = operands(*shape, transpose_a, transpose_b)
    c = matmul_bf16(a, b, flip=flip)
    assert c.dtype == np.float32 and c.shape == (shape[0], shape[2])
    assert within_fp32_sum_bound(c, a, b)


def test_strided_views_and_empty_operands():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((20, 70)).astype(dtypes.bfloat16)[::2, 1::2]  # (10, 35), strided
    b = rng.standard_normal((35, 80)).astype(dtypes.bfloat16)[:, ::2]
    assert within_fp32_sum_bound(matmul_bf16(a, b), a, b)
    empty = np.zeros((4, 0), dtypes.bfloat16)
    assert (matmul_bf16(empty, np.zeros((0, 5), dtypes.bfloat16)) == 0).all()


@pytest.mark.parametrize("shape", [(67, 2 * KC + 3, 100), (MR, 2 * KC, 2 * NR)], ids=str)
def test_same_bits_for_any_core_count_and_for_the_transpose(shape, monkeypatch):
    """Each element of C is one fp32 sum over the pairs in order, whichever program (and core)
    runs its tile; and a pair's two products are symmetric in A and B, so C^T = B^T A^T gives
    C's bits (matmul_bf16 takes either orientation: both forced, and the transpose's call)."""
    a, b = operands(*shape, False, False, seed=2)
    monkeypatch.setattr(compiled, "SERIAL_BELOW", 0)  # every kernel on all the cores
    parallel = matmul_bf16(a, b)
    monkeypatch.setattr(compiled, "SERIAL_BELOW", 1 << 62)  # every kernel on one
    serial = matmul_bf16(a, b)
    assert parallel.tobytes() == serial.tobytes()
    for flip in (False, True):
        assert matmul_bf16(a, b, flip=flip).tobytes() == serial.tobytes()
    assert matmul_bf16(b.T, a.T).T.tobytes() == serial.tobytes()


@pytest.mark.skipif(not cpu_bf16.HAS_DOT, reason="the CPU has no AVX-512 BF16 dot product")
@pytest.mark.parametrize("name", ["matmul", "matmul_nt", "matmul_tn"])
def test_the_cpu_gemms_of_bf16_operands_round_these_sums(name):
    """cpu.py takes this path for bf16 operands of at least GEMV_BELOW rows: C rounded once."""
    M, K, N = 40, 96, 72
    a, b = operands(M, K, N, name == "matmul_tn", name == "matmul_nt", seed=3)
    args = (a.T if name == "matmul_tn" else a, b.T if name == "matmul_nt" else b)
    got = getattr(kernels.on("cpu"), name)(*args)
    assert got.dtype == dtypes.bfloat16
    assert got.tobytes() == matmul_bf16(a, b).astype(dtypes.bfloat16).tobytes()
