#!/usr/bin/env bash
# The Debian packages of a build folder (CPack: libtwblas<N> and libtwblas-dev), checked, then
# extracted into a clean folder and the outside consumer (tests/consumer: CMake find_package and
# pkg-config, shared and static) and the C and C++ examples (with the build lines their comments
# give) built and run against what the packages hold.
#   scripts/package.sh [BUILD_DIR]      (default build; configured and built already)
# Checks: every library a shipped shared library needs (its NEEDED entries) is in the package
# itself, in a package its Depends names (dpkg -S maps the library to its package) or, for a CUDA
# build, one of the CUDA toolkit's libraries, which the description names; and lintian reports no
# error (warnings are printed). Needs dpkg-dev (dpkg-shlibdeps, for the Depends), file and
# binutils, and lintian: installed with apt-get when missing and run as root; without root, a
# missing lintian is reported and skipped.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd)
out=$build/packages
fail() { echo "package.sh: $*" >&2; exit 1; }

need=()
command -v dpkg-shlibdeps > /dev/null || need+=(dpkg-dev)
command -v file > /dev/null || need+=(file)
command -v objdump > /dev/null || need+=(binutils)
command -v lintian > /dev/null || need+=(lintian)
if [[ ${#need[@]} -gt 0 ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get > /dev/null; then
    echo "package.sh: installing ${need[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q > /dev/null
    apt-get install -y -q --no-install-recommends "${need[@]}" > /dev/null
  else
    for p in "${need[@]}"; do
      [[ $p == lintian ]] && continue
      fail "missing $p (it gives dpkg-shlibdeps/file/objdump): sudo apt-get install -y ${need[*]}"
    done
  fi
fi

rm -rf "$out"
mkdir -p "$out"
echo "== cpack -G DEB ($build) =="
(cd "$build" && cpack -G DEB -B "$out" > "$out/cpack.log" 2>&1) || { cat "$out/cpack.log"; exit 1; }
ls -1 "$out"/*.deb
for deb in "$out"/*.deb; do
  echo "-- $(basename "$deb")"
  dpkg-deb --field "$deb" Package Version Depends
  dpkg-deb --contents "$deb" | awk '{print "   " $6 ($7 ? " " $7 " " $8 : "")}'
done

echo "== Depends against the NEEDED entries of the shared libraries each package ships =="
# the CUDA toolkit's libraries (and the driver's libcuda): not Debian packages here (the runtime
# package's description says so)
cuda_libs='^lib(cuda|cudart|cublas|cublasLt|cusparse|cusolver|cufft|curand|nvJitLink|nvrtc|nvToolsExt)\.so'
# the Debian package holding the library a NEEDED entry names, as this machine resolves it
lib_package() {
  local path alt
  path=$(ldconfig -p | awk -v n="$1" '$1 == n && /x86-64|64bit/ {print $NF; exit}')
  [[ -n $path ]] || path=$(ldconfig -p | awk -v n="$1" '$1 == n {print $NF; exit}')
  [[ -n $path ]] || return 0
  for alt in "$path" "$(readlink -f "$path")" "${path/#\/usr\/lib\//\/lib\/}" "${path/#\/lib\//\/usr\/lib\/}"; do
    dpkg -S "$alt" 2> /dev/null | head -1 | cut -d: -f1 && return 0
  done
}
for deb in "$out"/*.deb; do
  pkg=$(dpkg-deb --field "$deb" Package)
  depends=$(dpkg-deb --field "$deb" Depends)
  description=$(dpkg-deb --field "$deb" Description)
  # the package names Depends allows (alternatives included, versions and architectures dropped)
  allowed=" $(tr ',|' '\n' <<< "$depends" | sed 's/(.*//; s/:.*//; s/ //g' | tr '\n' ' ') "
  x=$(mktemp -d)
  dpkg-deb -x "$deb" "$x"
  shipped=$(find "$x" \( -type f -o -type l \) -name '*.so*' -printf '%f\n')
  while IFS= read -r lib; do
    file -b "$lib" | grep -q 'ELF.*shared object' || continue
    for needed in $(objdump -p "$lib" | awk '$1 == "NEEDED" {print $2}'); do
      if grep -qxF "$needed" <<< "$shipped"; then
        how="in $pkg"
      elif [[ $needed =~ $cuda_libs ]]; then
        grep -q "toolkit" <<< "$description" ||
          fail "$pkg: ${lib#"$x"} needs $needed (CUDA toolkit), which the description does not name"
        how="CUDA toolkit (description)"
      else
        provider=$(lib_package "$needed")
        [[ -n $provider ]] ||
          fail "$pkg: ${lib#"$x"} needs $needed, which no installed Debian package provides here"
        [[ $allowed == *" $provider "* ]] ||
          fail "$pkg: ${lib#"$x"} needs $needed, from the package $provider, which Depends ($depends) lacks"
        how="$provider"
      fi
      echo "   $pkg: $(basename "$lib") -> $needed: $how"
    done
  done < <(find "$x" -type f)
  rm -rf "$x"
done

echo "== lintian (errors fail) =="
if command -v lintian > /dev/null; then
  rc=0
  lintian --fail-on error "$out"/*.deb > "$out/lintian.log" 2>&1 || rc=$?
  # (lintian's note on running as root is not a finding about the packages)
  grep -v 'running with root privileges is not recommended' "$out/lintian.log" || true
  [[ $rc -eq 0 ]] || fail "lintian reports errors on the packages (E: lines above; $out/lintian.log)"
  echo "lintian: no errors"
else
  echo "lintian: not installed and not installable here (needs root and apt-get): skipped"
fi

echo "== extract into a clean folder and build the consumer against it =="
pkgroot=$out/root
mkdir -p "$pkgroot"
for deb in "$out"/*.deb; do dpkg-deb -x "$deb" "$pkgroot"; done
pcdir=$(dirname "$(find "$pkgroot" -name twblas.pc -print -quit)")
libdir=$(dirname "$(find "$pkgroot" -name 'libtwblas.so.*' -print -quit)")
# the consumer runs against the extracted library (no install into the system); twblas.pc says
# /usr, which pkg-config's sysroot maps to the extracted tree
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_SYSROOT_DIR=$pkgroot
bash "$root/tests/consumer/run_consumer.sh" - "$pkgroot/usr" "$root/tests/consumer" "$out/consumer"

echo "== the examples' build lines, as their comments give them =="
export PKG_CONFIG_PATH=$pcdir
ex=$out/examples
mkdir -p "$ex"
for src in examples/c/ffn_example.c examples/cpp/ffn_example.cpp; do
  # the line after "Build", indented: "<compiler> <file> $(pkg-config ...) ... -o <program>"
  line=$(sed -n 's#^\(//\| \*\) \{3\}\(\(cc\|c++\) .*\)$#\2#p' "$root/$src" | head -1)
  [[ -n $line ]] || fail "$src: no build line in its comment"
  cp "$root/$src" "$ex/"
  echo "$src: $line"
  (cd "$ex" && env -u LD_LIBRARY_PATH bash -c "$line") || fail "$src: its build line fails"
  prog=${line##* -o }
  prog=${prog%% *}
  # no LD_LIBRARY_PATH: the rpath of the build line finds the library
  (cd "$ex" && env -u LD_LIBRARY_PATH "./$prog" > "$prog.log") || { cat "$ex/$prog.log"; fail "$src: ./$prog fails"; }
  tail -1 "$ex/$prog.log"
done
if command -v gfortran > /dev/null && fmoddir=$(pkg-config --variable=fmoddir twblas) && [[ -n $fmoddir ]]; then
  echo "examples/fortran/ffn_example.f90: gfortran -I\$(pkg-config --variable=fmoddir twblas) ..."
  gfortran -o "$ex/ffn_example_fortran" "$root/examples/fortran/ffn_example.f90" -I"$fmoddir" \
    -L"$libdir" -ltwblas_fortran -ltwblas -Wl,-rpath,"$libdir"
  "$ex/ffn_example_fortran" > "$ex/ffn_example_fortran.log" || { cat "$ex/ffn_example_fortran.log"; fail "the Fortran example fails"; }
  tail -1 "$ex/ffn_example_fortran.log"
fi
echo "package.sh: all passed"
