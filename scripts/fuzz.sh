#!/usr/bin/env bash
# CI: builds the libFuzzer fuzzers of tests/fuzz with Clang (CPU backend, ASan + UBSan, no
# OpenMP) in their own folder, then runs each for a bounded time on a copy of its seed corpus
# (tests/fuzz/corpus/<fuzzer>). Fails on any finding: a crash, a sanitizer report, a failed
# check, a leak, an input running over 10 s. Findings are saved under
# <build>/fuzz-work/<fuzzer>/artifacts; replay one with `<build>/tests/fuzz/<fuzzer> FILE`.
#   TWBLAS_FUZZ_SECONDS  seconds per fuzzer (default 60)
#   TWBLAS_FUZZERS       the fuzzers to run (default: all four)
#   TWBLAS_BUILD_DIR     build folder (default build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --fuzz
build=${TWBLAS_BUILD_DIR:-build-fuzz}
seconds=${TWBLAS_FUZZ_SECONDS:-60}
fuzzers=${TWBLAS_FUZZERS:-fuzz_sparse_raw fuzz_sparse_mutated fuzz_ffn fuzz_saved_state}

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DTWBLAS_WITH_CUDA=OFF -DTWBLAS_WITH_OPENMP=OFF \
  -DTWBLAS_BUILD_FUZZERS=ON -DTWBLAS_BUILD_TESTS=OFF -DTWBLAS_BUILD_EXAMPLES=OFF \
  -DTWBLAS_BUILD_BENCH=OFF -DTWBLAS_BUILD_FORTRAN=OFF -DTWBLAS_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target twblas_fuzzers

# libFuzzer handles the sanitizers' reports itself; CI's ASan settings for the test suite do not apply
unset ASAN_OPTIONS
export UBSAN_OPTIONS=print_stacktrace=1
work="$build/fuzz-work"
rm -rf "$work"
passed=0
failed=()
for f in $fuzzers; do
  mkdir -p "$work/$f/corpus" "$work/$f/artifacts"
  log="$work/$f/log"
  start=$(date +%s)
  if "$build/tests/fuzz/$f" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$work/$f/artifacts/" \
       "$work/$f/corpus" "tests/fuzz/corpus/$f" >"$log" 2>&1; then
    verdict="no finding"
    passed=$((passed + 1))
  else
    verdict="FINDING"
    failed+=("$f")
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  echo "$f: $verdict, ${execs:-?} executions in $(($(date +%s) - start)) s"
  if [[ $verdict == FINDING ]]; then
    grep -E '^(twfuzz: check failed|==[0-9]+==ERROR|SUMMARY)' "$log" | head -5 || true
    tail -n 40 "$log"
    ls "$work/$f/artifacts"
  fi
done
echo "fuzzers: ${passed} passed, ${#failed[@]} failed"
[[ ${#failed[@]} -eq 0 ]]
