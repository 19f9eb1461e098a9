"""A captured step's kernels run as one parallel hand-off (graph/cpu_step.py builds it): every
thread of the pool enters one compiled loop over the step's ops, each thread does its share of
an op (thread t of T: its rows, heads or half of K), then waits at a barrier for the others
before the next op, as llama.cpp's graph compute runs its threads over a graph. A step launched
from Python hands each parallel kernel to the pool and back (a wake-up and a join each), pays
Python around every launch, and runs each small kernel on one core while the others idle; here
the pool is woken once a step, and between ops the threads meet at a barrier in shared memory.

An op is a C function op(t, T, args) (Numba's cfunc: a kernel family's cpu_step.py writes each,
around its kernels' serial twins, so the same compiled loops and the same bits as a launch from
Python), args a row of int64s: the addresses of its arrays (fixed for the step's life: its
buffers and weights), their sizes, its scalars (a float as its fp64 bits). Ops.add packs them.

The barrier: a count each thread adds one to (an atomic add) and a generation the last one to
arrive moves on, which the others spin on. Threads: the pool's (numba.get_num_threads), one
prange iteration each: OpenMP's static schedule and the workqueue give each thread one iteration
of as many as there are threads, so every thread is in the loop at once (TBB's work stealing
does not promise that: under it no step is compiled, run_ready says so).
"""

import threading
import time
import types as types_module

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ... import compiles
from ...memory import root
from .compiled import _start_pool, _started
from .runtime import THREADS

I64 = ir.IntType(64)
SIGNATURE = types.void(types.int64, types.int64, types.CPointer(types.int64))  # op(t, T, args)


@intrinsic
def _call(typingctx, fn, t, T, args):
    """The op at address fn called with (t, T, args), args the address of its int64s."""

    def codegen(context, builder, signature, a):
        kind = ir.FunctionType(ir.VoidType(), [I64, I64, I64.as_pointer()])
        op = builder.inttoptr(a[0], kind.as_pointer())
        builder.call(op, [a[1], a[2], builder.inttoptr(a[3], I64.as_pointer())])
        return context.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64, types.int64), codegen


def _element(builder, context, kind, array, i):
    return builder.gep(context.make_array(kind)(context, builder, array).data, [i])


@intrinsic
def _fetch_add(typingctx, sync, i, v):
    """sync[i] += v, atomically -> what it held before."""

    def codegen(context, builder, signature, a):
        at = _element(builder, context, signature.args[0], a[0], a[1])
        return builder.atomic_rmw("add", at, a[2], "seq_cst")

    return types.int64(sync, types.int64, types.int64), codegen


@intrinsic
def _load(typingctx, sync, i):
    """sync[i], read with acquire order (what the thread that stored it wrote before is seen)."""

    def codegen(context, builder, signature, a):
        return builder.load_atomic(
            _element(builder, context, signature.args[0], a[0], a[1]), "acquire", 8
        )

    return types.int64(sync, types.int64), codegen


@intrinsic
def _store(typingctx, sync, i, v):
    """sync[i] = v with release order (what this thread wrote before is seen with it)."""

    def codegen(context, builder, signature, a):
        at = _element(builder, context, signature.args[0], a[0], a[1])
        builder.store_atomic(a[2], at, "release", 8)
        return context.get_dummy_value()

    return types.void(sync, types.int64, types.int64), codegen


def _pointer(kind):
    """An intrinsic: an int64 address -> a pointer to `kind` there (numba.carray's first
    argument)."""

    @intrinsic
    def at(typingctx, address):
        def codegen(context, builder, signature, a):
            return builder.inttoptr(a[0], context.get_value_type(kind).as_pointer())

        return types.CPointer(kind)(types.int64), codegen

    return at


f32_at, i64_at = _pointer(types.float32), _pointer(types.int64)
u8_at, u16_at, u32_at = _pointer(types.uint8), _pointer(types.uint16), _pointer(types.uint32)
i8_at, i32_at = _pointer(types.int8), _pointer(types.int32)


