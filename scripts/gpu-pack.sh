#!/usr/bin/env bash
# Prepares a build folder to travel to the GPU machine (device tool, `carry`): adds the OpenMP
# runtime and the Google Benchmark library that machine lacks. Usage: scripts/gpu-pack.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
mkdir -p "$build/runtime"
cp -L "$(g++ -print-file-name=libgomp.so.1)" "$build/runtime/"
# Google Benchmark (Debian names its soname libbenchmark.so.1debian) for bench/twblas-bench
for lib in /lib/x86_64-linux-gnu/libbenchmark.so.1*; do [ -e "$lib" ] && cp -L "$lib" "$build/runtime/"; done
du -sh "$build"
