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
echo "twblas: building in $build (the CUDA backend takes several minutes on 2 cores)"
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest -j"$(nproc)" --output-on-failure --timeout 900
