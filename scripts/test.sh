#!/usr/bin/env bash
# Quick start, tests: builds twblas with every test, example and the Fortran module, then runs
# the whole suite with CTest (in parallel). Set TWBLAS_BUILD_DIR or pass extra CMake options in
# TWBLAS_CMAKE_ARGS (CI uses both for its sanitizer build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --tests
build=${TWBLAS_BUILD_DIR:-build}
mkdir -p "$build"
# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${TWBLAS_BUILD_TYPE:-Release} -DTWBLAS_BUILD_TESTS=ON \
  -DTWBLAS_BUILD_EXAMPLES=ON -DTWBLAS_BUILD_FORTRAN=ON ${TWBLAS_CMAKE_ARGS:-} >"$build/configure.log" ||
  { cat "$build/configure.log"; exit 1; }
# the CUDA note only where this build has the CUDA backend (the configure's choice, in its cache)
if grep -q '^TWBLAS_WITH_CUDA:BOOL=ON$' "$build/CMakeCache.txt"; then
  echo "twblas: building in $build with the CUDA backend (it takes several minutes on 2 cores)"
else
  echo "twblas: building in $build (CPU backend)"
fi
cmake --build "$build" -j"$(nproc)"
cd "$build"
# CTest prints each test's result line as it finishes; while tests run, a line every minute names
# the ones still running (the test programs CTest has started), so a long test is not silence.
ctest -j"$(nproc)" --output-on-failure --timeout 900 &
ctest_pid=$!
(
  while sleep 60; do
    kill -0 "$ctest_pid" 2>/dev/null || exit 0
    running=$(ps --ppid "$ctest_pid" -o args= 2>/dev/null |
      awk '{ p = ($1 ~ /(^|\/)(bash|sh|python3?)$/ && NF > 1) ? $2 : $1; n = split(p, a, "/"); printf "%s ", a[n] }')
    echo "twblas: tests still running after $SECONDS s: ${running:-(starting)}"
  done
) &
heartbeat=$!
trap 'kill "$heartbeat" 2>/dev/null || true' EXIT
rc=0
wait "$ctest_pid" || rc=$?
exit "$rc"
