#!/usr/bin/env bash
# Makes sure the Debian packages twblas builds with are installed: installs the missing ones when
# run as root, otherwise prints the exact apt-get line and fails. Sourced by demo.sh and test.sh.
#   deps.sh [--tests] [--fuzz]
#     --tests  adds what the test suite needs: Catch2, gfortran, pkg-config, and Google Benchmark
#              where nvcc is found (the bench is built only with CUDA); the ThreadSanitizer job,
#              scripts/tsan.sh, needs no more: g++ brings its runtime
#     --fuzz   adds what the fuzzers need (scripts/fuzz.sh): Clang and its runtimes (libFuzzer,
#              ASan, UBSan)
set -euo pipefail

packages=(cmake make g++ libeigen3-dev)
for arg in "$@"; do
  case "$arg" in
    --tests)
      packages+=(catch2 gfortran pkg-config)
      # the benchmark is built only with the CUDA backend
      command -v nvcc >/dev/null 2>&1 && packages+=(libbenchmark-dev)
      ;;
    --fuzz) packages+=(clang libclang-rt-dev) ;;
    *) echo "deps.sh: unknown option $arg (expected --tests or --fuzz)" >&2; exit 2 ;;
  esac
done

# the CUDA backend (built where nvcc is found) includes the CUTLASS / CuTe headers: the PyPI package
# nvidia-cutlass, headers only, into .deps/cutlass (CMake looks there)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cutlass_dir="$root/.deps/cutlass"
need_cutlass=0
if command -v nvcc >/dev/null 2>&1 && [[ ! -f "$cutlass_dir/cutlass_library/source/include/cute/arch/mma_sm80.hpp" ]]; then
  need_cutlass=1
  python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "twblas: installing ${missing[*]} (apt-get; this takes a minute the first time)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "twblas: missing packages; install them with:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
if [[ $need_cutlass -eq 1 ]]; then
  echo "twblas: installing the CUTLASS headers (PyPI nvidia-cutlass) into .deps/cutlass"
  # a folder of the project's own (--target), so no system environment is touched
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$cutlass_dir" nvidia-cutlass==4.2.0.0
fi
