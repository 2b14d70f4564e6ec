#!/usr/bin/env bash
# Makes sure the Debian packages twblas builds with are installed: installs the missing ones when
# run as root, otherwise prints the exact apt-get line and fails. Sourced by demo.sh and test.sh.
#   deps.sh [--tests]   (--tests adds what the test suite and bench need: Catch2, gfortran,
#                        pkg-config, Google Benchmark)
set -euo pipefail

packages=(cmake make g++ libeigen3-dev)
if [[ "${1:-}" == "--tests" ]]; then
  packages+=(catch2 gfortran pkg-config libbenchmark-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $(id -u) -eq 0 ]]; then
  echo "twblas: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "twblas: missing packages; install them with:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
