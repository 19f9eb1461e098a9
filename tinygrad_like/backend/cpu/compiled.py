"""The CPU backend's compiled loops: Numba's decorator for the kernels that NumPy would run as
one pass per operator, and the device functions they share (common.cuh's twins).

A compiled kernel reads like its CUDA twin: one row (or block of elements) per iteration of a
prange loop, which Numba splits over the cores with one join per kernel. Rounding is NumPy's:
no fast-math, so LLVM neither reorders sums nor fuses a multiply and an add, and every sum is
over LANES fixed lanes (a warp's lanes on the GPU) added in a fixed tree at the end, the same
bits for any core count. The compiled code is cached on disk beside this package
(cache=True): the first run compiles each kernel once per dtype and prints a line saying so.
Numba checks a cached kernel against its own file only, not the device functions it calls nor
the constants it imports (a family's spec.py, formats.py), which it bakes in, so the cache lives
in a directory named by a hash of the sources kernels are made of (this package, kernels/, the
formats and dtypes: any edit, a fresh cache): $NUMBA_CACHE_DIR if set, else
~/.cache/tinygrad_like/numba-<hash>. Numba has no fp16 or bf16 on the CPU, so 2-byte arrays
reach these kernels widened to fp32 (halves.f32) and their results are rounded once
(halves.rounded).
"""

import hashlib
import os
import sys
import threading
import time
import types as types_module
import warnings
from pathlib import Path

import numba
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.compiler_lock import global_compiler_lock
from numba.extending import intrinsic

from ... import compiles
from . import runtime
from .runtime import THREADS, in_block


def _cache_dir(package=Path(__file__).parents[2]):
    """~/.cache/tinygrad_like/numba-<a hash of the sources kernels are made of, in package>."""
    sources = sorted(package.glob("backend/cpu/*.py")) + sorted(package.glob("kernels/**/*.py"))
    sources += [package / "formats.py", package / "dtypes.py"]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "tinygrad_like", f"numba-{digest}")


if "NUMBA_CACHE_DIR" not in os.environ:
    numba.config.CACHE_DIR = _cache_dir()
# The pool Numba hands a parallel kernel's iterations to (its threading layer), one per
# process, fixed at the first parallel launch. Numba's own (workqueue) by default: OpenMP's idle
# threads spin after each kernel and slow the OpenBLAS GEMM that follows (a GPT-2 step 20%
# slower on 2 cores; gpt2-mini's 13-18%, AMD EPYC, 2026-12-06); it runs kernels launched from one
# thread at a time, as the training loop does. A program of many small kernels, a decode, asks
# for OpenMP instead (use_pool): its spinning threads take a kernel in about 4 us where the
# workqueue's wake-up costs about 110, so a decode step's GEMVs and row kernels can use every
# core (each kernel's one-core threshold scaled by HANDOFF). NUMBA_THREADING_LAYER wins.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"
HANDOFF = {"workqueue": 1.0, "omp": 1 / 32}  # a parallel launch's cost, relative
_handoff = [HANDOFF.get(numba.config.THREADING_LAYER, 1.0)]


def use_pool(name, spin=10_000):
    """Hand parallel kernels to `name`'s threads ("omp" or "workqueue") -> the layer in use.
    Call it before the first parallel kernel runs (the layer is fixed then; a later call changes
    nothing), and where NUMBA_THREADING_LAYER is not set; OpenMP where libgomp loads, else the
    workqueue stays. OpenMP's threads spin `spin` turns after a kernel, then sleep (None:
    libgomp's own count; a GOMP_SPINCOUNT the user set wins either way): a decode's next kernel
    finds them awake, and with few turns an OpenBLAS call soon after (a prompt's sgemm) does not
    wait long for its cores. libgomp reads the count once, as it loads, for everything in the
    process that uses it: PyTorch's OpenMP too where it shares the library (scripts/bench.py's
    peers). Measured choices: docs/performance.md, "Which pool a step runs on"."""
    from numba.np.ufunc import parallel

    if parallel._is_initialized or "NUMBA_THREADING_LAYER" in os.environ:
        return numba.config.THREADING_LAYER
    if name == "omp":
        # set for the moment libgomp loads: a process this one starts keeps its own default
        ours = spin is not None and "GOMP_SPINCOUNT" not in os.environ
        if ours:
            os.environ["GOMP_SPINCOUNT"] = str(spin)
        try:
            from numba.np.ufunc import omppool  # noqa: F401 (loads libgomp)
        except ImportError:
            return numba.config.THREADING_LAYER
        finally:
            if ours:
                del os.environ["GOMP_SPINCOUNT"]
    numba.config.THREADING_LAYER = name
    _handoff[0] = HANDOFF[name]
    return name


