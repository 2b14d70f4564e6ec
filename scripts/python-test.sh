#!/usr/bin/env bash
# The Python package's tests (bindings/python, pytest) on the CPU backend: installs the library's
# build dependencies (scripts/deps.sh) and torch and pytest from PyPI when they are missing, builds
# the package (pip, scikit-build-core, CMake), then runs the tests from outside the tree so that the
# installed package is the one imported.
#   scripts/python-test.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
bash "$root/scripts/deps.sh"  # what libtwblas builds with (CMake, g++, Eigen)
if ! "$py" -m pip --version >/dev/null 2>&1; then
  echo "== installing python3-pip (apt) =="
  apt-get update -q && apt-get install -y python3-pip
fi
if ! "$py" -c "import torch, pytest" 2>/dev/null; then
  echo "== installing torch and pytest from PyPI (a few GB the first time) =="
  "$py" -m pip install --progress-bar off "torch>=2.4" pytest
fi
echo "== building the twblas Python package (CPU backend) =="
"$py" -m pip install --progress-bar off "$root/bindings/python" --config-settings=cmake.define.TWBLAS_WITH_CUDA=OFF
echo "== pytest bindings/python/tests =="
cd "$(mktemp -d)"
"$py" -m pytest -q "$root/bindings/python/tests"
