"""Embeddings (kernels/embedding): the gather of a table's rows by token id and its gradient,
the rows of repeated ids summed in a fixed order (the same bits run after run), against
float64; int64 and int32 ids, many repeats, the last row, one id. An id out of range is
refused before any launch, with one message on every device.
"""

import numpy as np
import pytest

from tinygrad_like import dtypes

from .check import BF16, EPS, F16, F32, FLOATS, cases, cpu, f64, rand

V, C = 1000, 70


def embedding_fwd_ref(weight, idx):
    return f64(weight)[idx]


def embedding_bwd_ref(dout, idx, num_embeddings):
    dweight = np.zeros((num_embeddings, dout.shape[-1]))
    np.add.at(dweight, idx.reshape(-1), f64(dout).reshape(-1, dout.shape[-1]))
    return dweight


def ids(shape, id_dtype):
    """Ids of shape in [0, 12) (many repeats) but the first, the table's last row."""
    idx = np.random.default_rng(3).integers(0, 12, shape)
    idx.reshape(-1)[0] = V - 1
    return idx.astype(id_dtype)


def gather(put, dtype, shape, id_dtype):
    return put(rand((V, C), dtype, seed=1)), put(ids(shape, id_dtype))


def scatter(put, dtype, shape, id_dtype):
    return put(rand(shape + (C,), dtype, seed=2)), put(ids(shape, id_dtype)), V


GRID = [(d, s, i) for d in FLOATS for s in [(4, 33), (1,)] for i in (np.int64, np.int32)]
CASES = [
    *cases("embedding_fwd", gather, GRID, ref=embedding_fwd_ref, exact=True),
    *cases("embedding_bwd", scatter, GRID, ref=embedding_bwd_ref, repeatable=True),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel(case, check):
    check(case)


# ---------------------------------------------------------------- what a case cannot say


@pytest.mark.parametrize("bad", [1000, -1])
def test_ids_out_of_range_are_refused_as_the_cpu_refuses_them(device, bad):
    """The CPU's ValueError, raised before any launch (the CUDA kernels check no bounds)."""
    weight, dout = rand((V, C), F32), rand((2, 3, C), F32)
    idx = np.array([[0, 5, bad], [999, 1, 2]])
    for kernel, args in [("embedding_fwd", (weight, idx)), ("embedding_bwd", (dout, idx, V))]:
        with pytest.raises(ValueError) as on_cpu:
            getattr(cpu, kernel)(*args)
        with pytest.raises(ValueError) as on_device:
            getattr(device, kernel)(
                *[device.asarray(a) if hasattr(a, "shape") else a for a in args]
            )
        assert (
            str(on_device.value)
            == str(on_cpu.value)
            == f"token id {bad} out of range for vocab 1000"
        )


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=dtypes.name)
def test_cpu_embedding_bwd_sums_repeated_ids_in_fp32_the_same_bits_each_run(dtype):
    """64 ids over 8 rows (rows 5-7 unused): accumulated in fp32 and rounded once; bit for bit
    run after run; the unused rows 0."""
    idx = np.random.default_rng(0).integers(0, 5, size=(4, 16))
    idx[0, :4] = 2
    dout = rand((4, 16, 3), dtype)
    d1, d2 = cpu.embedding_bwd(dout, idx, 8), cpu.embedding_bwd(dout.copy(), idx.copy(), 8)
    assert d1.dtype == dtype and d1.shape == (8, 3)
    np.testing.assert_array_equal(d1.view(np.uint8), d2.view(np.uint8))
    np.testing.assert_allclose(f64(d1), embedding_bwd_ref(dout, idx, 8), rtol=EPS[dtype], atol=1e-5)
    assert np.all(f64(d1)[5:] == 0)
