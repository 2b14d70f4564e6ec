#!/usr/bin/env bash
# Runs on the lent GPU machine, over a build folder made here and carried along:
#   scripts/gpu-check.sh [BUILD_DIR]
# Reports the GPU, runs every test binary (CTest files hold this machine's absolute paths, so
# the binaries are run directly; CUDA tests under compute-sanitizer where present), then the
# demo on the default backend. Logs go to $OUT (or ./gpu-out without it).
set -uo pipefail
build=${1:-build}
out=${OUT:-gpu-out}
mkdir -p "$out"
# libtwblas and the OpenMP runtime travel in the build folder (scripts/gpu-pack.sh)
export LD_LIBRARY_PATH="$PWD/$build/src:$PWD/$build/runtime:${LD_LIBRARY_PATH:-}"
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv | tee "$out/gpu.txt"

for t in "$build"/tests/test_* "$build"/examples/ffn_example_c "$build"/examples/ffn_example_cpp; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  if [[ $name == test_cuda_* ]] && command -v compute-sanitizer >/dev/null; then
    compute-sanitizer --tool memcheck --error-exitcode 1 "$t" >"$out/$name.log" 2>&1
  else
    "$t" >"$out/$name.log" 2>&1
  fi
  rc=$?
  printf '%-28s %s\n' "$name" "$([ $rc -eq 0 ] && echo passed || echo "FAILED ($rc)")" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || { status=1; tail -n 30 "$out/$name.log"; }
done

"$build/tools/twblas-demo" --json "$out/demo.json" 2>&1 | tee "$out/demo.txt" || status=1

# one JSON record of the run: GPU, per-binary results, the demo's numbers
{
  echo '{'
  IFS=, read -r gpu driver clock mem < <(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader)
  printf '  "gpu": "%s", "driver": "%s", "max_sm_clock": "%s", "memory": "%s",\n' "$gpu" "${driver# }" "${clock# }" "${mem# }"
  printf '  "date": "%s",\n  "tests": {' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  sep=''
  while read -r name result; do printf '%s"%s": "%s"' "$sep" "$name" "$result"; sep=', '; done <"$out/summary.txt"
  printf '},\n  "demo": '
  cat "$out/demo.json" 2>/dev/null || echo 'null'
  echo '}'
} >"$out/gpu-check.json"
exit $status
