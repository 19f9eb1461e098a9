"""The project's CUDA kernels executed on the CPU: each .cu source (as cuda/runtime.py hands it to
NVRTC) compiled with the C++ compiler against cuda_cpu.h (and gemm.cu's PTX against
ptx_on_cpu.h), one shared library per source, and its instances called through ctypes on the
arrays' own buffers. tests/fake_cupy.py calls launch() after checking a launch, so what runs is
the CUDA backend's own launch code.

A launch runs its blocks one after another; a block's threads are fibers that switch at
__syncthreads and at warp collectives (see cuda_cpu.h), in a thread order per block:
TG_CUDA_CPU_ORDER=forward|reverse|shuffle, or cycle (the default: block b of the n-th launch
uses order (b + n) % 3, so every launch of three blocks or more sees all three). forward and
reverse run warp by warp, each warp as far as it gets before the next; shuffle runs all the
threads in a random order drawn anew between barriers. TG_CUDA_CPU_SEED offsets n.

The source goes through two rewrites before the compiler: every `__shared__` declaration becomes
a reference into the block's shared memory (static variables: tg::shared_var, one per
declaration and template instance; `extern __shared__` arrays: the dynamic buffer), and a table
of the instances (NVRTC's name expressions) is appended for launch() to call.

Libraries are cached by content (the source, the headers, the flags and the compiler's version)
under $TG_CUDA_CPU_CACHE (default: <tmp>/tg_cuda_on_cpu-<uid>), so a test session builds each
source once. TG_CUDA_CPU_ASAN=1 builds with AddressSanitizer, which catches out-of-bounds global
accesses; the sanitizer's runtime must then be loaded first (see asan_environment()).
"""

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).parent
HEADERS = ("cuda_cpu.h", "ptx_on_cpu.h", "cuda_fp16.h", "cuda_bf16.h")
ORDERS = {"forward": 0, "reverse": 1, "shuffle": 2, "cycle": 3}
FLAGS = (
    "-std=c++17",
    "-O1",
    "-fPIC",
    "-shared",
    "-ffp-contract=off",  # each operation rounded on its own (the GPU would contract to FMAs)
    "-fno-strict-aliasing",
    "-U_FORTIFY_SOURCE",  # its longjmp check refuses jumps between stacks
    "-Wno-unknown-pragmas",  # #pragma unroll
    "-DTG_CUDA_ON_CPU",
)
ASAN_FLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer")


class KernelError(RuntimeError):
    """A kernel that failed while running: a deadlock, a bad warp collective, an access past
    shared memory, a fault, a misaligned cp.async, ..."""


