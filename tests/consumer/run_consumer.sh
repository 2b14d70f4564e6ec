#!/usr/bin/env bash
# Builds and runs an outside C program against the INSTALLED twblas package.
#
#   run_consumer.sh <build dir> <install prefix> [<this directory> [<work dir> [<cmake> [<config>]]]]
#
# 1. cmake --install <build dir> --prefix <install prefix> (a fresh prefix each run); with "-" as
#    the build dir, the prefix is used as it is (e.g. Debian packages extracted there: scripts/package.sh);
# 2. configures, builds and runs project/ (find_package(twblas), twblas::twblas, C only) with
#    -DCMAKE_PREFIX_PATH=<install prefix>; then the same with twblas::twblas_static;
# 3. cc consumer.c $(pkg-config --cflags --libs twblas) -Wl,-rpath,<libdir>, with
#    PKG_CONFIG_PATH set to wherever twblas.pc was installed (lib/ or lib/<multiarch>/), and runs it.
#    twblas.pc holds absolute paths (the install prefix; /usr in the Debian packages): for packages
#    extracted into a folder, set PKG_CONFIG_SYSROOT_DIR to it (scripts/package.sh does), and
#    pkg-config maps /usr/... into it.
# Exits non-zero at the first step that fails. CC overrides the C compiler (default cc).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 <build dir> <install prefix> [<consumer dir> [<work dir> [<cmake> [<config>]]]]" >&2
  exit 2
fi
build=$1
[[ $build == - ]] || build=$(cd "$1" && pwd)
prefix=$2
here=${3:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
work=${4:-${prefix%/}-work}
cmake_cmd=${5:-cmake}
config=${6:-}
cc_cmd=${CC:-cc}

step() { printf '\n== %s\n' "$*"; }

if [[ $build == - ]]; then
  rm -rf "$work"
  mkdir -p "$work"
  prefix=$(cd "$prefix" && pwd)
  step "the prefix $prefix as it is"
else
  rm -rf "$prefix" "$work"
  mkdir -p "$prefix" "$work"
  prefix=$(cd "$prefix" && pwd)

  step "install $build into $prefix"
  install_args=(--install "$build" --prefix "$prefix")
  [[ -n $config ]] && install_args+=(--config "$config")
  "$cmake_cmd" "${install_args[@]}" > "$work/install.log" || { cat "$work/install.log"; exit 1; }
  echo "files installed: $(grep -c "Installing\|Up-to-date" "$work/install.log" || true)"
fi

step "CMake: find_package(twblas), twblas::twblas (a C-only project)"
"$cmake_cmd" -S "$here/project" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc_cmd"
"$cmake_cmd" --build "$work/cmake"
"$work/cmake/consumer"

step "CMake: twblas::twblas_static"
"$cmake_cmd" -S "$here/project" -B "$work/cmake-static" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc_cmd" -DCONSUMER_STATIC=ON
"$cmake_cmd" --build "$work/cmake-static"
"$work/cmake-static/consumer_static"

step "pkg-config"
pc=$(find "$prefix" -name twblas.pc -print -quit)
if [[ -z $pc ]]; then
  echo "twblas.pc was not installed under $prefix" >&2
  exit 1
fi
pcdir=$(dirname "$pc")
echo "twblas.pc: $pc"
pkgconf() { PKG_CONFIG_PATH="$pcdir" pkg-config "$@"; }
# The .pc must describe this prefix, not where the build was configured to install.
for var in includedir libdir; do
  dir=$(pkgconf --variable="$var" twblas)
  real=$(cd "$dir" 2>/dev/null && pwd -P || true)
  case "$real/" in
    "$(cd "$prefix" && pwd -P)"/*) ;;
    *) echo "twblas.pc: $var = '$dir' is not inside the install prefix $prefix" >&2; exit 1 ;;
  esac
done
flags=$(pkgconf --cflags --libs twblas)
libdir=$(pkgconf --variable=libdir twblas)
echo "flags: $flags"
# shellcheck disable=SC2086  # the flags are words
"$cc_cmd" -std=c99 -Wall -Wextra -pedantic -Werror -o "$work/consumer_pkgconfig" "$here/consumer.c" \
  $flags -lm -Wl,-rpath,"$libdir"
if command -v ldd > /dev/null; then
  ldd "$work/consumer_pkgconfig" | grep twblas || true
fi
"$work/consumer_pkgconfig"

step "consumer_package: all passed"
