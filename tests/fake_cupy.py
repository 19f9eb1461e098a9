"""A NumPy stand-in for the part of CuPy that the CUDA device uses (backend/cuda/, and the kernels'
cuda.py modules, kernels/<family>/cuda.py): the one check of the CUDA glue
(argument packing, launch shapes, the compile list) that runs without a GPU.

Arrays are NumPy arrays of a subclass, `ndarray`, with CuPy's `.data.ptr`; the array functions
delegate to NumPy and return that subclass. RawModule parses the CUDA source it is given (what
cuda.runtime.kernel_source builds) for every `__global__` signature, and get_function("name<args>")
instantiates one: template parameters substituted, acc_t<T> resolved from common.cuh's
`Num<T>::acc` typedefs. Calling the kernel checks the launch as CuPy would pack it and the GPU
would accept it (dynamic shared memory included: above 48 KB only as opted into, never above the
device's opt-in limit, SHARED_OPTIN) and records it in LAUNCHES. By default it computes nothing
(outputs keep what they held); with installed(execute=True) it then runs the kernel on the CPU
(tests/cuda_on_cpu: the .cu source compiled with the C++ compiler, on the arrays' buffers).

Streams, CUDA graphs and memory pools as far as a step's capture needs them: `with stream:` makes
a stream current; between stream.begin_capture() and end_capture() nothing launched on it runs:
kernels (their arguments packed then, as the GPU freezes them), CuPy's functions, ufuncs and
setitems on device arrays become the nodes of a _Graph, run in order by graph.launch(); a read
of a device array by the host (asnumpy, int(), float(), bool(), .item(), .get()), a copy from
the host, a synchronize or a graph launch inside a capture raises, as CUDA refuses them there.
Memory allocated while cupy.cuda.using_allocator(pool.malloc) is in effect is kept by the pool
(never reused: a real pool reuses what was freed, in the capture's stream order); a graph whose
node finds its memory freed since the capture raises.

installed() puts the stand-in in sys.modules, imports a fresh tinygrad_like.backend.cuda package
over it (and, as kernels.on(device) asks for them, fresh kernels/<family>/cuda.py modules), and
restores sys.modules (and os.environ) afterwards.
"""

import contextlib
import importlib
import os
import re
import sys
import types
import weakref
from typing import NamedTuple
from unittest import mock

import ml_dtypes
import numpy as np


class LaunchError(Exception):
    """A launch that CuPy would pack wrongly or the GPU would refuse."""


class Launch(NamedTuple):
    name: str  # the instance, e.g. "gemm_tc<__half,false,true,true>"
    grid: tuple
    block: tuple
    args: tuple
    source: str  # the module's CUDA source


LAUNCHES = []  # every launch that passed the checks, in order (not those inside a capture)
EXECUTE = [False]  # run the kernels (installed(execute=True)); else only check the launches
STATIC_SHARED_MAX = 48 * 1024  # what a block may use without opting in
SHARED_OPTIN = 232448  # the device's opt-in limit per block: sm_90's 227 KB (sm_80: 166912)
DEVICE_ATTRIBUTES = {97: SHARED_OPTIN}  # cudaDevAttrMaxSharedMemoryPerBlockOptin

# C type -> NumPy dtype, for pointees and for scalar arguments
_DTYPES = {
    c: np.dtype(t)
    for c, t in {
        "float": np.float32,
        "double": np.float64,
        "__half": np.float16,
        "__nv_bfloat16": ml_dtypes.bfloat16,
        "int": np.int32,
        "long long": np.int64,
        "unsigned long long": np.uint64,
        "unsigned": np.uint32,
        "unsigned short": np.uint16,
        "unsigned char": np.uint8,
        "bool": np.bool_,
    }.items()
}

# ---------------------------------------------------------------- arrays


class _Pointer(NamedTuple):
    ptr: int


