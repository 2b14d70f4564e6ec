#!/usr/bin/env bash
# The Python package's tests (bindings/python, pytest) on the CPU backend: installs the library's
# build dependencies (scripts/deps.sh), then, in a virtual environment (Debian's system Python is
# externally managed, PEP 668), torch (the CPU build from PyTorch's index, else PyPI's), pytest,
# transformers, scikit-build-core and ninja; builds the package with --no-build-isolation (its ops
# are compiled against that torch) and runs the tests from outside the tree, so that the installed
# package is the one imported; then the README's Python program.
#   scripts/python-test.sh
#     PYTHON=python3 scripts/python-test.sh   that Python and its environment instead of a venv
#     TWBLAS_PYTHON_VENV=DIR                  the venv's folder (default build/python-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/deps.sh"  # what libtwblas builds with (CMake, g++, Eigen)

apt_install() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "python-test.sh: needs $* (apt-get install -y $*)" >&2
    exit 1
  fi
  apt-get update -q && apt-get install -y "$@"
}

if [[ -n "${PYTHON:-}" ]]; then
  py=$PYTHON
  if ! "$py" -m pip --version >/dev/null 2>&1; then
    echo "== installing python3-pip (apt) =="
    apt_install python3-pip
  fi
else
  venv=${TWBLAS_PYTHON_VENV:-$root/build/python-venv}
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "== creating a virtual environment in $venv =="
    mkdir -p "$(dirname "$venv")"
    if ! python3 -m venv "$venv" 2>/dev/null; then
      rm -rf "$venv"
      apt_install python3-venv
      python3 -m venv "$venv"
    fi
  fi
  py=$venv/bin/python
fi
pip=("$py" -m pip install --progress-bar off)
# torch.compile's CPU backend (inductor, tested here) compiles C++ that includes Python.h
[[ -f "$("$py" -c 'import sysconfig; print(sysconfig.get_path("include"))')/Python.h" ]] || apt_install python3-dev

if ! "$py" -c "import torch" 2>/dev/null; then
  echo "== installing torch (CPU build; a few hundred MB the first time) =="
  # PyTorch's own index holds the CPU-only wheels; PyPI's torch (CUDA libraries, some GB) works too
  "${pip[@]}" --timeout 60 --retries 1 --index-url https://download.pytorch.org/whl/cpu torch ||
    "${pip[@]}" torch
fi
missing=()
for mod in pytest:pytest transformers:transformers scikit_build_core:scikit-build-core ninja:ninja; do
  "$py" -c "import ${mod%%:*}" 2>/dev/null || missing+=("${mod#*:}")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "== installing ${missing[*]} =="
  "${pip[@]}" "${missing[@]}"
fi

echo "== building the twblas Python package (CPU backend, against $("$py" -c 'import torch; print(torch.__version__)')) =="
"${pip[@]}" --no-build-isolation "$root/bindings/python" --config-settings=cmake.define.TWBLAS_WITH_CUDA=OFF
echo "== pytest bindings/python/tests =="
cd "$(mktemp -d)"
"$py" -m pytest -q "$root/bindings/python/tests"
echo "== the README's Python program (examples/pytorch/quickstart.py) =="
"$py" "$root/examples/pytorch/quickstart.py"
