#!/usr/bin/env bash
# Runs on the lent GPU machine: one benchmark binary timing several builds of libtwblas in
# interleaved rounds (round 1: every library, round 2: every library, ...), so that a change, its
# variants and their baseline are measured in the same call on the same card; the first library is
# the baseline of the ratios (scripts/gpu-ab.sh is the two-build form).
#   scripts/gpu-abn.sh SUITE FILTER ROUNDS BENCH_BUILD LIB_DIR...
#   e.g. scripts/gpu-abn.sh serving 'ffn/twblas/d2048_h5632/llm-29/m(4|64)/' 2 build-gpu build-base build-gpu build-var
# BENCH_BUILD is a folder made by scripts/gpu-pack.sh (its bench/twblas-bench and runtime/); each
# LIB_DIR holds src/libtwblas.so* (gpu-pack.sh's folders or scripts/variant-lib.sh's). Names are the
# folders' without a "build-" prefix. TW_AB_ONCE: a second filter run once, in round 1 with the
# first library (the dense FFN's entries, which do not depend on the library).
# Output in $OUT: abn.txt (median over rounds of each entry's median, per library, and each
# library's ratio to the first) and abn-json.tgz (every JSON: the device tool returns few files).
# Budget: the serving suite's entries take ~4 s each on an H100 (setup, verification, timing).
set -uo pipefail
suite=$1 filter=$2 rounds=$3 bench_build=$4
shift 4
out=${OUT:-gpu-out}
mkdir -p "$out"
bench="$PWD/$bench_build/bench/twblas-bench"
status=0
names=()
for lib in "$@"; do names+=("$(basename "$lib" | sed 's/^build-//')"); done
for r in $(seq 1 "$rounds"); do
  for i in "${!names[@]}"; do
    lib=${*:$((i + 1)):1} name=${names[$i]}
    f=$filter
    [ "$r" = 1 ] && [ "$i" = 0 ] && [ -n "${TW_AB_ONCE:-}" ] && f="$filter|$TW_AB_ONCE"
    LD_LIBRARY_PATH="$PWD/$lib/src:$PWD/$bench_build/runtime:${LD_LIBRARY_PATH:-}" "$bench" --suite="$suite" \
      --benchmark_filter="$f" --benchmark_out="$out/$i-$name-$r.json" --benchmark_out_format=json \
      >"$out/$i-$name-$r.txt" 2>&1 || { status=1; tail -n 20 "$out/$i-$name-$r.txt"; }
  done
done
python3 - "$out" "${names[@]}" <<'EOF' | tee "$out/abn.txt"
import glob, json, re, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
table = {}  # entry -> library index -> medians of the rounds
for i, name in enumerate(names):
    for path in sorted(glob.glob(f"{out}/{i}-{name}-*.json")):
        try:
            benchmarks = json.load(open(path))["benchmarks"]
        except (OSError, ValueError, KeyError):
            continue
        for b in benchmarks:
            if b.get("aggregate_name") == "median":
                entry = re.sub(r"/min_time.*", "", b["run_name"])
                table.setdefault(entry, {}).setdefault(i, []).append(b["real_time"])
head = f"{'entry':55s}" + "".join(f"{n:>12s}" for n in names) + "".join(f"{n + '/' + names[0]:>16s}" for n in names[1:])
print(head)
for entry in sorted(table):
    med = {i: statistics.median(v) for i, v in table[entry].items()}
    row = f"{entry:55s}" + "".join(f"{med[i]:12.1f}" if i in med else f"{'':12s}" for i in range(len(names)))
    for i in range(1, len(names)):
        row += f"{med[i] / med[0]:16.3f}" if i in med and 0 in med else f"{'':16s}"
    print(row)
EOF
(cd "$out" && tar czf abn-json.tgz ./*-*-*.json && rm -f ./*-*-*.json ./*-*-*.txt)
exit $status
