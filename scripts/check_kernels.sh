#!/usr/bin/env bash
# Compile-check every CUDA kernel file without a GPU.
#
# 1. nvcc: each family's tinygrad_like/kernels/<family>/<family>.cu, and each source a family
#    generates (kernels/<family>/cuda_source.py, written to a temporary folder: elementwise's
#    expressions.cu), for sm_80 and sm_90, with -DTG_CHECK_INSTANTIATE so the instance list at
#    the bottom of each file makes nvcc compile every template variant the backend launches.
#    Needs nvcc on PATH (or $NVCC).
# 2. NVRTC (the compiler the backend really uses, through CuPy): each file exactly as cuda/runtime.py
#    builds it (common.cuh pasted in, the same name expressions), for sm_80 and sm_90. Runs when
#    Python can load CuPy's NVRTC binding; skipped with a note otherwise.
#
# The checks run side by side, as many at once as there are cores (the NVRTC pass beside the
# nvcc ones); prints one line per file and check, in order, once all have ended; exits
# non-zero if anything fails.
set -u
cd "$(dirname "$0")/.."
KDIR=tinygrad_like/kernels
COMMON=tinygrad_like/backend/cuda  # common.cuh, which every .cu includes
NVCC=${NVCC:-nvcc}
PYTHON=${PYTHON:-python}
ARCHS="80 90"
status=0

if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "FAIL nvcc not found (set NVCC=/path/to/nvcc)"
    exit 1
fi

GENERATED=$(mktemp -d)
trap 'rm -rf "$GENERATED"' EXIT
for g in "$KDIR"/*/cuda_source.py; do
    family=$(basename "$(dirname "$g")")
    if ! "$PYTHON" -m "tinygrad_like.kernels.$family.cuda_source" "$GENERATED"; then
        echo "FAIL generate $g"
        status=1
    fi
done

check_nvrtc() {  # every kernel file as cuda/runtime.py builds it, for each arch
    "$PYTHON" - "$CUDA_INCLUDE" $ARCHS <<'EOF'
import sys

try:
    from cupy_backends.cuda.libs import nvrtc
    nvrtc.getVersion()
    from tinygrad_like.backend import cuda
except Exception as e:  # no CuPy, or no libnvrtc: nvcc's check above still stands
    print(f"skip nvrtc ({type(e).__name__}: {e})")
    sys.exit(0)

include, archs = sys.argv[1], sys.argv[2:]
failed = False
for name in cuda.kernel_files():
    source = cuda.kernel_source(name)
    names = cuda.instances(source)
    for arch in archs:
        prog = nvrtc.createProgram(source, name, (), ())
        try:
            for n in names:
                nvrtc.addNameExpression(prog, n)
            # the options CuPy adds for a RawModule, plus the header path
            nvrtc.compileProgram(prog, ("-std=c++17", "-ftz=true", "--device-as-default-execution-space",
                                        f"-arch=sm_{arch}", f"-I{include}"))
            for n in names:
                nvrtc.getLoweredName(prog, n)
            print(f"ok   nvrtc sm_{arch} {name} ({len(names)} instances)")
        except nvrtc.NVRTCError:
            failed = True
            print(f"FAIL nvrtc sm_{arch} {name}")
            print("\n".join("     " + line for line in nvrtc.getProgramLog(prog).splitlines()))
        finally:
            nvrtc.destroyProgram(prog)
sys.exit(1 if failed else 0)
EOF
}

RESULTS=$GENERATED/results  # each check's lines, named in the order they print
mkdir "$RESULTS"
JOBS=$(nproc 2>/dev/null || echo 1)

check_nvcc() {  # $1 the .cu file, $2 the arch -> its line, and nvcc's log if it fails
    if log=$("$NVCC" -std=c++17 -arch=sm_$2 -DTG_CHECK_INSTANTIATE -I"$COMMON" \
             -c -o /dev/null "$1" 2>&1); then
        echo "ok   nvcc  sm_$2 $(basename "$1")"
    else
        echo "FAIL nvcc  sm_$2 $(basename "$1")"
        echo "$log" | sed 's/^/     /'
    fi
}

# CUDA headers for NVRTC (cuda_fp16.h, cuda_bf16.h): the include directory nvcc itself uses.
CUDA_INCLUDE=$("$NVCC" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 \
               | sed -n 's/^#\$ INCLUDES="-I\([^"]*\)".*/\1/p' | head -1 | sed 's/ *$//')
(check_nvrtc > "$RESULTS/9999-nvrtc" 2>&1; echo $? > "$GENERATED/nvrtc_status") &

n=0
for f in "$KDIR"/*/*.cu "$GENERATED"/*.cu; do
    for arch in $ARCHS; do
        n=$((n + 1))
        while [ "$(jobs -rp | wc -l)" -gt "$JOBS" ]; do wait -n; done  # the NVRTC pass and JOBS
        check_nvcc "$f" "$arch" > "$RESULTS/$(printf %04d $n)-nvcc" 2>&1 &
    done
done
wait
if [ "$(cat "$GENERATED/nvrtc_status")" != 0 ]; then status=1; fi
cat "$RESULTS"/*
if grep -q '^FAIL nvcc' "$RESULTS"/*-nvcc; then status=1; fi

if [ $status -ne 0 ]; then echo "check_kernels: FAILED"; else echo "check_kernels: all passed"; fi
exit $status