@intrinsic
def f64_of(typingctx, bits):
    """The fp64 whose bits an int64 holds (Ops.add's scalars)."""

    def codegen(context, builder, signature, a):
        return builder.bitcast(a[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@numba.njit(inline="always")
def share(n, t, T):
    """Thread t's part [lo, hi) of n items split over T threads."""
    return t * n // T, (t + 1) * n // T


# sync: the barrier's count (element 0) and generation (element 8), a cache line apart
@numba.njit(inline="always")
def _barrier(sync, T):
    generation = _load(sync, 8)
    if _fetch_add(sync, 0, 1) == T - 1:  # the last to arrive: start the next generation
        _store(sync, 0, 0)
        _store(sync, 8, generation + 1)
    else:
        while _load(sync, 8) == generation:
            pass


@numba.njit(parallel=True, nogil=True, cache=True)
def _run_parallel(ops, at, table, T, sync):
    base = table.ctypes.data
    for t in numba.prange(T):
        for i in range(ops.shape[0]):
            _call(ops[i], t, T, base + 8 * at[i])
            _barrier(sync, T)


@numba.njit(nogil=True, cache=True)
def _run_serial(ops, at, table):
    base = table.ctypes.data
    for i in range(ops.shape[0]):
        _call(ops[i], 0, 1, base + 8 * at[i])


def run_ready():
    """Whether steps can run here: a thread pool that puts every thread in the loop at once
    (the module's docstring), or one core."""
    return THREADS == 1 or numba.config.THREADING_LAYER in ("omp", "workqueue")


class Op:
    """An op's C function, compiled (or loaded from Numba's disk cache) when a step first
    needs it: fn(t, T, args) written as the module's docstring says."""

    def __init__(self, fn):
        self.fn, self.compiled = fn, None

    @property
    def address(self):
        if self.compiled is None:
            t0, before = time.perf_counter(), compiles.so_far()
            self.compiled = numba.cfunc(SIGNATURE, cache=True, nogil=True)(self.fn)
            inner = compiles.so_far() - before  # the kernels it calls, compiled and counted
            compiles.add(time.perf_counter() - t0 - inner.seconds)
        return self.compiled.address


def op(fn):
    """@op: fn(t, T, args) as a step's op (Op)."""
    return Op(fn)


_VARIANTS = {}


def variant(template, key, **bound):
    """template's op with some of its globals bound to other objects (one format's kernel, a
    closure compiled.kernel made): a copy of its function named <its name>_<key>, so that
    Numba's disk cache keeps each under its own name (compiled._jit's serial twins likewise),
    made once a process."""
    name = f"{template.fn.__name__}_{key}"
    if name not in _VARIANTS:
        fn = template.fn
        fn = types_module.FunctionType(fn.__code__, {**fn.__globals__, **bound}, name)
        fn.__qualname__ = name
        _VARIANTS[name] = Op(fn)
    return _VARIANTS[name]


class Unsupported(Exception):
    """A launch no op form takes (its kernel, dtype or layout): the step stays a replay from
    Python."""


FORMS = {}  # kernel name -> form(ops, outs, *args, **kwargs): its launch added to ops as ops


def form(name):
    """@form(name): how a launch of kernel `name` joins a compiled step: form(ops, outs, *args,
    **kwargs), the launch's arguments as the step holds them and outs its outputs' buffers
    (None where an output is no new buffer: an argument written in place), adds its ops to
    ops (Ops) or raises Unsupported."""

    def register(fn):
        FORMS[name] = fn
        return fn

    return register


class Strided:
    """An array argument passed with its layout: address, shape, then strides in bytes (a 4-D
    one rebuilt by strided4())."""

    def __init__(self, array):
        self.array = array


@numba.njit(inline="always")
def strided4(a, k):
    """The 4-D fp32 array whose Strided description starts at a[k]."""
    base = numba.carray(f32_at(a[k]), (1,))
    shape = (a[k + 1], a[k + 2], a[k + 3], a[k + 4])
    return np.lib.stride_tricks.as_strided(base, shape, (a[k + 5], a[k + 6], a[k + 7], a[k + 8]))


class Ops:
    """A step's ops in order, each with its row of int64s; the arrays they address are kept
    alive here, with the host checks of the step's inputs (a token id in range, a position in
    the cache) that its launches made from Python. run() runs the ops on every thread of the
    pool at once (or on this one)."""

    def __init__(self, variable=()):
        self.ops, self.rows, self.kept, self.scratches, self.checks = [], [], [], [], {}
        self.variable = variable  # ids of the buffers the step writes (no input checked there)

    def add(self, op, *args):
        """op with args: C-contiguous arrays (their addresses), Strided arrays, ints and
        floats (their fp64 bits)."""
        row = []
        for a in args:
            if isinstance(a, Strided):
                self.kept.append(a.array)
                row += [a.array.ctypes.data, *a.array.shape, *a.array.strides]
            elif isinstance(a, np.ndarray):
                if not a.flags.c_contiguous:
                    raise Unsupported(f"{op.fn.__name__} takes a C-contiguous array")
                self.kept.append(a)
                row.append(a.ctypes.data)
            elif isinstance(a, (float, np.floating)):
                row.append(int(np.float64(a).view(np.int64)))
            else:
                row.append(int(a))
        self.ops.append(op)
        self.rows.append(row)

    def scratch(self, shape, dtype=np.float32):
        """A buffer of an op's own, kept with the step."""
        a = np.empty(shape, dtype)
        self.scratches.append(a)
        return a

    def check(self, key, fn, *inputs):
        """fn() before every run (once per key): a launch's check of the step's inputs, which
        raises what the launch from Python raised. Unsupported where an input is a buffer the
        step writes: its values are known only once the step has run."""
        if any(id(root(x)) in self.variable for x in inputs):
            raise Unsupported("a check of a value the step computes")
        self.checks.setdefault(key, fn)

    def __len__(self):
        return len(self.ops)

    def ready(self):
        """Each op compiled, and the table built: (ops, at, table)."""
        if not _run_serial.overloads:  # the runners too, counted as compiles (not a step's time)
            t0, rows = time.perf_counter(), types.int64[::1]
            _run_serial.compile((rows, rows, rows))
            _run_parallel.compile((rows, rows, rows, types.int64, rows))
            compiles.add(time.perf_counter() - t0)
        if not hasattr(self, "_table"):
            at = np.cumsum([0] + [len(r) for r in self.rows[:-1]]).astype(np.int64)
            table = np.array([v for r in self.rows for v in r] or [0], np.int64)
            ops = np.array([o.address for o in self.ops], np.int64)
            self._table = (ops, at, table)
        return self._table

    def check_inputs(self):
        """The launches' checks of the step's inputs (check()), each raising what its launch
        raised from Python."""
        for fn in self.checks.values():
            fn()

    def run(self):
        """The ops (their inputs checked first: check_inputs), one run at a time in the process
        (the barrier's counters are one)."""
        ops, at, table = self.ready()
        with _ONE_RUN:
            T = min(THREADS, numba.get_num_threads())
            if T > 1:
                if not _started[0]:
                    _start_pool()
                    T = min(THREADS, numba.get_num_threads())
                _run_parallel(ops, at, table, T, _SYNC)
            else:
                _run_serial(ops, at, table)


_SYNC = np.zeros(16, np.int64)  # the barrier's count and generation
_ONE_RUN = threading.Lock()  # held by the thread whose ops run
