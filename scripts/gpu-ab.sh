#!/usr/bin/env bash
# Runs on the lent GPU machine: one benchmark binary timing two builds of libtwblas alternately,
# so that a change and its baseline are measured in the same call on the same card (the bench
# links libtwblas.so and uses the public C API only).
#   scripts/gpu-ab.sh NEW_BUILD OLD_BUILD SUITE FILTER [ROUNDS]
# (More than two builds in one call: scripts/gpu-abn.sh.)
# NEW_BUILD and OLD_BUILD are folders made by scripts/gpu-pack.sh; the benchmark binary is
# NEW_BUILD's. Output: $OUT/ab-new-<round>.json and $OUT/ab-old-<round>.json, and a table of the
# medians per point (new, old, new / old) in $OUT/ab.txt.
set -uo pipefail
new=$1 old=$2 suite=$3 filter=$4 rounds=${5:-2}
out=${OUT:-gpu-out}
mkdir -p "$out"
bench="$PWD/$new/bench/twblas-bench"
status=0
for r in $(seq 1 "$rounds"); do
  for side in new old; do
    lib=$new
    [ "$side" = old ] && lib=$old
    LD_LIBRARY_PATH="$PWD/$lib/src:$PWD/$new/runtime:${LD_LIBRARY_PATH:-}" "$bench" --suite="$suite" \
      --benchmark_filter="$filter" --benchmark_out="$out/ab-$side-$r.json" --benchmark_out_format=json \
      >"$out/ab-$side-$r.txt" 2>&1 || { status=1; tail -n 20 "$out/ab-$side-$r.txt"; }
  done
done
python3 - "$out" "$rounds" <<'EOF' | tee "$out/ab.txt"
import json, sys, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
def medians(side):
    t = {}
    for r in range(1, rounds + 1):
        try:
            for b in json.load(open(f"{out}/ab-{side}-{r}.json"))["benchmarks"]:
                if b.get("aggregate_name") == "median" or (b.get("run_type") == "iteration" and "aggregate_name" not in b):
                    t.setdefault(b["run_name"], []).append(b["real_time"])
        except (OSError, ValueError, KeyError):
            pass
    return {k: statistics.median(v) for k, v in t.items()}
new, old = medians("new"), medians("old")
print(f"{'point':70s} {'new':>10s} {'old':>10s} {'new/old':>8s}")
for k in sorted(set(new) | set(old)):
    n, o = new.get(k), old.get(k)
    ratio = f"{n / o:8.3f}" if n and o else ""
    print(f"{k:70s} {n if n else float('nan'):10.1f} {o if o else float('nan'):10.1f} {ratio}")
EOF
exit $status