_started = [False]


def _start_pool():
    """The pool started (its layer fixed) with a thread for each core this process may use
    (runtime.THREADS: taskset, an MPI rank's binding), at the first parallel kernel."""
    numba.set_num_threads(max(1, min(THREADS, numba.config.NUMBA_NUM_THREADS)))
    _started[0] = True


# runtime.in_parallel's blocks (NumPy calls, single-threaded BLAS, serial kernels) on the pool's
# own threads when it is OpenMP's: its threads spin a while after each kernel (libgomp's count,
# milliseconds at its default), and a thread of in_parallel's own beside one ran at half speed
# (a bf16 GPT-2 step's flash attention, adds and AdamW, all blocks, 1.5-2x slower after an
# OpenMP kernel than under the workqueue). A prange of object-mode calls: each spinning thread
# takes a block in microseconds, and nothing else competes for its core.
_job = [None]  # the blocks running: job(i) for i in range(blocks)
_pool_free = threading.Lock()  # held by the caller whose blocks run
_failed = []  # what a block raised, raised again by the caller


def _run_block(i):
    try:
        _job[0](i)
    except BaseException as e:  # noqa: BLE001 (raised again on the calling thread)
        _failed.append(e)


@numba.njit(parallel=True, nogil=True)  # not cached: Numba cannot load object mode in a prange
def _blocks_on_omp(blocks):
    for i in numba.prange(blocks):
        with numba.objmode():
            _run_block(i)


def _run_blocks(blocks, job):
    """runtime.blocks_on_pool's runner: job(i) for each block on OpenMP's threads -> True, or
    False (not OpenMP's pool, or its threads busy with another caller's blocks)."""
    if numba.config.THREADING_LAYER != "omp" or not _pool_free.acquire(blocking=False):
        return False
    try:
        return _blocks_on_pool(blocks, job)
    finally:
        _pool_free.release()


def _blocks_on_pool(blocks, job):
    if not _started[0]:
        _start_pool()
    if not _blocks_on_omp.overloads:  # about 0.4 s once a process, counted as a kernel's is
        t0 = time.perf_counter()
        with warnings.catch_warnings():  # that object mode holds the GIL: each block lets it
            warnings.simplefilter("ignore", numba.NumbaWarning)  # go in its NumPy calls and
            _blocks_on_omp.compile((types.int64,))  # serial kernels, as on any other thread
        compiles.add(time.perf_counter() - t0)
    _job[0] = job
    try:
        _blocks_on_omp(blocks)
    finally:
        _job[0] = None
    if _failed:
        error = _failed[0]
        _failed.clear()
        raise error
    return True


runtime.blocks_on_pool[0] = _run_blocks


LANES = 16  # the accumulators of a row sum: one AVX-512 register of fp32, two of AVX2


# Below this many elements of its first argument a kernel runs on one core: a parallel launch
# costs about 110 µs of the workqueue's thread dispatch (measured: layernorm_fwd of one
# 128-wide row, 110 µs parallel against 0.9 µs serial), so a kernel goes parallel from about
# twice that in work at a nanosecond or so an element (gpt2-mini's 1024 x 128 layernorms, adds
# and fills had been slower on two cores than on one: docs/performance.md, "Which pool a step
# runs on"); OpenMP's hand-off is HANDOFF's fraction of it.
SERIAL_BELOW = 1 << 18


