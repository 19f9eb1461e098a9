"""The CPU's 2-byte conversions (backend/cpu/halves.py) give NumPy's bits (ml_dtypes' for bf16):
every bf16 and fp16 value widened, and fp32 values rounded at every rounding boundary of each
format (each 2-byte value, the midpoints to its neighbours and one fp32 ulp either side), the
infinities, NaNs and random bit patterns. The one exception, stated in halves.py: a signaling
NaN made quiet by fp16's hardware conversions. And a conversion inside a block of
runtime.in_parallel runs on that block's core."""

import numpy as np
import pytest

from tinygrad_like import dtypes
from tinygrad_like.backend.cpu import halves, runtime

FORMATS = [dtypes.bfloat16, dtypes.float16]


def every(dtype):
    """Every value of a 2-byte format, twice over (more than halves.SMALL: the compiled path)."""
    return np.tile(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16), 2).view(dtype)


def signaling_f16(bits16):
    """fp16 bit patterns of signaling NaNs (exponent all ones, mantissa nonzero, its top bit 0)."""
    return ((bits16 & 0x7C00) == 0x7C00) & ((bits16 & 0x3FF) != 0) & ((bits16 & 0x200) == 0)


@pytest.mark.parametrize("dtype", FORMATS, ids=dtypes.name)
def test_every_2_byte_value_widens_to_numpys_fp32(dtype):
    h = every(dtype)
    got, want = halves.f32(h).view(np.uint32), h.astype(np.float32).view(np.uint32)
    same = got == want
    if dtype == dtypes.float16:
        same |= signaling_f16(h.view(np.uint16))
        assert np.isnan(halves.f32(h)[~(got == want)]).all()
    assert same.all()


@pytest.mark.parametrize("dtype", FORMATS, ids=dtypes.name)
def test_fp32_rounds_to_numpys_2_byte_value_at_every_boundary(dtype):
    h = every(dtype)[: 1 << 16]
    with np.errstate(over="ignore"):  # each value's next one up (the max: inf)
        up = np.nextafter(h, np.asarray(np.inf, dtype))
    with np.errstate(all="ignore"):
        lo, hi = h.astype(np.float32), up.astype(np.float32)
        middle = ((lo.astype(np.float64) + hi) / 2).astype(np.float32)  # exact in fp32
        bits = np.concatenate([lo, middle]).view(np.uint32)
        bits = np.concatenate([bits, bits + 1, bits - 1])
        rng = np.random.default_rng(0)
        bits = np.concatenate([bits, rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint32)])
        bits = np.concatenate([bits, np.array([0x7F800000, 0xFF800000, 0x7FC00000], np.uint32)])
        x = bits.view(np.float32)
        want = x.astype(dtype).view(np.uint16)
    got = halves.rounded(x, dtype).view(np.uint16)
    same = got == want
    if dtype == dtypes.float16:  # a signaling fp32 NaN: NumPy's result keeps it signaling
        same |= np.isnan(x) & signaling_f16(want)
    assert same.all()
    out = np.empty(x.shape, dtype)
    assert halves.rounded(x, dtype, out=out) is out and out.tobytes() == got.tobytes()


def test_conversions_inside_a_block_of_in_parallel_run_on_its_core():
    """Each block converts its own rows (a compiled kernel's parallel launch from two threads at
    once is what Numba's workqueue refuses)."""
    x = np.random.default_rng(1).standard_normal((8, 1 << 16), dtype=np.float32)
    out = np.empty(x.shape, dtypes.bfloat16)

    def body(lo, hi):
        assert runtime.in_block()
        halves.rounded(x[lo:hi], dtypes.bfloat16, out=out[lo:hi])

    runtime.in_parallel(8, body, chunk_rows=1, blocks=2)
    assert not runtime.in_block()
    assert out.tobytes() == x.astype(dtypes.bfloat16).tobytes()


@pytest.mark.parametrize("ufunc", [np.add, np.subtract, np.multiply, np.divide])
@pytest.mark.parametrize("one", [False, True], ids=["b of a's shape", "b one element"])
def test_bf16_binary_gives_the_bits_of_widening_then_rounding(ufunc, one):
    """halves.bf16_binary (elementwise's add, sub, mul and div of bf16s in one pass) against
    both operands widened, ufunc in fp32, then rounded: every bf16 value against random ones,
    infinities, NaNs, subnormals and zeros of both signs included, a divisor of 0 too."""
    a = every(dtypes.bfloat16)
    rng = np.random.default_rng(2)
    b = rng.integers(0, 1 << 16, a.size if not one else 1, dtype=np.uint32).astype(np.uint16)
    b = b.view(dtypes.bfloat16)
    if not one:
        b[:4] = np.array([0.0, -0.0, np.inf, np.nan], np.float32).astype(dtypes.bfloat16)
    with np.errstate(all="ignore"):
        want = ufunc(a.astype(np.float32), b.astype(np.float32)).astype(dtypes.bfloat16)
        got = halves.bf16_binary(ufunc, a, b, np.empty(a.shape, dtypes.bfloat16))
    assert got.view(np.uint16).tobytes() == want.view(np.uint16).tobytes()


def test_copy_into_gives_numpys_bits_through_any_strides():
    """copy_into (flash attention's regrouping copies): every bf16 value widened, and fp32
    values at the rounding boundaries rounded, through strided views on either side (rows
    contiguous or not, axes of one element, a scale), each NumPy's bits; fp16 and more than
    five long axes as stated."""
    h = every(dtypes.bfloat16)[: 1 << 16].reshape(4, 16, 4, 256)  # every bf16 value
    src = h.transpose(1, 0, 2, 3)[:, None]  # (16, 1, 4, 4, 256): rows contiguous, strided
    out = np.full(src.shape, np.nan, np.float32)
    assert halves.copy_into(out, src) is out
    assert out.tobytes() == src.astype(np.float32).tobytes()
    gather = np.empty(src.shape[:-2] + src.shape[-1:] + src.shape[-2:-1], np.float32)
    halves.copy_into(gather, src.swapaxes(-1, -2))  # rows read across src's rows
    assert gather.tobytes() == src.swapaxes(-1, -2).astype(np.float32).tobytes()
    scaled = np.empty(src.shape, np.float32)
    with np.errstate(all="ignore"):
        want = src.astype(np.float32) * np.float32(0.125)
    halves.copy_into(scaled, src, np.float32(0.125))
    assert scaled.tobytes() == want.tobytes()
    with np.errstate(all="ignore"):
        x = (out + np.float32(1e-3) * out).swapaxes(0, 2)  # between the bf16 values
    with np.errstate(all="ignore"):
        want = x.astype(dtypes.bfloat16).tobytes()
    for rows in (1, -1):  # dst's rows contiguous (compiled), then written backwards (NumPy's)
        rounded = np.empty(x.shape, dtypes.bfloat16)[:, :, :, :, ::rows]
        with np.errstate(all="ignore"):
            assert halves.copy_into(rounded, x).tobytes() == want
    f16 = np.empty(x.shape, dtypes.float16)
    with np.errstate(all="ignore"):
        assert halves.copy_into(f16, x).tobytes() == x.astype(dtypes.float16).tobytes()
    with pytest.raises(ValueError, match="at most 5"):
        halves.copy_into(np.empty((2,) * 6, np.float32), np.empty((2,) * 6, np.float32))