class ndarray(np.ndarray):
    """A NumPy array posing as cupy.ndarray. .data.ptr is the address of the first element, as
    CuPy's (so slices with a non-zero start have an offset pointer)."""

    @property
    def data(self):
        return _Pointer(self.__array_interface__["data"][0])

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [np.asarray(x) if isinstance(x, ndarray) else x for x in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(np.asarray(o) if isinstance(o, ndarray) else o for o in out)
        run = lambda: getattr(ufunc, method)(*plain, **kwargs)  # noqa: E731
        if out is None:
            return _device(run()) if _capture() is None else _captured(run, inputs, ufunc.__name__)
        if _capture() is None:
            run()
        else:  # written in place: at the graph's launch only
            _capture().nodes.append(_Node(run, inputs + out, ufunc.__name__))
        return out[0] if len(out) == 1 else out

    def __setitem__(self, key, value):
        if _capture() is None:
            return np.ndarray.__setitem__(self, key, value)
        keys = key if isinstance(key, tuple) else (key,)
        node = lambda: np.ndarray.__setitem__(self, key, value)  # noqa: E731
        _capture().nodes.append(_Node(node, (self, value, *keys), "setitem"))

    def copy(self, order="C"):
        return self.astype(self.dtype, order=order)

    def astype(self, dtype, order="K", copy=True):
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        run = lambda: np.ndarray.astype(self, dtype, order=order)  # noqa: E731
        return _device(run()) if _capture() is None else _captured(run, (self,), "astype")

    def fill(self, value):
        if _capture() is None:
            return np.ndarray.fill(self, value)
        _capture().nodes.append(_Node(lambda: np.ndarray.fill(self, value), (self,), "fill"))

    def _host_read(name):  # a method factory, run in the class body
        def read(self, *args):
            _refuse_in_capture(f"{name}() of a device array (a device-to-host read)")
            return getattr(np.ndarray, name)(self, *args)

        return read

    __int__, __float__, __bool__, __index__ = map(
        _host_read, ("__int__", "__float__", "__bool__", "__index__")
    )
    item, tolist = _host_read("item"), _host_read("tolist")
    del _host_read

    def get(self):
        return asnumpy(self)

    @property
    def base(self):
        """The device array this one is a view of, else None: the NumPy array a device array
        was made from (its memory, as it were) is not one."""
        base = np.ndarray.base.__get__(self)
        return base if isinstance(base, ndarray) else None

    @property
    def __cuda_array_interface__(self):
        """CuPy's: what says, to backend.of and to NumPy's callers, that this is a device array."""
        face = self.__array_interface__
        return {**face, "version": 3, "stream": 1}


def _device(x):
    """NumPy results (arrays, 0-d scalars, tuples of them) as device arrays, as CuPy returns; a
    new one in the memory of the allocator in effect (using_allocator), if any."""
    if isinstance(x, (np.ndarray, np.generic)):
        # memory NumPy just made (a device array made by the stand-in is a view of its memory,
        # and owns none: one that does is new, e.g. np.empty_like's): the allocator's
        x = np.asarray(x) if not isinstance(x, ndarray) else x
        if _ALLOCATORS and np.ndarray.base.__get__(x) is None:
            block = _ALLOCATORS[-1](max(x.nbytes, 1)).memory[: x.nbytes]
            held = block.view(x.dtype).reshape(x.shape)
            np.copyto(held, x)
            x = held
        return x if isinstance(x, ndarray) else x.view(ndarray)
    if isinstance(x, (tuple, list)):
        return type(x)(_device(i) for i in x)
    return x


_NO_NODE = {"empty", "empty_like", "broadcast_to"}  # no values computed: no node in a graph


def _on_device(fn):
    def wrapped(*args, **kwargs):
        run = lambda: fn(*args, **kwargs)  # noqa: E731
        if _capture() is None or fn.__name__ in _NO_NODE:
            return _device(run())
        if kwargs.get("out") is not None:
            _capture().nodes.append(_Node(run, (*args, kwargs["out"]), fn.__name__))
            return kwargs["out"]
        return _captured(run, args, fn.__name__)

    wrapped.__name__ = fn.__name__
    return wrapped


def asarray(a, dtype=None):
    """A copy on the "device", unless a is already a device array of that dtype (as CuPy)."""
    if not isinstance(a, ndarray):
        _refuse_in_capture("a copy from the host")
        return _device(np.array(a, dtype))
    same = dtype is None or np.dtype(dtype) == a.dtype
    return a if same else a.astype(dtype)


def asnumpy(a):
    _refuse_in_capture("asnumpy (a device-to-host copy)")
    return np.array(a)


def ascontiguousarray(a, dtype=None):
    """As CuPy's (and NumPy's, but for the subclass): a itself when it is a C-contiguous device
    array of that dtype, at least 1-d; else a C-contiguous copy."""
    same = dtype is None or np.dtype(dtype) == a.dtype
    if isinstance(a, ndarray) and a.ndim and a.flags.c_contiguous and same:
        return a
    if not isinstance(a, ndarray):
        _refuse_in_capture("a copy from the host")
    run = lambda: np.ascontiguousarray(a, dtype)  # noqa: E731
    return _device(run()) if _capture() is None else _captured(run, (a,), "ascontiguousarray")


def _as_strided(x, shape, strides):
    """A view of a contiguous device array x, whose base is x (as CuPy's; NumPy's own keeps a
    helper object between them)."""
    return np.ndarray.__new__(ndarray, shape, x.dtype, buffer=x, strides=strides)


# ---------------------------------------------------------------- streams, graphs, pools

_STREAMS = []  # the streams made current by `with stream:`, innermost last
_ALLOCATORS = []  # the allocators in effect (using_allocator), innermost last


class _Node(NamedTuple):
    """A graph's node: run() computes it; arrays: the device arrays it reads or writes; memory:
    weak references to what owns their bytes (end_capture makes them)."""

    run: object
    arrays: tuple
    what: str  # for the messages: the kernel, or CuPy's function
    memory: tuple = ()


def _memory_of(a):
    """The NumPy array that owns a device array's bytes (a pool's block, or what NumPy made)."""
    while isinstance(a, np.ndarray) and np.ndarray.base.__get__(a) is not None:
        a = np.ndarray.base.__get__(a)
    return a


class _Graph:
    """cupy.cuda.Graph: the nodes a capture recorded, run in order by launch()."""

    def __init__(self):
        self.nodes = []

    def launch(self, stream=None):
        _refuse_in_capture("a graph launch")
        for node in self.nodes:
            if any(memory() is None for memory in node.memory):
                raise LaunchError(
                    f"a graph's node ({node.what}) reads or writes memory freed since the "
                    "capture: allocate what a captured step makes from a pool the graph keeps"
                )
            node.run()


def _capture():
    """The graph the current stream is capturing into, or None."""
    return _STREAMS[-1].graph if _STREAMS else None


def _refuse_in_capture(what):
    if _capture() is not None:
        raise LaunchError(f"{what} inside a stream capture: CUDA refuses it there")


def _captured(run, inputs, what):
    """A computation inside a capture: its result's shape and dtype found by running it now on
    whatever its inputs hold (values computed later are not there yet), its memory the
    allocator's; the node computes it again into that memory at each launch."""
    with np.errstate(all="ignore"):  # values not computed yet: any garbage, overflows too
        result = _device(run())
    node = _Node(lambda: np.copyto(np.asarray(result), run()), (*inputs, result), what)
    _capture().nodes.append(node)
    return result


def _keep_memory(graph):
    """Each node's arrays as weak references to their memory (checked at launch): a kernel's
    node holds its pointers only, as a GPU's graph does, so nothing else keeps its memory
    alive; a CuPy function's node keeps the arrays its NumPy call takes."""
    for i, node in enumerate(graph.nodes):
        held = [_memory_of(a) for a in node.arrays if isinstance(a, ndarray)]
        graph.nodes[i] = _Node(node.run, (), node.what, tuple(weakref.ref(m) for m in held))


class _Stream:
    """cupy.cuda.Stream: `with stream:` makes it current; begin_capture() ... end_capture() records
    what is launched on it into a _Graph instead of running it."""

    def __init__(self, null=False, non_blocking=False, ptds=False):
        self.null, self.graph = null, None

    def __enter__(self):
        _STREAMS.append(self)
        return self

    def __exit__(self, *exc):
        _STREAMS.pop()

    def begin_capture(self, mode=None):
        if self.null:
            raise LaunchError("cannot capture on the default (legacy) stream")
        if self.graph is not None:
            raise LaunchError("the stream is capturing already")
        self.graph = _Graph()

    def end_capture(self):
        if self.graph is None:
            raise LaunchError("the stream is not capturing")
        graph, self.graph = self.graph, None
        _keep_memory(graph)
        return graph

    def is_capturing(self):
        return self.graph is not None

    def synchronize(self):
        _refuse_in_capture("a stream synchronize")


class _Block(NamedTuple):
    memory: np.ndarray  # uint8 bytes


class _MemoryPool:
    """cupy.cuda.MemoryPool: malloc(nbytes) gives a block the pool keeps as long as it lives."""

    def __init__(self):
        self.blocks = []

    def malloc(self, nbytes):
        self.blocks.append(_Block(np.empty(nbytes, np.uint8)))
        return self.blocks[-1]

    def used_bytes(self):
        return sum(b.memory.nbytes for b in self.blocks)

    total_bytes = used_bytes


@contextlib.contextmanager
def _using_allocator(allocator):
    _ALLOCATORS.append(allocator)
    try:
        yield
    finally:
        _ALLOCATORS.pop()


_ARRAY_FUNCTIONS = (
    "empty",
    "zeros",
    "full",
    "empty_like",
    "broadcast_to",
    "matmul",
    "concatenate",
    "sort",
    "arange",
    "sum",
    "add",
    "subtract",
    "multiply",
    "divide",
    "negative",
    "max",
    "argmax",
    "where",
)

# ---------------------------------------------------------------- kernels

_SIGNATURE = re.compile(
    r"(?:template\s*<([^>]*)>\s*)?__global__\s+void\s+"
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)\s*\{"
)
_ACC = re.compile(r"struct\s+Num<(\w+)>\s*\{\s*typedef\s+(\w+)\s+acc\s*;")
_GRID_MAX, _BLOCK_MAX = (2**31 - 1, 65535, 65535), (1024, 1024, 64)


def _body(source, open_brace):
    """The text of the block that starts at source[open_brace] == '{'."""
    depth = 0
    for i in range(open_brace, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[open_brace : i + 1]
    raise LaunchError("unbalanced braces in the kernel source")


class _Param(NamedTuple):
    name: str
    ctype: str  # without const / pointer, e.g. "long long"
    pointer: bool
    nullable: bool  # the body tests the pointer (`if (p)`, `p ? ...`): null may be passed


class _Template(NamedTuple):
    params: list  # [(kind, name)], kind: typename, bool or int
    args: str  # the parameter list as written
    body: str


def _instantiate(template, targs, acc):
    """[_Param] of a kernel with its template parameters bound to targs (C spellings)."""
    if len(targs) != len(template.params):
        raise LaunchError(f"{len(targs)} template arguments for {len(template.params)} parameters")
    bound = {}  # typename parameter -> C type
    for (kind, pname), value in zip(template.params, targs):
        fits = {
            "typename": value in _DTYPES,
            "bool": value in ("true", "false"),
            "int": re.fullmatch(r"-?\d+", value) is not None,
        }.get(kind, False)
        if not fits:
            raise LaunchError(f"template argument {value!r} does not fit `{kind} {pname}`")
        if kind == "typename":
            bound[pname] = value
    params = []
    for decl in template.args.split(","):
        decl = re.sub(r"\b(\w+)\b", lambda m: bound.get(m[1], m[1]), decl)
        decl = re.sub(r"acc_t\s*<\s*(\w+)\s*>", lambda m: _acc_of(m[1], acc), decl)
        name = re.search(r"(\w+)\s*$", decl)[1]
        ctype = " ".join(re.sub(r"\b(const|__restrict__)\b|\*", " ", decl[: -len(name)]).split())
        if ctype not in _DTYPES:
            raise LaunchError(f"parameter `{decl.strip()}`: no NumPy type for {ctype!r}")
        nullable = re.search(rf"\bif\s*\(\s*!?\s*{name}\s*\)|\b{name}\s*\?", template.body)
        params.append(_Param(name, ctype, "*" in decl, nullable is not None))
    return params


def _acc_of(ctype, acc):
    if ctype not in acc:
        raise LaunchError(f"acc_t<{ctype}>: common.cuh defines no Num<{ctype}>")
    return acc[ctype]


def _dims(what, dims, limits):
    if not isinstance(dims, tuple) or not 1 <= len(dims) <= 3:
        raise LaunchError(f"{what} must be a tuple of 1 to 3 ints, got {dims!r}")
    for axis, (d, limit) in enumerate(zip(dims, limits)):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 1 <= d <= limit:
            raise LaunchError(
                f"{what} {dims}: dimension {'xyz'[axis]} must be an int in [1, {limit}]"
            )


class Kernel:
    def __init__(self, name, params, source, names):
        self.name, self.params, self.source, self.names = name, params, source, names
        self.max_dynamic_shared_size_bytes = 0  # CuPy's attribute: the opt-in above 48 KB

    def __call__(self, grid, block, args, shared_mem=0):
        _dims("grid", grid, _GRID_MAX)
        _dims("block", block, _BLOCK_MAX)
        if np.prod(block) > 1024:
            raise LaunchError(f"block {block}: more than 1024 threads")
        self._shared(shared_mem)
        if not isinstance(args, tuple) or len(args) != len(self.params):
            raise LaunchError(
                f"{self.name} takes a tuple of {len(self.params)} arguments, got "
                f"{len(args) if isinstance(args, tuple) else type(args).__name__}"
            )
        for i, (arg, p) in enumerate(zip(args, self.params)):
            try:
                (self._pointer if p.pointer else self._scalar)(arg, p)
            except LaunchError as e:
                raise LaunchError(f"{self.name}, argument {i} ({p.name}): {e}") from None
        if _capture() is None:  # a captured launch is its graph's node, which holds no array
            LAUNCHES.append(Launch(self.name, grid, block, args, self.source))
        packed = [  # what the GPU freezes in a captured launch: pointers and scalars' bytes
            int(a.data.ptr if isinstance(a, ndarray) else a).to_bytes(8, "little")
            if p.pointer
            else a.tobytes()
            for a, p in zip(args, self.params)
        ]

        def run():
            if EXECUTE[0]:
                import cuda_on_cpu

                cuda_on_cpu.launch(
                    self.source, self.names, self.name, grid, block, int(shared_mem), packed
                )

        if _capture() is not None:
            _capture().nodes.append(_Node(run, args, self.name))
        else:
            run()

    def _shared(self, shared_mem):
        optin = DEVICE_ATTRIBUTES[97]
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, (int, np.integer)):
            raise LaunchError(f"shared_mem must be an int, got {shared_mem!r}")
        if not 0 <= self.max_dynamic_shared_size_bytes <= optin:
            raise LaunchError(
                f"max_dynamic_shared_size_bytes = {self.max_dynamic_shared_size_bytes}: the "
                f"device allows at most {optin}"
            )
        limit = max(STATIC_SHARED_MAX, self.max_dynamic_shared_size_bytes)
        if not 0 <= shared_mem <= limit:
            raise LaunchError(
                f"{self.name}: {shared_mem} bytes of dynamic shared memory, more than the "
                f"{limit} allowed (above {STATIC_SHARED_MAX} a kernel must opt in, up to "
                f"{optin})"
            )

    @staticmethod
    def _pointer(arg, p):
        want = _DTYPES[p.ctype]
        if isinstance(arg, ndarray):
            if arg.dtype != want:
                raise LaunchError(f"a {arg.dtype} array for a {p.ctype}* ({want})")
            if not arg.flags.c_contiguous:
                raise LaunchError(f"a non-contiguous array (strides {arg.strides})")
        elif type(arg) is np.uint64 and arg == 0:
            if not p.nullable:
                raise LaunchError("a null pointer, but the kernel never tests it for null")
        else:
            raise LaunchError(
                f"{type(arg).__name__} for a {p.ctype}*: pass a device array or np.uint64(0)"
            )

    @staticmethod
    def _scalar(arg, p):
        want = _DTYPES[p.ctype]
        if not isinstance(arg, np.generic):
            raise LaunchError(
                f"{type(arg).__name__} for a {p.ctype}: CuPy packs a Python int as "
                f"8 bytes and a float as a double whatever the parameter is; pass "
                f"np.{want.name}(...)"
            )
        if arg.dtype != want:
            raise LaunchError(f"np.{arg.dtype.name} for a {p.ctype} (np.{want.name})")


class RawModule:
    """cupy.RawModule over a source text: parses every __global__ signature; the instances in
    name_expressions are instantiated up front, as NVRTC compiles them all."""

    def __init__(self, code, options=(), name_expressions=()):
        self.code, self.name_expressions = code, tuple(name_expressions)
        acc = dict(_ACC.findall(code))
        self.templates = {}
        for m in _SIGNATURE.finditer(code):
            params = [tuple(p.split()) for p in (m[1] or "").split(",") if p.strip()]
            self.templates[m[2]] = _Template(params, m[3], _body(code, m.end() - 1))
        if len(self.templates) != len(re.findall(r"\b__global__\b", code)):
            raise LaunchError("a __global__ kernel the stand-in could not parse")
        self.kernels = {}
        for expr in self.name_expressions:
            m = re.fullmatch(r"(\w+)(?:<([^<>]*)>)?", expr)
            if m is None or m[1] not in self.templates:
                raise LaunchError(f"name expression {expr!r} names no kernel of the source")
            targs = [a.strip() for a in (m[2] or "").split(",") if a.strip()]
            self.kernels[expr] = Kernel(
                expr, _instantiate(self.templates[m[1]], targs, acc), code, self.name_expressions
            )

    def get_function(self, name):
        if name not in self.kernels:
            raise LaunchError(
                f"{name!r} is not in name_expressions: NVRTC would not have compiled it"
            )
        return self.kernels[name]


# ---------------------------------------------------------------- the modules


class _Event:
    def record(self):
        pass

    def synchronize(self):
        pass


class _Device:
    def __init__(self, id=0):
        self.id = id

    def synchronize(self):
        _refuse_in_capture("a device synchronize")


class _MemoryHook:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class _Pool:
    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0


def _modules():
    """Fresh module objects for cupy, cupy.cuda and cupy.cuda.memory_hook."""
    cupy = types.ModuleType("cupy")
    for fn in _ARRAY_FUNCTIONS:
        setattr(cupy, fn, _on_device(getattr(np, fn)))
    cupy.ndarray, cupy.int64 = ndarray, np.int64
    cupy.asarray, cupy.asnumpy, cupy.RawModule = asarray, asnumpy, RawModule
    cupy.ascontiguousarray = ascontiguousarray
    cupy.LAUNCHES = LAUNCHES  # the stand-in's own: what the tests count (no CuPy has it)
    cupy.get_default_memory_pool = _Pool
    cupy.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=_as_strided))
    cuda = types.ModuleType("cupy.cuda")
    cuda.Device, cuda.Event = _Device, _Event
    cuda.Stream, cuda.MemoryPool, cuda.using_allocator = _Stream, _MemoryPool, _using_allocator
    cuda.get_current_stream = lambda: _STREAMS[-1] if _STREAMS else _NULL_STREAM
    cuda.get_elapsed_time = lambda start, end: 0.0
    cuda.runtime = types.SimpleNamespace(  # no device: a stand-in must never pass for a GPU
        getDeviceCount=lambda: 0,
        getDeviceProperties=lambda i: {"name": b"fake_cupy (no GPU)"},
        getDeviceAttribute=lambda attr, device: DEVICE_ATTRIBUTES[attr],
        cudaDevAttrMaxSharedMemoryPerBlockOptin=97,
    )
    memory_hook = types.ModuleType("cupy.cuda.memory_hook")
    memory_hook.MemoryHook = _MemoryHook
    cupy.cuda, cuda.memory_hook = cuda, memory_hook
    return {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.memory_hook": memory_hook}


_NULL_STREAM = _Stream(null=True)
_CUDA = "tinygrad_like.backend.cuda"
_KERNELS = "tinygrad_like.kernels."  # + <family>.cuda: the CUDA kernels, over the same CuPy
_CUPY = ("cupy", "cupy.cuda", "cupy.cuda.memory_hook")


def _ours(name):
    """Whether a module is the stand-in's or imported over it (the CUDA device's package and
    the kernel families' cuda.py modules)."""
    kernel = name.startswith(_KERNELS) and name.endswith(".cuda")
    return name in _CUPY or name == _CUDA or name.startswith(_CUDA + ".") or kernel


@contextlib.contextmanager
def installed(execute=False):
    """with installed() as cuda: backend/cuda/ imported over the stand-in; kernels.on(cuda) then
    imports the kernel families' cuda.py over it too. On exit sys.modules (real CuPy included),
    the `cuda` attributes of the backend package and of the family packages, kernels.on's
    gathering and os.environ (importing cuda/runtime.py may set CUDA_PATH) are as they were.
    execute=True: launches run the kernels on the CPU (tests/cuda_on_cpu) after their checks."""
    from tinygrad_like import backend, kernels

    backend.cuda_available()  # cached now, from the real environment, never from the stand-in
    saved = {n: m for n, m in sys.modules.items() if _ours(n)}
    families = {sys.modules[f"{kernels.__name__}.{k.family}"] for k in kernels.KERNELS.values()}
    saved_attrs = [(p, p.__dict__.get("cuda")) for p in (backend, *families)]  # submodules
    for n in saved:
        del sys.modules[n]
    sys.modules.update(_modules())
    was_executing, EXECUTE[0] = EXECUTE[0], execute
    module = None
    try:
        with mock.patch.dict(os.environ):
            module = importlib.import_module(_CUDA)
            yield module
    finally:
        EXECUTE[0] = was_executing
        kernels._gathered.pop(module, None)  # the stand-in's kernels, gathered by on(module)
        for n in [n for n in sys.modules if _ours(n)]:
            del sys.modules[n]
        sys.modules.update(saved)
        for package, value in saved_attrs:
            if value is None:
                package.__dict__.pop("cuda", None)
            else:
                package.cuda = value
