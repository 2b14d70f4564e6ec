#!/usr/bin/env bash
# A libtwblas variant for a same-call A/B on the GPU machine (scripts/gpu-ab.sh): the named
# device sources recompiled with extra defines (sm_90 only: the variant is for timing on an
# H100), linked with every other object of an existing build. Minutes instead of a second full
# build; the variant's folder holds only src/libtwblas.so*.
#   scripts/variant-lib.sh BUILD_DIR OUT_DIR "DEFINES" SOURCE...
#   e.g. scripts/variant-lib.sh build build-var-a "-DTWBLAS_SERVE_GATE_CHUNKS=4" device/ffn_forward.cu
# Name every source that includes a header whose types differ between the two trees (a class's
# members, a kernel's arguments): objects compiled against another layout of the same class break
# at run time (a baseline of container_ops.cu alone, after ContainerOps gained members, failed in
# the benchmark with "invalid argument"; container_ops.cu and backend_cuda.cu together ran).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd) out=$2 defines=$3
shift 3
mkdir -p "$out/src"
out=$(cd "$out" && pwd)
objs="$build/src/CMakeFiles/twblas_objects.dir"
flags="$objs/flags.make"
get() { sed -n "s/^$1 = //p" "$flags"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
link=$(cat "$build/src/CMakeFiles/twblas.dir/link.txt")
hopper="$build/src/CMakeFiles/twblas_hopper_objects.dir"
for src in "$@"; do
  # the Hopper-only sources (src/CMakeLists.txt: twblas_hopper_objects) keep their own defines and sm_90a
  dir=twblas_objects.dir arch="compute_90,code=[sm_90]" defs=$(get CUDA_DEFINES)
  if [ -f "$hopper/$src.o" ]; then
    dir=twblas_hopper_objects.dir arch="compute_90a,code=[sm_90a]"
    defs=$(sed -n "s/^CUDA_DEFINES = //p" "$hopper/flags.make")
  fi
  obj="$build/src/CMakeFiles/$dir/$src.o"
  [ -f "$obj" ] || { echo "no object $obj in $build" >&2; exit 1; }
  (cd "$build/src" && eval /usr/local/cuda/bin/nvcc -forward-unknown-to-host-compiler "$defs" $defines \
      --options-file "CMakeFiles/$dir/includes_CUDA.rsp" -O3 -DNDEBUG --generate-code=arch=$arch \
      -Xcompiler=-fPIC -std=c++17 -x cu -c "$root/src/$src" -o "$work/$(basename "$src").o")
  link=${link//CMakeFiles\/$dir\/$src.o/$work\/$(basename "$src").o}
done
# link.txt runs from build/src and names its output libtwblas.so.0.1.0 there: write it to OUT
link=${link//-o libtwblas.so.0.1.0/-o $out/src/libtwblas.so.0.1.0}
(cd "$build/src" && eval "$link")
ln -sf libtwblas.so.0.1.0 "$out/src/libtwblas.so.0"
ln -sf libtwblas.so.0 "$out/src/libtwblas.so"
ls -la "$out/src"
