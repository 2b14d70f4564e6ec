#!/usr/bin/env bash
# Prepares what travels to the GPU machine (device tool, `carry`): the binaries and libraries of a
# build folder (no object files), the OpenMP runtime and the Google Benchmark library that
# machine lacks, in the same layout, so scripts/gpu-check.sh runs on it unchanged.
#   scripts/gpu-pack.sh [BUILD_DIR [OUT_DIR]]      (default build -> build-gpu)
set -euo pipefail
build=${1:-build}
out=${2:-build-gpu}
# brought up to date first: a pack of stale binaries measures code that is not in the tree
cmake --build "$build" -j"${TW_JOBS:-2}" >/dev/null
rm -rf "$out"
mkdir -p "$out/runtime" "$out/src" "$out/tests" "$out/bench" "$out/tools" "$out/examples"
cp -a "$build"/src/libtwblas.so* "$out/src/"
for f in "$build"/tests/test_* "$build"/bench/twblas-bench "$build"/tools/twblas-demo "$build"/examples/ffn_example_c \
         "$build"/examples/ffn_example_cpp; do
  [ -f "$f" ] && [ -x "$f" ] && cp -a "$f" "$out/${f#"$build"/}"
done
cp -L "$(g++ -print-file-name=libgomp.so.1)" "$out/runtime/"
# Google Benchmark (Debian names its soname libbenchmark.so.1debian) for bench/twblas-bench
for lib in /lib/x86_64-linux-gnu/libbenchmark.so.1*; do [ -e "$lib" ] && cp -L "$lib" "$out/runtime/"; done
du -sh "$out"
