"""The one check every kernel's cases run on every device, and what the family files share.

A Case is one launch of one kernel: make(put, *params) builds its arguments, each array moved to
the device by put (the device's asarray; views made after put are the device's views), with the
same values on every device (fixed seeds). The check (the `check` fixture, conftest.py):
- cpu: the results (the outputs, then the arguments the kernel writes in place) against the
  case's float64 reference `ref`, at the tolerance of each result's dtype (TOL);
- cuda: the results against the CPU's, at the same tolerances (the CUDA device: on a GPU the
  real one, else the stand-in for CuPy with each kernel run on the CPU, tests/cuda_on_cpu);
- both: the outputs are what the record's shape rule says (new arrays of its shapes and dtypes,
  the argument it returns, None), the arguments the record does not write keep their bits, and
  `holds` (what a result must be beyond its values: masked zeros, a dropout mask) holds;
- meta: the outputs have the CPU's shapes and dtypes (and are the same arguments where the CPU
  returns one), and kernels.count gives the meta launch the CPU launch's FLOPs, exps and bytes.

TOL, per result dtype, (relative, absolute as a fraction of the largest reference value or of
the case's `magnitude`, the size of terms that cancel in a result): fp64 1e-9 (other summation
orders), fp32 1e-4, fp16 2e-3 and bf16 1.6e-2 (two ulps: both sides compute in fp32 and round
once, and may round a near-tie apart). Integers, and cases marked exact, bit for bit (NaNs
where NaNs).
"""

from dataclasses import dataclass
from itertools import repeat
from typing import Callable

import numpy as np
import pytest

from tinygrad_like import dtypes, kernels
from tinygrad_like.backend import cuda_available
from tinygrad_like.kernels.record import KERNELS, Out

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
FLOATS = [F32, F16, BF16, F64]
TRAINING = [F32, F16, BF16]
EPS = {F16: 2.0**-10, BF16: 2.0**-7, F32: 2.0**-23}  # each format's machine epsilon
TOL = {F64: (1e-9, 1e-12), F32: (1e-4, 1e-5), F16: (2e-3, 1e-3), BF16: (1.6e-2, 1e-2)}
cpu = kernels.on("cpu")  # every kernel on the CPU, by name: cpu.matmul(a, b)
ON_GPU = cuda_available()
gpu_only = pytest.mark.skipif(not ON_GPU, reason="the GPU's own machinery (no CPU equivalent)")


