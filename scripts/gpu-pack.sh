#!/usr/bin/env bash
# Prepares a build folder to travel to the GPU machine (device tool, `carry`): adds the OpenMP
# runtime that machine may lack. Usage: scripts/gpu-pack.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
mkdir -p "$build/runtime"
cp -L "$(g++ -print-file-name=libgomp.so.1)" "$build/runtime/"
du -sh "$build"
