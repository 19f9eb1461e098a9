"""The BLAS behind the CPU's GEMMs (cpu.py): NumPy's OpenBLAS with the kernels it loaded, or with
its AVX-512 (SkylakeX) kernels where it loaded others on a CPU that has AVX-512, or Intel's MKL
(the `mkl` wheel, `pip install -e '.[mkl]'`), whichever this machine measured fastest at the
training step's own GEMM shapes (tinygrad_like/gemm_library.py chooses, once per machine, and
calls use()): MKL's sgemm for fp32 operands and its bf16 GEMM for bf16 ones (AMX tiles on Xeons
that have them, by Intel's documentation: not measured here), where OpenBLAS leaves those to
cpu_bf16.py's dot products.

OpenBLAS's kernel set: NumPy's wheel carries one per CPU generation (a DYNAMIC_ARCH build) and
picks one as it loads, by its own table of CPUs or by OPENBLAS_CORETYPE. A CPU newer than its
table, or an environment that names an older set (a Zen 5 EPYC VM's had OPENBLAS_CORETYPE=
Haswell), leaves the AVX-512 kernels unused: there the AVX2 (Haswell) sgemm ran at half the
SkylakeX one's rate (docs/performance.md). use() switches the set
the library's own way: its core table reset and read again (gotoblas_dynamic_quit, _init) with
OPENBLAS_CORETYPE naming the set for that moment (the environment is left as it was).

Both are called through the same CBLAS wrapper (cblas_sgemm, ctypes) where a GEMM accumulates
(cpu_accumulate.py), and MKL's for every 2-D GEMM, on the operands where they lie (a transpose, a
slice of rows or columns). MKL is set up so that it behaves as OpenBLAS does here:
- threads: its OpenMP threads sleep as soon as a call ends (KMP_BLOCKTIME=0, set when MKL
  loads, for the process: Intel's OpenMP reads it when its threads start), as OpenBLAS's do
  (runtime.BLAS_QUIET), so that a row kernel after a GEMM has its core; a GEMM is one threaded
  call, and within one_thread() (a long K's halves, one per core) one thread;
- bits: conditional numerical reproducibility (MKL_CBWR_AUTO) and no dynamic thread count, so
  that a thread count gives the same bits run after run on one machine (MKL's default picks
  its code path and its threads' split as it goes).
A GEMM MKL's CBLAS cannot take as it lies (a batch of matrices, an empty one, operands in no
BLAS layout) stays NumPy's.
"""

import ctypes
import importlib.metadata
import os

import numpy as np

from ...backend.cpu.emit import cpu_has
from ...backend.cpu.runtime import BLAS_QUIET, OPENBLAS, THREADS, one_blas_thread

LIBRARIES = ("openblas", "openblas-skylakex", "mkl")
AVX512 = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd")  # OpenBLAS's SkylakeX needs
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enums
_MKL_CBWR_AUTO, _MKL_CBWR_SUCCESS = 2, 0  # mkl_cbwr.h