def rand(shape, dtype, scale=1.0, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def f64(x):
    return np.asarray(x).astype(np.float64)


def label(param):
    """A case parameter as its test id shows it."""
    if isinstance(param, (np.dtype, type)):
        return dtypes.name(param)
    if isinstance(param, tuple):
        return "x".join(map(label, param))
    return str(param)


@dataclass(frozen=True)
class Case:
    """One launch of `kernel` on the arguments make(put, *params) returns (a trailing dict: the
    keyword arguments). ref(*args, **kwargs) -> the results in float64 (a tuple when several),
    from the arguments as made; None where `holds` says what they must be instead. tol: the
    dtype whose tolerance applies (one, or one per result; default each result's own); exact:
    bit for bit instead. magnitude(*args, **kwargs) -> per result the size of the terms that
    cancel in it. repeatable: a second launch gives the same bits. vs_cpu: False where the
    devices draw different random numbers (dropout)."""

    kernel: str
    make: Callable
    params: tuple = ()
    ref: Callable = None
    tol: object = None
    exact: bool = False
    magnitude: Callable = None
    holds: Callable = None  # (results as NumPy arrays, *args, **kwargs): asserts
    repeatable: bool = False
    vs_cpu: bool = True
    name: str = ""  # what tells it from the kernel's other cases of these params

    def __str__(self):
        """The test id: the kernel, its params (but a kernel's name or direction, fwd or bwd,
        that a make function is told), the name."""
        told = {self.kernel, self.kernel.rsplit("_", 1)[-1]}
        params = [label(p) for p in self.params if not (isinstance(p, str) and p in told)]
        return "-".join([self.kernel, *params, *[self.name] * bool(self.name)])

    def arguments(self, put):
        made = self.make(put, *self.params)
        made = made if isinstance(made, tuple) else (made,)
        if made and isinstance(made[-1], dict):
            return made[:-1], made[-1]
        return made, {}


def cases(kernel, make, grid, **options):
    """One Case of kernel per params tuple of grid."""
    return [Case(kernel, make, params, **options) for params in grid]


# ---------------------------------------------------------------- the three checks


def on_cpu(case):
    args, kwargs = case.arguments(cpu.asarray)
    out = launch(cpu, case, args, kwargs)
    got = results(case.kernel, args, kwargs, out)
    fresh, fresh_kwargs = case.arguments(cpu.asarray)
    unchanged(case.kernel, args, kwargs, out, fresh, fresh_kwargs, cpu.to_numpy)
    if case.holds:
        case.holds(got, *fresh, **fresh_kwargs)
    if case.ref:
        want = case.ref(*fresh, **fresh_kwargs)
        want = want if isinstance(want, tuple) else (want,)
        compare(got, want, case, magnitudes(case, fresh, fresh_kwargs))
    if case.repeatable:
        again(cpu, case, got)


def on_cuda(case, cuda):
    device = kernels.on(cuda)
    args, kwargs = case.arguments(device.asarray)
    out = launch(device, case, args, kwargs)
    got = [device.to_numpy(r) for r in results(case.kernel, args, kwargs, out)]
    host, host_kwargs = case.arguments(cpu.asarray)
    unchanged(case.kernel, args, kwargs, out, host, host_kwargs, device.to_numpy)
    if case.holds:
        case.holds(got, *host, **host_kwargs)
    if case.vs_cpu:
        sizes = magnitudes(case, host, host_kwargs)  # before the CPU writes its arguments
        want = getattr(cpu, case.kernel)(*host, **host_kwargs)
        compare(got, results(case.kernel, host, host_kwargs, want), case, sizes, same_dtype=True)
    if case.repeatable:
        again(device, case, got)


def on_meta(case):
    meta = kernels.on("meta")
    args, kwargs = case.arguments(meta.asarray)
    out = getattr(meta, case.kernel)(*args, **kwargs)
    host, host_kwargs = case.arguments(cpu.asarray)
    want = getattr(cpu, case.kernel)(*host, **host_kwargs)
    alike(out, want, _arrays((args, kwargs)), _arrays((host, host_kwargs)))
    counted = kernels.count(case.kernel, args, kwargs, out)
    assert counted == kernels.count(case.kernel, host, host_kwargs, want), "flops, exps, bytes"


# ---------------------------------------------------------------- their parts


def launch(device, case, args, kwargs):
    """Run the case's kernel on device; its outputs must be what the record's shape rule says."""
    out = getattr(device, case.kernel)(*args, **kwargs)
    conforms(out, KERNELS[case.kernel].shape(*args, **kwargs), list(_arrays((args, kwargs))))
    return out


def conforms(out, rule, arguments):
    """out is what a shape rule answered: a new array of an Out's shape and dtype, a tuple of
    such answers, or the very object it names (None, an argument returned)."""
    if isinstance(rule, Out):
        assert not any(out is a for a in arguments), "a new array, not an argument"
        assert (tuple(out.shape), np.dtype(out.dtype)) == (tuple(rule.shape), rule.dtype)
    elif isinstance(rule, tuple):
        assert isinstance(out, tuple) and len(out) == len(rule), f"{len(rule)} outputs"
        for o, r in zip(out, rule):
            conforms(o, r, arguments)
    else:
        assert out is rule, f"the shape rule returns {type(rule).__name__}"


def results(kernel, args, kwargs, out):
    """A launch's results: its outputs, then the arguments it writes in place (record.writes)
    that it does not return."""
    outs = [] if out is None else list(out) if isinstance(out, tuple) else [out]
    written = [args[i] for i in KERNELS[kernel].writes if args[i] is not None]
    return outs + [a for a in written if not any(a is o for o in outs)]


def unchanged(kernel, args, kwargs, out, fresh, fresh_kwargs, to_numpy):
    """Every array argument the kernel neither writes (record.writes, out=) nor returns keeps
    its bits (fresh: the same arguments made again, untouched)."""
    written = [args[i] for i in KERNELS[kernel].writes] + [kwargs.get("out")]
    written += [] if out is None else list(out) if isinstance(out, tuple) else [out]
    for a, before in zip(_arrays((args, kwargs)), _arrays((fresh, fresh_kwargs))):
        if not any(a is w for w in written):
            assert to_numpy(a).tobytes() == np.asarray(before).tobytes(), "an argument changed"


def again(device, case, got):
    """A second launch on the same inputs gives the same bits."""
    args, kwargs = case.arguments(device.asarray)
    second = results(case.kernel, args, kwargs, getattr(device, case.kernel)(*args, **kwargs))
    for g, s in zip(got, second):
        assert np.asarray(g).tobytes() == device.to_numpy(s).tobytes(), "not repeatable"


def magnitudes(case, args, kwargs):
    """Per result, the size of the terms that cancel in it (0: none)."""
    return case.magnitude(*args, **kwargs) if case.magnitude else repeat(0.0)


def compare(got, want, case, sizes, same_dtype=False):
    """got against want, result by result, at the case's tolerances."""
    assert len(got) == len(want), f"{len(got)} results, {len(want)} expected"
    tols = case.tol if isinstance(case.tol, tuple) else (case.tol,) * len(got)
    for i, (g, w, tol, size) in enumerate(zip(got, want, tols, sizes)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"result {i}: shape {g.shape}, expected {w.shape}"
        if same_dtype:
            assert g.dtype == w.dtype, f"result {i}: {g.dtype}, expected {w.dtype}"
        if case.exact or not dtypes.is_float(g.dtype):
            identical(g, w)
        else:
            close(g, w, tol, size)


def close(got, ref, tol_dtype=None, magnitude=0.0):
    """got matches ref at the tolerance of tol_dtype (default got's dtype): relative to each
    element, and absolute relative to the largest reference value or to magnitude."""
    rtol, atol = TOL[np.dtype(tol_dtype or np.asarray(got).dtype)]
    ref64 = f64(ref)
    scale = max(float(np.abs(ref64).max(initial=0.0)), magnitude)
    np.testing.assert_allclose(f64(got), ref64, rtol=rtol, atol=atol * scale)


def identical(got, want):
    """Bit for bit where the dtypes agree (NaNs where NaNs, their payloads aside), the same
    values otherwise."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or not dtypes.is_float(got.dtype):
        np.testing.assert_array_equal(got, want)
        return
    with np.errstate(invalid="ignore"):  # ml_dtypes' warning for a NaN's payload
        nan = np.isnan(f64(want))
        np.testing.assert_array_equal(np.isnan(f64(got)), nan)
    assert got[~nan].tobytes() == want[~nan].tobytes(), "not bit for bit"


def alike(out, want, arguments, host_arguments):
    """The meta device's outputs against the CPU's: the same tuples, shapes and dtypes, and the
    same argument (by position) where the CPU returns one."""
    arguments, host_arguments = list(arguments), list(host_arguments)
    if isinstance(want, tuple):
        assert isinstance(out, tuple) and len(out) == len(want)
        for o, w in zip(out, want):
            alike(o, w, arguments, host_arguments)
    elif want is None:
        assert out is None
    else:
        returned = [i for i, a in enumerate(host_arguments) if a is want]
        if returned:
            assert out is arguments[returned[0]], "the CPU returns an argument here"
        else:
            assert not any(out is a for a in arguments), "the CPU returns a new array"
            assert (out.shape, out.dtype) == (want.shape, want.dtype)


def _arrays(x):
    """The arrays in nested arguments (tuples, lists, dicts), in order."""
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (tuple, list)):
        for item in x:
            yield from _arrays(item)
    elif hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.generic):
        yield x
