#!/usr/bin/env bash
# Quick start, main job: builds twblas (Release) and runs the sparse-FFN demo on the default
# backend. Extra arguments go to the demo (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
build=${TWBLAS_BUILD_DIR:-build}
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTWBLAS_BUILD_TESTS=OFF -DTWBLAS_BUILD_EXAMPLES=ON \
  >"$build/configure.log" || { cat "$build/configure.log"; exit 1; }
echo "twblas: building the library and the demo in $build"
cmake --build "$build" -j"$(nproc)" --target twblas-demo
exec "$build/tools/twblas-demo" "$@"
