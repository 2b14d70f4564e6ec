#!/usr/bin/env bash
# The Debian packages of a build folder (CPack: libtwblas<N> and libtwblas-dev), extracted into a
# clean folder, then the outside consumer (tests/consumer: CMake find_package and pkg-config, shared
# and static) built and run against what the packages hold.
#   scripts/package.sh [BUILD_DIR]      (default build; configured and built already)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd)
out=$build/packages
rm -rf "$out"
mkdir -p "$out"
echo "== cpack -G DEB ($build) =="
(cd "$build" && cpack -G DEB -B "$out" > "$out/cpack.log") || { cat "$out/cpack.log"; exit 1; }
ls -1 "$out"/*.deb
for deb in "$out"/*.deb; do
  echo "-- $(basename "$deb")"
  dpkg-deb --field "$deb" Package Version Depends
  dpkg-deb --contents "$deb" | awk '{print "   " $6 ($7 ? " " $7 " " $8 : "")}'
done
echo "== extract into a clean folder and build the consumer against it =="
pkgroot=$out/root
mkdir -p "$pkgroot"
for deb in "$out"/*.deb; do dpkg-deb -x "$deb" "$pkgroot"; done
# the consumer runs against the extracted library (no install into the system)
export LD_LIBRARY_PATH="$pkgroot/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bash "$root/tests/consumer/run_consumer.sh" - "$pkgroot/usr" "$root/tests/consumer" "$out/consumer"
