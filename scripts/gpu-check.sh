#!/usr/bin/env bash
# Runs on the lent GPU machine, over a build folder made here and carried along:
#   scripts/gpu-check.sh [BUILD_DIR]
# Reports the GPU, runs the test suite (the CUDA tests under compute-sanitizer where present),
# then the demo on the default backend, writing logs to $OUT (or ./gpu-out without it).
set -uo pipefail
build=${1:-build}
out=${OUT:-gpu-out}
mkdir -p "$out"
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv | tee "$out/gpu.txt"

# The suite minus the tests that need a compiler or CMake on the machine (the package consumer).
(cd "$build" && ctest -j8 --output-on-failure -E 'consumer' 2>&1) | tee "$out/ctest.log" || status=1

if command -v compute-sanitizer >/dev/null; then
  for t in "$build"/tests/test_cuda_*; do
    [ -x "$t" ] || continue
    compute-sanitizer --tool memcheck --error-exitcode 1 "$t" 2>&1 | tail -n 5 | tee -a "$out/sanitizer.log" || status=1
  done
fi

"$build/tools/twblas-demo" 2>&1 | tee "$out/demo.txt" || status=1
exit $status