def compiler():
    """The C++ compiler ($CXX, else g++ or c++ on PATH), or None."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    return cxx if cxx and shutil.which(cxx) else None


def available():
    return compiler() is not None


def asan():
    return os.environ.get("TG_CUDA_CPU_ASAN", "") not in ("", "0")


def asan_environment():
    """The environment a process needs to load AddressSanitizer builds (LD_PRELOAD of the
    compiler's libasan; leaks not reported: Python's allocations are not ours)."""
    lib = subprocess.run(
        [compiler(), "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return {
        "LD_PRELOAD": lib,
        "ASAN_OPTIONS": "detect_leaks=0:allow_user_segv_handler=1",
        "TG_CUDA_CPU_ASAN": "1",
    }


def cache_dir():
    d = os.environ.get("TG_CUDA_CPU_CACHE") or os.path.join(
        tempfile.gettempdir(), f"tg_cuda_on_cpu-{os.getuid()}"
    )
    os.makedirs(d, exist_ok=True)
    return Path(d)


# ---------------------------------------------------------------- the source rewrites

# a declaration at the start of a line: [extern] __shared__ [__align__(n)] type declarators;
_SHARED = re.compile(
    r"^([ \t]*)(extern\s+)?__shared__\s+(?:__align__\s*\(\s*(\d+)\s*\)\s*)?([^;]*);", re.M
)
_DECLARATOR = re.compile(r"(\w+)\s*((?:\[[^\]]*\]\s*)*)$")
_KEY = "[] { static const char key = 0; return (const void*)&key; }()"


def _split_top(text):
    """text split at the commas outside brackets and parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([<" and 1 or ch in ")]>" and -1 or 0
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _shared_declaration(m):
    indent, extern, align, decl = m[1], m[2], int(m[3] or 16), m[4].strip()
    declarators = _split_top(decl)
    first = _DECLARATOR.search(declarators[0].strip())
    if first is None:
        raise ValueError(f"cannot read the __shared__ declaration {m[0]!r}")
    ctype = declarators[0].strip()[: first.start()].strip()
    out = []
    for d in declarators:
        dm = _DECLARATOR.fullmatch(d.strip()) if d is not declarators[0] else first
        if dm is None or not ctype:
            raise ValueError(f"cannot read the __shared__ declaration {m[0]!r}")
        name, dims = dm[1], "".join(dm[2].split())
        if extern:
            if dims != "[]" or len(declarators) != 1:
                raise ValueError(f"extern __shared__ must be one unsized array: {m[0]!r}")
            out.append(f"{ctype}* const {name} = reinterpret_cast<{ctype}*>(tg::dynamic_shared())")
        elif dims:
            out.append(f"{ctype} (&{name}){dims} = tg::shared_var<{ctype}{dims}>({_KEY}, {align})")
        else:
            out.append(f"{ctype}& {name} = tg::shared_var<{ctype}>({_KEY}, {align})")
    return indent + "; ".join(out) + ";"


def translate(source, names):
    """The C++ text for a CUDA source and its instances (name expressions, e.g. gemm_tc<__half,
    false,true,true>): the header first, __shared__ declarations rewritten, the table after."""
    body = _SHARED.sub(_shared_declaration, source)
    table = ",\n".join(f'    tg::instance("{n}", &{n})' for n in names)
    return (
        '#include "cuda_cpu.h"\n'
        f"{body}\n\n"
        "// ---- the instances (tests/cuda_on_cpu)\n"
        f"static const tg::Instance tg_table[] = {{\n{table}\n}};\n"
        'extern "C" int tg_count() { return sizeof tg_table / sizeof tg_table[0]; }\n'
        'extern "C" const char* tg_name(int i) { return tg_table[i].name; }\n'
        'extern "C" int tg_nparams(int i) { return tg_table[i].nparams; }\n'
        'extern "C" int tg_param_size(int i, int j) { return tg_table[i].sizes[j]; }\n'
        'extern "C" const char* tg_error() { return tg::error; }\n'
        'extern "C" int tg_launch(int i, const unsigned* grid, const unsigned* block,\n'
        "                         unsigned long long shared, void** args, int order,\n"
        "                         unsigned long long seed) {\n"
        "    return tg::launch(tg_table[i], grid, block, shared, args, order, seed);\n"
        "}\n"
    )


# ---------------------------------------------------------------- building and loading


def _key(text, flags):
    h = hashlib.sha256()
    for part in [text, " ".join(flags), _compiler_version()] + [
        (HERE / name).read_text() for name in HEADERS
    ]:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


_VERSION = {}


def _compiler_version():
    cxx = compiler()
    if cxx not in _VERSION:
        _VERSION[cxx] = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    return _VERSION[cxx]


def _flags():
    return FLAGS + (ASAN_FLAGS if asan() else ())


def _job(source, names):
    """-> (the library's path, the command that builds it, its C++ text) for a source."""
    text, flags = translate(source, names), _flags()
    path = cache_dir() / f"{_key(text, flags)}{'-asan' if asan() else ''}.so"
    return path, text, [compiler(), *flags, f"-I{HERE}", "-x", "c++", "-", "-o"]