def _jit(fn, parallel, fastmath=False, interleave=None):
    """fn compiled (cached on disk); the serial twin under its own name, so that the two never
    share a cache entry (Numba keys its cache by the function's name, not its flags).
    fastmath: reassociated sums (vector_dot's flags) for a kernel held to a tolerance;
    interleave: _interleaved's. Each new variant's compile (or disk-cache load) is counted in
    tinygrad_like.compiles, so that a timed step can leave it out."""
    _check_cells(fn)
    if not parallel:
        name = fn.__name__ + "_serial"  # a closure keeps its cells: a kernel made per format
        fn = types_module.FunctionType(fn.__code__, fn.__globals__, name, None, fn.__closure__)
        fn.__qualname__ = fn.__name__
    flags = {"reassoc", "contract"} if fastmath else False
    jitted = numba.njit(
        parallel=parallel, cache=True, nogil=True, error_model="numpy", fastmath=flags
    )(fn)
    # what a call that finds no variant for its types runs
    compile_variant = _interleaved(jitted.compile, interleave)

    def counted(signature):  # its compiles (and disk-cache loads) into tinygrad_like.compiles
        before, t0 = len(jitted.overloads), time.perf_counter()
        try:
            if global_compiler_lock.is_locked():  # typing a caller (a step's op): its thread,
                return compile_variant(signature)  # which holds the lock another would wait on
            return _on_a_thread_of_its_own(compile_variant, signature)
        finally:
            if len(jitted.overloads) > before:
                compiles.add(time.perf_counter() - t0)

    jitted.compile = counted
    return jitted


def _interleaved(compile_variant, factor):
    """compile_variant, compiling with LLVM's loop vectorizer told to run `factor` vectors of
    each loop at once (-force-vector-interleave; None: its cost model's choice, one here for a
    long formula). For an elementwise formula whose ops each wait for the one before (an exp's
    polynomial, a divide): four independent chains in flight where the core's window of
    waiting vector ops holds little more than one. Each element's arithmetic is the same, so
    are its bits (no reassociation: a sum's order is not interleaved without fast-math). The
    option is LLVM's, for the whole process: set and reset under Numba's compiler lock."""
    if factor is None:
        return compile_variant

    def compile_interleaved(signature):
        with global_compiler_lock:
            llvm.set_option("", f"-force-vector-interleave={factor}")
            try:
                return compile_variant(signature)
            finally:
                llvm.set_option("", "-force-vector-interleave=0")

    return compile_interleaved


def _on_a_thread_of_its_own(fn, *args):
    """fn(*args) run on a new thread -> its result, or its exception raised here. For Numba's
    compiler: it keeps a frame of a compile alive after it (found by the memory tracker), and a
    frame holds its callers' frames, whose locals are the arrays of the call that compiled; a
    thread's frames hold none of this one's (a step's peak otherwise depended on which kernels
    the process had compiled before it)."""
    box = {}

    def run():
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 (raised again on the calling thread)
            box["error"] = e

    thread = threading.Thread(target=run, name="tg-compile")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def _check_cells(fn):
    """Raise TypeError where fn closes over anything but plain constants: Numba keys a closure's
    disk-cache entry by its cells' pickled bytes, and those of a compiled function differ in
    every process, so such a kernel would compile again in each one (and add an entry each time)."""
    plain = (bool, int, float, str, np.number, np.bool_)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        value = cell.cell_contents
        if not (
            isinstance(value, plain)
            or (isinstance(value, tuple) and all(isinstance(v, plain) for v in value))
        ):
            raise TypeError(
                f"kernel {fn.__name__} closes over {name} ({type(value).__name__}): "
                "refer to it as a global, and close over plain constants only"
            )


def _announced(jitted, name, args):
    """jitted(*args); a call that compiles (a cold cache) prints 'compiled cpu.<name> in N s' to
    stderr. (jitted.overloads, not .signatures, which builds a list of types at every call.)"""
    if jitted.overloads:
        return jitted(*args)
    t0 = time.perf_counter()
    out = jitted(*args)
    if sum(jitted.stats.cache_misses.values()) and os.environ.get("TG_QUIET") != "1":
        seconds = time.perf_counter() - t0
        print(f"compiled cpu.{name} in {seconds:.1f} s", file=sys.stderr, flush=True)
    return out


