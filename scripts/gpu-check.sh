#!/usr/bin/env bash
# Runs on the lent GPU machine, over a build folder made here and carried along:
#   scripts/gpu-check.sh [BUILD_DIR]       (a folder made by scripts/gpu-pack.sh, e.g. build-gpu)
# Environment: TW_STAGES (default "tests sanitize bench demo"; "quick" runs only the Catch2 cases
# tagged [quick], which take every forward path and the training step, about a minute on an H100:
# the first check after a kernel change), TW_TESTS (test programs, a glob,
# default test_*), TW_SUITE (bench suite, default full), TW_BENCH_FILTER (Google Benchmark filter). Reports the GPU, runs every test binary
# (CTest files hold this machine's absolute paths, so the binaries are run directly; the CUDA
# ones, test_cuda_backend and test_cuda_training, exit with 77 when they find no usable GPU,
# which counts as a failure here), the CUDA tests again under compute-sanitizer (memcheck, and
# racecheck on the shared-memory users), the benchmark suite (JSON), then the demo. Logs go to
# $OUT (or ./gpu-out without it).
set -uo pipefail
build=${1:-build}
out=${OUT:-gpu-out}
stages=${TW_STAGES:-tests sanitize bench demo}
mkdir -p "$out"
# libtwblas and the OpenMP runtime travel in the build folder (scripts/gpu-pack.sh)
export LD_LIBRARY_PATH="$PWD/$build/src:$PWD/$build/runtime:${LD_LIBRARY_PATH:-}"
status=0
: >"$out/summary.txt"
: >"$out/tests.log"

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv | tee "$out/gpu.txt"

record() {  # name rc (77: a CUDA test program found no usable GPU, a failure here)
  local verdict=passed
  [ "$2" -eq 0 ] || verdict="FAILED ($2)"
  [ "$2" -eq 77 ] && verdict="FAILED (77: skipped, no usable GPU)"
  printf '%-40s %s\n' "$1" "$verdict" | tee -a "$out/summary.txt"
  [ "$2" -eq 0 ] || status=1
}

if [[ $stages == *tests* ]]; then
  for t in "$build"/tests/${TW_TESTS:-test_*} "$build"/examples/ffn_example_c "$build"/examples/ffn_example_cpp; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    "$t" >"$out/log.txt" 2>&1
    rc=$?
    record "$name" $rc
    { echo "==== $name"; cat "$out/log.txt"; } >>"$out/tests.log"
    [ $rc -eq 0 ] || tail -n 40 "$out/log.txt"
  done
fi

if [[ $stages == *quick* ]]; then
  # the cases tagged [quick]: every forward path, pinned and chosen, and the training step
  "$build/tests/test_cuda_backend" "[quick]" >"$out/quick-backend.log" 2>&1
  rc=$?; record "test_cuda_backend (quick)" $rc; [ $rc -eq 0 ] || tail -n 40 "$out/quick-backend.log"
  "$build/tests/test_cuda_training" "[quick]" >"$out/quick-training.log" 2>&1
  rc=$?; record "test_cuda_training (quick)" $rc; [ $rc -eq 0 ] || tail -n 40 "$out/quick-training.log"
fi

if [[ $stages == *sanitize* ]] && command -v compute-sanitizer >/dev/null; then
  # Catch2 test specs: patterns in one argument separated by commas are OR'd, separate
  # arguments are AND'd (so "~a" "~b" leaves out both). Case names: tests/test_ffn_forward.cpp,
  # test_building_blocks.cpp, test_ffn_backward.cpp (shared with the CPU programs) and
  # test_cuda_backend.cpp, test_cuda_training.cpp (CUDA only).
  t="$build/tests/test_cuda_backend"
  compute-sanitizer --tool memcheck --error-exitcode 1 "$t" >"$out/memcheck.log" 2>&1
  rc=$?; record "memcheck test_cuda_backend" $rc; [ $rc -eq 0 ] || tail -n 40 "$out/memcheck.log"
  # racecheck on the shared-memory users: heavy rows, serving sizes, FP8 weights, determinism, graphs, building blocks
  # (cuBLAS's own nvjet kernels, which the serving sizes call, report hazards of their own: only
  # hazards in twblas's kernels, or a failed test, fail this step)
  compute-sanitizer --tool racecheck "$t" \
    "forward: heavy rows*,forward: serving*,CUDA FFN: the serving path with rows of hundreds*,CUDA FFN: heavy rows*,CUDA FFN: TW_COMPUTE_FP8*,forward: deterministic*,CUDA FFN: graph capture*,building blocks:*" \
    >"$out/racecheck.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -A1 "Race reported" "$out/racecheck.log" | grep -q "twblas::"; then rc=1; fi
  record "racecheck test_cuda_backend" $rc; [ $rc -eq 0 ] || tail -n 40 "$out/racecheck.log"
  # training: every case but the 70001-token one and the finite differences (slow under the tool)
  t="$build/tests/test_cuda_training"
  compute-sanitizer --tool memcheck --error-exitcode 1 "$t" "~*65536 tokens*" "~*finite differences*" \
    >"$out/memcheck-train.log" 2>&1
  rc=$?; record "memcheck test_cuda_training" $rc; [ $rc -eq 0 ] || tail -n 40 "$out/memcheck-train.log"
  compute-sanitizer --tool racecheck --error-exitcode 1 "$t" \
    "training: small-integer*,training: deterministic*,CUDA training: a replayed CUDA graph*" \
    >"$out/racecheck-train.log" 2>&1
  rc=$?; record "racecheck test_cuda_training" $rc; [ $rc -eq 0 ] || tail -n 40 "$out/racecheck-train.log"
  # conversions: all but the million-row case (minutes under the tool)
  t="$build/tests/test_cuda_conversions"
  compute-sanitizer --tool memcheck --error-exitcode 1 "$t" "~[large]" >"$out/memcheck-conv.log" 2>&1
  rc=$?; record "memcheck test_cuda_conversions" $rc; [ $rc -eq 0 ] || tail -n 40 "$out/memcheck-conv.log"
fi

if [[ $stages == *bench* ]]; then
  "$build/bench/twblas-bench" --suite="${TW_SUITE:-full}" --benchmark_filter="${TW_BENCH_FILTER:-.}" \
    --benchmark_out="$out/bench.json" --benchmark_out_format=json >"$out/bench.txt" 2>&1
  rc=$?; record "twblas-bench (${TW_SUITE:-full})" $rc
  grep -E "median|ERROR" "$out/bench.txt" | cut -c1-150
fi

if [[ $stages == *demo* ]]; then
  "$build/tools/twblas-demo" --json "$out/demo.json" 2>&1 | tee "$out/demo.txt"
  record "twblas-demo" "${PIPESTATUS[0]}"
fi
rm -f "$out/log.txt"
exit $status
