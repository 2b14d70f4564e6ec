#!/usr/bin/env bash
# Runs on the lent GPU machine: where the time of one benchmark point goes, kernel by kernel.
#   scripts/gpu-profile.sh BUILD_DIR FILTER [FILTER ...]
# Each FILTER is a Google Benchmark filter naming one point (for example
# 'ffn/twblas/d2048_h5632/uniform-29/m1/'); Nsight Compute times the kernels of its first
# graph replays (caches left as the graph leaves them: TW_PROFILE_CACHE=all flushes them before each kernel)
# and the table gives, per kernel name, the launches seen and the median duration.
# Output: $OUT/profile-<n>.csv (raw) and $OUT/profile.txt (tables).
set -uo pipefail
build=$1
shift
out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$build/src:$PWD/$build/runtime:${LD_LIBRARY_PATH:-}"
n=0
for filter in "$@"; do
  n=$((n + 1))
  # the warm-up and verification launch a few hundred kernels first; skip them
  ncu --clock-control none --cache-control "${TW_PROFILE_CACHE:-none}" --metrics gpu__time_duration.sum --csv --page raw \
      --launch-skip "${TW_PROFILE_SKIP:-400}" --launch-count "${TW_PROFILE_COUNT:-120}" \
      "$build/bench/twblas-bench" --suite="${TW_SUITE:-decode}" --benchmark_filter="$filter" \
      >"$out/profile-$n.csv" 2>"$out/profile-$n.err"
  python3 scripts/profile-table.py "$filter" "$out/profile-$n.csv" | tee -a "$out/profile.txt"
done