def kernel(fn=None, *, serial_below=None, work=None, fastmath=False, interleave=None):
    """@kernel: fn compiled with prange over the cores (one core below serial_below elements
    of its first argument, default SERIAL_BELOW), cached on disk; the first call per dtype that
    compiles (a cold cache) prints 'compiled cpu.<name> in N s' to stderr. @kernel(serial_below=
    n) for a kernel whose work per element of its first argument is another's, and work=f for
    one whose work is not its first argument's size: f(*args), compared with serial_below;
    fastmath=True for one whose sums may be reassociated (a GEMV: vector_dot's flags, inlined
    loops included); interleave=n for one whose loop is one long chain of dependent vector ops
    per element (_interleaved). fn may be a closure over constants (a kernel made per format:
    Numba caches it by their values), never over a compiled function, which Numba does not
    cache."""
    if fn is None:
        return lambda fn: kernel(
            fn, serial_below=serial_below, work=work, fastmath=fastmath, interleave=interleave
        )
    variants = {p: _jit(fn, p, fastmath, interleave) for p in (True, False)}
    size = work or (lambda first, *rest: first.size)

    def call(*args):
        # one usable core (taskset, an MPI rank bound to a core), or a block of in_parallel: the
        # serial twin always, since a parallel launch costs its thread hand-off with no core to
        # gain (and the workqueue refuses launches from two threads at once). Read at each call,
        # so that a test can move SERIAL_BELOW; scaled by the pool's hand-off (use_pool).
        parallel = THREADS > 1 and size(*args) >= (serial_below or SERIAL_BELOW) * _handoff[0]
        parallel = parallel and not in_block()  # runtime.in_parallel's blocks: one core each
        if parallel and not _started[0]:
            _start_pool()
        return _announced(variants[parallel], fn.__name__, args)

    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    call.serial = variants[False]  # what a compiled step's op calls (step_runner.py)
    return call


def serial_kernel(fn):
    """@serial_kernel: kernel's serial twin alone, for a kernel called from the blocks of
    runtime.in_parallel, which has split the work over the cores already (Numba's workqueue
    layer refuses parallel launches from two threads at once)."""
    jitted = _jit(fn, False)

    def call(*args):
        return _announced(jitted, fn.__name__, args)

    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


device = numba.njit(cache=True, inline="always", error_model="numpy")  # a __device__ function


# The fixed-lane row reductions, emitted as LLVM IR: the LANES accumulators are one <LANES x T>
# value, which LLVM keeps in registers (one zmm of fp32 on AVX-512, two ymm on AVX2) and adds
# each next LANES elements to with one vector add. The same loop in Numba over a scratch array
# of LANES compiled to scalar code, each lane's add through memory: LLVM could not prove the
# scratch apart from the row. The instructions carry no fast-math flags, so each add is rounded
# where it stands, in the order written, and no multiply is fused into an add.


def _pointer(context, builder, row, index):
    """The address of element index of row, a (1-D array type, array) pair (any layout)."""
    return cgutils.get_item_pointer(context, builder, row[0], row[1], [index])