def build(jobs):
    """Build the libraries of [(source, names)] not yet in the cache, all at once (one compiler
    process each). -> their paths. Raises RuntimeError with the compiler's messages."""
    if not available():
        raise RuntimeError("no C++ compiler (g++ or $CXX) to build the CUDA kernels for the CPU")
    paths, running = [], []
    for source, names in jobs:
        path, text, command = _job(source, names)
        paths.append(path)
        if path.exists() or any(p == path for p, *_ in running):
            continue
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        proc = subprocess.Popen(
            command + [str(tmp)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        proc.stdin.write(text)
        proc.stdin.close()
        running.append((path, tmp, proc))
    errors = []
    for path, tmp, proc in running:
        log = proc.stdout.read()
        if proc.wait() != 0:
            errors.append(log)
            tmp.unlink(missing_ok=True)
        else:
            os.replace(tmp, path)  # atomic: a concurrent session sees a whole library or none
    if errors:
        raise RuntimeError("building a CUDA source for the CPU failed:\n" + "\n".join(errors))
    return paths


class Library:
    """One built source: its instances by name, launch() to run one."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.tg_name.restype = ctypes.c_char_p
        self.lib.tg_error.restype = ctypes.c_char_p
        self.lib.tg_launch.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_uint),
            ctypes.POINTER(ctypes.c_uint),
            ctypes.c_ulonglong,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_ulonglong,
        ]
        self.index = {self.lib.tg_name(i).decode(): i for i in range(self.lib.tg_count())}

    def param_sizes(self, name):
        i = self.index[name]
        return [self.lib.tg_param_size(i, j) for j in range(self.lib.tg_nparams(i))]

    def launch(self, name, grid, block, shared_mem, args, order, seed):
        """Run instance `name`; args: each parameter's bytes (a pointer's 8, a scalar's own)."""
        sizes = self.param_sizes(name)
        if [len(a) for a in args] != sizes:
            raise KernelError(
                f"{name}: argument sizes {[len(a) for a in args]} but the compiled kernel's "
                f"parameters take {sizes}"
            )
        slots = (ctypes.c_uint64 * max(1, len(args)))()
        for i, a in enumerate(args):
            ctypes.memmove(ctypes.addressof(slots) + 8 * i, a, len(a))
        ptrs = (ctypes.c_void_p * max(1, len(args)))(
            *[ctypes.addressof(slots) + 8 * i for i in range(len(args))]
        )
        dims = [tuple(d) + (1,) * (3 - len(d)) for d in (grid, block)]
        status = self.lib.tg_launch(
            self.index[name],
            (ctypes.c_uint * 3)(*dims[0]),
            (ctypes.c_uint * 3)(*dims[1]),
            shared_mem,
            ptrs,
            order,
            seed,
        )
        if status:
            raise KernelError(f"{name} {dims[0]} x {dims[1]}: {self.lib.tg_error().decode()}")


_LIBRARIES = {}  # path -> Library
_LOCK = threading.Lock()
_LAUNCHES = [0]


def library(source, names):
    """The Library of a source with these instances, built if not in the cache."""
    with _LOCK:
        (path,) = build([(source, tuple(names))])
        if path not in _LIBRARIES:
            _LIBRARIES[path] = Library(path)
        return _LIBRARIES[path]


def order():
    name = os.environ.get("TG_CUDA_CPU_ORDER", "cycle")
    if name not in ORDERS:
        raise ValueError(f"TG_CUDA_CPU_ORDER={name!r}: use one of {', '.join(ORDERS)}")
    return ORDERS[name]


def launch(source, names, name, grid, block, shared_mem, args):
    """Run instance `name` of a CUDA source (compiled with the instances `names`) over grid x
    block threads; args: each parameter's bytes. The order of the threads: order() (see the
    module's docstring); the n-th launch of the process gets seed n + $TG_CUDA_CPU_SEED."""
    lib = library(source, names)
    with _LOCK:
        _LAUNCHES[0] += 1
        seed = _LAUNCHES[0] + int(os.environ.get("TG_CUDA_CPU_SEED", "0"))
        lib.launch(name, grid, block, shared_mem, args, order(), seed)
