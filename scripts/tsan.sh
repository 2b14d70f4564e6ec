#!/usr/bin/env bash
# CI: the threading tests (tests/test_threads.cpp) under ThreadSanitizer. CPU backend, no OpenMP
# (libgomp is not instrumented: its reports would be false positives), RelWithDebInfo for
# readable reports. Builds only the library and test_threads, in its own folder.
#   TWBLAS_BUILD_DIR  build folder (default build-tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --tests
build=${TWBLAS_BUILD_DIR:-build-tsan}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTWBLAS_WITH_CUDA=OFF \
  -DTWBLAS_SANITIZE_THREAD=ON -DTWBLAS_WITH_OPENMP=OFF -DTWBLAS_WERROR=ON \
  -DTWBLAS_BUILD_TESTS=ON -DTWBLAS_BUILD_EXAMPLES=OFF -DTWBLAS_BUILD_BENCH=OFF \
  -DTWBLAS_BUILD_FORTRAN=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target test_threads
# halt_on_error: the first race fails the run; second_deadlock_stack for lock-order reports
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:exitcode=66${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
cd "$build"
ctest -R '^test_threads$' --output-on-failure --timeout 900