def _lanes_codegen(kind):
    """The codegen of row_<kind> (sum, dot or max) over its 1-D rows, all as long as the first:
    lane l takes the rows' elements l, l + LANES, ... in order into its accumulator, the tail
    (length % LANES elements) into lanes 0, 1, ..., then the lanes are combined in a tree."""

    def codegen(context, builder, signature, args):
        rows = [
            (t, context.make_array(t)(context, builder, a)) for t, a in zip(signature.args, args)
        ]
        vector = ir.VectorType(context.get_value_type(signature.return_type), LANES)
        length = builder.extract_value(rows[0][1].shape, 0)
        zero, one, lanes = (ir.Constant(length.type, k) for k in (0, 1, LANES))
        n = builder.sub(length, builder.srem(length, lanes))  # the elements before the tail

        def load(row, c0):  # elements c0 ... c0 + LANES - 1 of a row, as a vector
            if row[0].layout in "CF":
                address = builder.bitcast(_pointer(context, builder, row, c0), vector.as_pointer())
                return builder.load(address, align=row[0].dtype.bitwidth // 8)
            v = ir.Constant(vector, ir.Undefined)  # a strided view: element by element
            for lane in range(LANES):
                c = builder.add(c0, ir.Constant(c0.type, lane))
                x = builder.load(_pointer(context, builder, row, c))
                v = builder.insert_element(v, x, _lane(lane))
            return v

        def step(acc, values):  # a lane's (or every lane's) accumulator after its next element
            if kind == "max":  # Python's max(acc, x) as Numba lowers it: x only if x > acc
                return builder.select(builder.fcmp_ordered(">", values[0], acc), values[0], acc)
            return builder.fadd(acc, values[0] if kind == "sum" else builder.fmul(*values))

        acc = cgutils.alloca_once(builder, vector)  # a register once LLVM promotes it
        start = ir.Constant(vector, None)  # +0 in every lane
        if kind == "max":  # every lane starts from the row's first element
            first = builder.load(_pointer(context, builder, rows[0], zero))
            for lane in range(LANES):
                start = builder.insert_element(start, first, _lane(lane))
        builder.store(start, acc)
        with cgutils.for_range_slice(builder, zero, n, lanes) as (c0, _):
            values = [load(row, c0) for row in rows]
            builder.store(step(builder.load(acc), values), acc)
        with cgutils.for_range_slice(builder, n, length, one) as (c, _):
            lane, v = builder.sub(c, n), builder.load(acc)
            values = [builder.load(_pointer(context, builder, row, c)) for row in rows]
            last = step(builder.extract_element(v, lane), values)
            builder.store(builder.insert_element(v, last, lane), acc)
        v, width = builder.load(acc), LANES
        while width > 1:
            width //= 2
            if kind == "max":
                # adjacent lanes, the lower kept on a tie (0 and -0): the lowest lane holding the
                # maximum wins, as in a scan of the lanes in order
                low = builder.shuffle_vector(v, v, _lanes(range(0, 2 * width, 2)))
                v = step(low, [builder.shuffle_vector(v, v, _lanes(range(1, 2 * width, 2)))])
            else:  # lane l + lane l + width, as warp_sum adds a warp's
                low = builder.shuffle_vector(v, v, _lanes(range(width)))
                v = builder.fadd(low, builder.shuffle_vector(v, v, _lanes(range(width, 2 * width))))
        return builder.extract_element(v, _lane(0))

    return codegen


def _lane(lane):
    """A vector's index: lane number lane as an LLVM i32."""
    return ir.Constant(ir.IntType(32), lane)


def _lanes(lanes):
    """A shufflevector mask: the vector of these lane numbers."""
    lanes = list(lanes)
    return ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)), lanes)


def _reduction(kind, rows):
    """row_<kind>'s (signature, codegen) for rows of 1-D float arrays of one dtype; None (no
    match) for any other arguments."""
    dtype = rows[0].dtype if isinstance(rows[0], types.Array) else None
    for row in rows:
        if not (isinstance(row, types.Array) and row.ndim == 1 and row.dtype == dtype):
            return None
    if not isinstance(dtype, types.Float):
        return None
    return dtype(*rows), _lanes_codegen(kind)


@intrinsic
def row_sum(typingctx, x):
    """sum(x) of a 1-D float row in its dtype: LANES strided partial sums (lane l adds x[l],
    x[l + LANES], ... in order, the last length % LANES elements into lanes 0, 1, ...), then
    the lanes pairwise (lane l + lane l + width, width halving), as warp_sum adds a warp's: the
    CUDA twins' bits, the same for any core count."""
    return _reduction("sum", [x])


@intrinsic
def row_dot(typingctx, x, y):
    """sum(x * y) of two 1-D rows of one dtype, over the lanes of row_sum, each product rounded
    before it is added (no temporary for the products)."""
    return _reduction("dot", [x, y])


