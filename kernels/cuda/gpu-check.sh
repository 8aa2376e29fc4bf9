#!/bin/sh
# gpu-check: checks that the CUDA backend builds, matches the CPU reference
# and runs its benchmark, on a machine with an NVIDIA GPU, from a fresh
# copy of the tree, in a few minutes:
#   1. builds the CUDA kernels and the GPU programs (make CUDA=1; only the
#      kernels and the engine, so the lab's ncurses / Lua packages are not
#      needed there);
#   2. runs the equivalence tests against the CPU reference;
#   3. runs the benchmark and prints its table.
# Stops with a clear message (exit 77) when no CUDA device is there, and
# with exit 1 when the build or a test fails.
#
#   sh kernels/cuda/gpu-check.sh            (from the repository root)
#   BUILD=build/gpu JOBS=16 sh kernels/cuda/gpu-check.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build/gpu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    PATH=/usr/local/cuda/bin:$PATH
    export PATH
fi
if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "gpu-check: nvcc not found (install the CUDA Toolkit or put it on PATH)" >&2
    exit 1
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu-check: GPU: /'
fi

start=$(date +%s)
echo "gpu-check: building ($BUILD, $JOBS jobs, $("$NVCC" --version | tail -n 1))"
if ! make -s CUDA=1 BUILD="$BUILD" -j"$JOBS" gpu-programs; then
    echo "gpu-check: FAILED: the build failed" >&2
    exit 1
fi
echo "gpu-check: built in $(($(date +%s) - start)) s"

echo "gpu-check: equivalence tests (GPU against the CPU reference)"
"$BUILD/tests/cuda/gpu_equivalence"
rc=$?
if [ "$rc" -eq 77 ]; then
    echo "gpu-check: STOPPED: no CUDA device on this machine; GPU tests NOT RUN" >&2
    exit 77
fi
if [ "$rc" -ne 0 ]; then
    echo "gpu-check: FAILED: equivalence tests (exit $rc); the benchmark still runs below" >&2
fi

echo "gpu-check: benchmark"
"$BUILD/tests/cuda/gpu_bench"
bench_rc=$?
echo "gpu-check: done in $(($(date +%s) - start)) s"
[ "$rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] || exit 1
exit 0
