"""The CUDA kernels of the expressions (expr.py): one CUDA C source generated from all of them,
a kernel file as the .cu files are (backend/cuda/runtime.py serves SOURCES beside them: NVRTC
compiles it, scripts/check_kernels.sh checks it, tests/cuda_on_cpu runs it).

Each expression is one kernel template over the storage type T, a thread per element as
elementwise.cu's: the inputs read and widened to acc_t<T> (a row vector at the element's column,
i % cols), each Op one line in the expression's order, each output rounded once. Its
TG_CHECK_INSTANTIATE list names every kernel in fp32, fp16, bf16 and fp64. No CuPy here:

    python -m tinygrad_like.kernels.elementwise.cuda_source DIR   # writes DIR/expressions.cu
"""

import sys
from pathlib import Path

from . import spec  # noqa: F401 (declares the expressions)
from .expr import COMPARISONS, EXPRESSIONS, Dialect, code

FILENAME = "expressions.cu"
TYPES = ("float", "__half", "__nv_bfloat16", "double")
CUDA = Dialect(
    "A({})",  # acc_t<T>
    {"exp": "tg_exp", "log": "tg_log", "sqrt": "tg_sqrt", "tanh": "tg_tanh", "erf": "tg_erf"},
    "{0} ? {1} : {2}",
)
_PRELUDE = """\
// Generated from the expressions of kernels/elementwise/spec.py by
// kernels/elementwise/cuda_source.py: do not edit. One thread per element of flat (n,) buffers,
// computed in acc_t<T> and rounded once, each line one operation of the formula in its order.
#include "common.cuh"

// erf in the compute type (common.cuh has the others)
__device__ __forceinline__ float tg_erf(float x) { return erff(x); }
__device__ __forceinline__ double tg_erf(double x) { return erf(x); }
"""


def kernel_source(e):
    """Expression e's kernel: template <typename T> __global__ void <name>(inputs, outputs,
    long long n[, long long cols])."""
    names = {i: f"in_{i.name}" for i in e.inputs}
    body = []
    for k, n in enumerate(e.ops):
        names[n] = f"t{k}"
        kind = "bool" if n.op in COMPARISONS else "A"
        body.append(f"const {kind} t{k} = {code(n, names, CUDA)};")
    outs = [f"out{k}" for k in range(len(e.outputs))]
    params = [f"const T* {i.name}" for i in e.inputs] + [f"T* {o}" for o in outs]
    params += ["long long n"] + (["long long cols"] if e.rows else [])
    loads = [
        f"const A in_{i.name} = to_acc({i.name}[{'i % cols' if i.row else 'i'}]);" for i in e.inputs
    ]
    stores = [f"{o}[i] = from_acc<T>({names[n]});" for o, n in zip(outs, e.outputs)]
    lines = ["typedef acc_t<T> A;", "const long long i = global_index();", "if (i >= n) return;"]
    lines += loads + body + stores
    inputs = ", ".join(i.name + (" (a row)" if i.row else "") for i in e.inputs)
    return (
        f"// {e.name}: ({inputs}) -> {len(outs)} output{'s' * (len(outs) > 1)}\n"
        f"template <typename T>\n__global__ void {e.name}({', '.join(params)}) {{\n"
        + "".join(f"    {s}\n" for s in lines)
        + "}\n"
    )


def source():
    """The whole file: every expression's kernel and the list of their instances."""
    kernels = [kernel_source(e) for e in EXPRESSIONS.values()]
    instances = [f"(void*)&{name}<{t}>," for name in EXPRESSIONS for t in TYPES]
    listing = (
        "#ifdef TG_CHECK_INSTANTIATE\n"
        "// Every variant cuda.py launches (runtime.py's instances(): NVRTC's name_expressions)\n"
        "void* tg_instances_expressions[] = {\n"
        + "".join(f"    {s}\n" for s in instances)
        + "};\n#endif\n"
    )
    return _PRELUDE + "\n" + "\n".join(kernels) + "\n" + listing


SOURCES = {FILENAME: source()}


if __name__ == "__main__":
    for filename, text in SOURCES.items():
        (Path(sys.argv[1]) / filename).write_text(text)