@intrinsic
def row_max(typingctx, x):
    """max(x) of a 1-D float row over the lanes of row_sum: each lane's maximum of its elements
    in order, a later one taken only if greater (a NaN never is: one at x[0], every lane's
    start, is the result), then the lanes', the lower lane kept on a tie. Exact: the order
    decides only which of 0 and -0 a tie returns."""
    return _reduction("max", [x])


@numba.njit(cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def vector_dot(x, y):
    """sum(x * y) of two fp32 rows, reassociated: LLVM's vectorized loop keeps its own partial
    sums (its vector width times its unroll) and adds them in a tree at the end, fused
    multiply-adds included. Not row_dot's fixed LANES tree, one chain of vector adds, each
    waiting for the last, and no fused multiply-add. The bits depend on the CPU's vector width
    (AVX2 or AVX-512), never on the run or the core count (a dot is one core's). For the GEMVs
    (quant.py), whose tests hold them to a tolerance, as BLAS's sgemv is."""
    s = np.float32(0)
    for k in range(x.shape[0]):
        s += x[k] * y[k]
    return s


@intrinsic
def f32_from_bits(typingctx, bits):
    """The fp32 whose bits are the int32 bits (CUDA's __int_as_float)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def bits_from_f32(typingctx, x):
    """The uint32 bits of fp32 x (CUDA's __float_as_uint)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


def _converts_half(context):
    """Whether the CPU Numba compiles for converts fp16 itself: x86 with F16C, or AArch64. On
    another CPU LLVM lowers fpext from half to a call to compiler-rt's __extendhfsf2, which
    Numba's JIT does not link."""
    triple, _, features = context.codegen().magic_tuple()
    return triple.startswith("aarch64") or "+f16c" in features.split(",")


def half_to_f32(context, builder, bits):
    """The fp32 values of the fp16s whose bits are the low 16 of bits (an i32 or <n x i32>, in
    LLVM IR), exact for every fp16: subnormals, infinities and NaNs (quieted, the payload kept)
    included. LLVM's fpext from half (x86's F16C: vcvtph2ps; AArch64: fcvtl); a CPU without
    either gets the same bits from integer operations: the fp16's exponent and mantissa moved 13
    places up, into fp32's lowest exponent bits (a subnormal fp16 an fp32 subnormal), the top
    exponent made fp32's (inf, NaN), then times 2^112 to rebias (exact), a multiply without
    fast-math flags so that LLVM never moves it past another (a subnormal times x would lose
    bits)."""
    lanes = bits.type.count if isinstance(bits.type, ir.VectorType) else None

    def of(element):  # the type of bits' shape with this element type
        return element if lanes is None else ir.VectorType(element, lanes)

    def const(element, v):
        return ir.Constant(of(element), v if lanes is None else [v] * lanes)

    f32, i32 = ir.FloatType(), ir.IntType(32)
    if _converts_half(context):
        half = builder.bitcast(builder.trunc(bits, of(ir.IntType(16))), of(ir.HalfType()))
        return builder.fpext(half, of(f32))
    sign = builder.shl(builder.and_(bits, const(i32, 0x8000)), const(i32, 16))
    magnitude = builder.and_(bits, const(i32, 0x7FFF))
    top = builder.icmp_unsigned(">=", magnitude, const(i32, 0x7C00))
    special = builder.select(top, const(i32, 0x7F800000), const(i32, 0))
    value = builder.bitcast(
        builder.or_(builder.or_(builder.shl(magnitude, const(i32, 13)), special), sign), of(f32)
    )
    return builder.fmul(value, const(f32, 2.0**112))


@intrinsic
def f32_from_f16_bits(typingctx, bits):
    """The fp32 value of the fp16 whose bits are the low 16 of the int32 bits (CUDA's
    __half2float(__ushort_as_half(bits))), exact (half_to_f32), which LLVM vectorizes."""

    def codegen(context, builder, signature, args):
        return half_to_f32(context, builder, args[0])

    return types.float32(types.int32), codegen


@device
def f32_from_bf16_bits(bits):
    """The fp32 value of the bf16 whose bits are bits (its top half, exact: the twin of
    f32_from_f16_bits)."""
    return f32_from_bits(np.int32(bits) << np.int32(16))