def cblas_sgemm(function, index):
    """function, a library's cblas_sgemm (its ints `index`: c_int, or c_int64 for an ILP64
    BLAS), as sgemm(a, b, out, beta): out (M, N) fp32 = a @ b + beta out, a (M, K) and b (K, N)
    in a BLAS layout (in_blas_layout), out's rows too (unit column stride), read where they
    are; fp32 operands, or bf16 ones for MKL's cblas_gemm_bf16bf16f32, whose arguments are
    cblas_sgemm's."""
    function.argtypes = [ctypes.c_int] * 3 + [index] * 3 + [ctypes.c_float, ctypes.c_void_p, index]
    function.argtypes += [ctypes.c_void_p, index, ctypes.c_float, ctypes.c_void_p, index]
    function.restype = None

    def sgemm(a, b, out, beta=0.0):
        (M, K), N = a.shape, b.shape[1]
        (ta, lda), (tb, ldb) = layout(a), layout(b)
        ldc = max(1, out.strides[0] // out.itemsize, N)
        function(ROW_MAJOR, ta, tb, M, N, K, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb,
                 beta, out.ctypes.data, ldc)  # fmt: skip
        return out

    return sgemm


def layout(x):
    """(CBLAS's transpose flag, leading dimension) of a 2-D array as BLAS reads it where it lies:
    rows of unit stride (row-major), or columns (a transpose), a leading dimension past the
    other's extent; None in any other layout."""
    (r, c), (sr, sc), size = x.shape, x.strides, x.itemsize
    if sc == size and sr >= size * max(1, c):
        return NO_TRANS, max(1, sr // size, c)
    if sr == size and sc >= size * max(1, r):
        return TRANS, max(1, sc // size, r)  # column-major: the transpose of a row-major array
    return None


def in_blas_layout(x):
    """Whether BLAS reads a 2-D array as it lies (layout)."""
    return layout(x) is not None


def _openblas():
    """NumPy's OpenBLAS's own cblas_sgemm (scipy-openblas's ILP64 names), or None."""
    lib = OPENBLAS.dynlib if OPENBLAS else None
    for name in ("scipy_cblas_sgemm64_", "cblas_sgemm64_", "cblas_sgemm"):
        function = getattr(lib, name, None) if lib is not None else None
        if function is not None:
            return cblas_sgemm(function, ctypes.c_int64 if "64" in name else ctypes.c_int)
    return None


def load_mkl(path=None):
    """libmkl_rt (at path, or the installed `mkl` wheel's), set up as the module's docstring
    says, or None."""
    if path is None:
        try:
            files = importlib.metadata.files("mkl") or []
        except importlib.metadata.PackageNotFoundError:
            return None
        found = [f.locate() for f in files if os.path.basename(str(f)).startswith("libmkl_rt.so")]
        if not found:
            return None
        path = found[0]
    os.environ.setdefault("KMP_BLOCKTIME", "0")
    lib = ctypes.CDLL(str(path))
    if lib.MKL_CBWR_Set(_MKL_CBWR_AUTO) != _MKL_CBWR_SUCCESS:
        return None  # no reproducible mode: not a BLAS this project runs on
    lib.MKL_Set_Dynamic(0)
    lib.MKL_Set_Num_Threads(THREADS)
    return lib


def _openblas_core_switch():
    """NumPy's OpenBLAS's kernel set, as (core() -> its name, set_core(name)), or None where the
    library has one set only (not a DYNAMIC_ARCH build) or does not say."""
    lib = OPENBLAS.dynlib if OPENBLAS else None
    names = ("gotoblas_corename", "gotoblas_dynamic_quit", "gotoblas_dynamic_init")
    if lib is None or not all(hasattr(lib, name) for name in names):
        return None
    lib.gotoblas_corename.restype = ctypes.c_char_p

    def core():
        return lib.gotoblas_corename().decode()

    def set_core(name):
        if core() == name:
            return
        before = os.environ.get("OPENBLAS_CORETYPE")
        os.environ["OPENBLAS_CORETYPE"] = name  # what _init reads (putenv: C's getenv sees it)
        try:
            lib.gotoblas_dynamic_quit()
            lib.gotoblas_dynamic_init()
        finally:
            if before is None:
                del os.environ["OPENBLAS_CORETYPE"]
            else:
                os.environ["OPENBLAS_CORETYPE"] = before
        if core() != name:
            raise RuntimeError(f"OpenBLAS did not switch to its {name} kernels (runs {core()})")

    return core, set_core


_CORES = _openblas_core_switch()
LOADED_CORE = _CORES[0]() if _CORES else None  # the kernel set OpenBLAS picked as it loaded
# OpenBLAS's AVX-512 kernels, where it loaded others and this CPU and this build have them
SKYLAKEX = bool(
    _CORES
    and LOADED_CORE not in ("SkylakeX", "Cooperlake", "SapphireRapids")
    and hasattr(OPENBLAS.dynlib, "gotoblas_SKYLAKEX")
    and all(cpu_has(feature) for feature in AVX512)
)


class _Library:
    """A BLAS as cpu.py calls it: sgemm(a, b, out, beta) (None: NumPy's matmul only), its bf16
    GEMM of the same form (bf16 operands, fp32 out; None: cpu.py's own), whether its idle
    threads sleep (quiet), how to hold it to one thread, and OpenBLAS's kernel set it runs
    (core; None for another library)."""

    def __init__(self, name, sgemm, bf16, quiet, set_threads, core=None):
        self.name, self.sgemm, self.bf16 = name, sgemm, bf16
        self.quiet, self.set_threads, self.core = quiet, set_threads, core


OPENBLAS_SGEMM = _openblas()  # NumPy's OpenBLAS's cblas_sgemm (or None), as sgemm(a, b, out, beta)
_OPENBLAS = _Library("openblas", OPENBLAS_SGEMM, None, BLAS_QUIET, None, LOADED_CORE)
_SKYLAKEX = _Library("openblas-skylakex", OPENBLAS_SGEMM, None, BLAS_QUIET, None, "SkylakeX")
_mkl = None  # the MKL library, loaded on first use (False: not installed)
_used = _OPENBLAS


def available():
    """The names of the libraries this installation can run."""
    found = {"openblas": True, "openblas-skylakex": SKYLAKEX, "mkl": _mkl_library() is not None}
    return tuple(name for name in LIBRARIES if found[name])


def openblas_cores():
    """The names of OpenBLAS's kernel sets a GEMM may run on here: the one it loaded (None
    where the library names none), and SkylakeX's where it can switch to them (the peaks'
    matmul is the best of them)."""
    return tuple(lib.core for lib in (_OPENBLAS, _SKYLAKEX) if lib.name in available())


class openblas_core:
    """with openblas_core(name): NumPy's OpenBLAS runs kernel set `name` (one of
    openblas_cores(); None, a library that names none, changes nothing) in the block, then the
    set it ran before."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.before = _CORES[0]() if _CORES and self.name else self.name
        if self.name != self.before:
            _CORES[1](self.name)

    def __exit__(self, *exc):
        if self.name != self.before:
            _CORES[1](self.before)


def _mkl_library():
    global _mkl
    if _mkl is None:
        lib = load_mkl()
        if lib is None:
            _mkl = False
        else:  # cblas_gemm_bf16bf16f32 takes cblas_sgemm's arguments, its A and B bf16
            sgemm, bf16 = (
                cblas_sgemm(f, ctypes.c_int) for f in (lib.cblas_sgemm, lib.cblas_gemm_bf16bf16f32)
            )
            _mkl = _Library("mkl", sgemm, bf16, True, lib.MKL_Set_Num_Threads)
    return _mkl or None


def use(name):
    """Run the GEMMs on library `name` (one of available()) from now on: its sgemm for fp32
    operands (and widened 2-byte ones), its bf16 GEMM, if it has one, for bf16 operands (else
    cpu.py's own: openblas names NumPy's BLAS, with the kernel set it loaded, and this
    project's kernels alone; openblas-skylakex the same with OpenBLAS's AVX-512 kernels)."""
    global _used
    if name not in available():
        raise ValueError(f"BLAS {name!r} is not installed here (have: {', '.join(available())})")
    _used = {"openblas": _OPENBLAS, "openblas-skylakex": _SKYLAKEX}.get(name) or _mkl_library()
    if _used.core is not None:  # MKL leaves OpenBLAS's set as it is
        _CORES[1](_used.core)


def used():
    """The name of the library the GEMMs run on."""
    return _used.name


def quiet():
    """Whether the library's idle threads sleep, so that a GEMM may be one threaded call."""
    return _used.quiet


def sgemm():
    """The library's sgemm(a, b, out, beta) over 2-D fp32 operands in a BLAS layout, or None."""
    return _used.sgemm


def matmul(a, b, out=None):
    """a @ b in fp32 (np.matmul's shapes) by the library in use."""
    if _used.name != "mkl" or not _fits(a, b, out):  # OpenBLAS: NumPy's matmul calls it
        return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty((a.shape[0], b.shape[1]), np.float32)
    return _used.sgemm(a, b, out)


def has_bf16():
    """Whether the library in use has a bf16 GEMM of its own (MKL's), which cpu.py calls."""
    return _used.bf16 is not None


def bf16_matmul(a, b):
    """a (M, K) @ b (K, N), bf16 operands, -> C fp32 by the library's bf16 GEMM, or None where
    it has none (or the operands are not in a BLAS layout): cpu.py's own then."""
    if _used.bf16 is None or not _fits(a, b, None, a.dtype):
        return None
    return _used.bf16(a, b, np.empty((a.shape[0], b.shape[1]), np.float32))


def _fits(a, b, out, dtype=np.float32):
    """Whether the library's CBLAS takes a @ b into out as they lie: 2-D, not empty, operands
    of dtype and out fp32, in BLAS layouts."""
    return (
        a.ndim == b.ndim == 2
        and a.size > 0
        and b.size > 0
        and all(x.dtype == dtype and in_blas_layout(x) for x in (a, b))
        and (out is None or (out.dtype == np.float32 and _rows(out)))
    )


def _rows(out):
    """Whether out is row-major as CBLAS writes C (unit column stride)."""
    found = layout(out)
    return found is not None and found[0] == NO_TRANS


class one_thread:
    """with one_thread(): the library's GEMMs in the block run on the calling thread only (the
    kernels that split their work across the cores themselves: runtime.one_blas_thread)."""

    def __enter__(self):
        self.openblas = one_blas_thread()
        self.openblas.__enter__()
        if _used.set_threads is not None:
            _used.set_threads(1)

    def __exit__(self, *exc):
        if _used.set_threads is not None:
            _used.set_threads(THREADS)
        self.openblas.__exit__(*exc)
