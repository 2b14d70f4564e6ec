#!/usr/bin/env bash
# Runs on the lent GPU machine: one benchmark binary timing two builds of libtwblas alternately,
# so that a change and its baseline are measured in the same call on the same card (the bench
# links libtwblas.so and uses the public C API only).
#   scripts/gpu-ab.sh NEW_BUILD OLD_BUILD SUITE FILTER [ROUNDS]
# NEW_BUILD and OLD_BUILD are folders made by scripts/gpu-pack.sh; the benchmark binary is
# NEW_BUILD's. The two-build form of scripts/gpu-abn.sh (OLD_BUILD the baseline): its table of
# medians and the NEW / OLD ratio in $OUT/abn.txt, the JSON in $OUT/abn-json.tgz.
set -uo pipefail
new=$1 old=$2 suite=$3 filter=$4 rounds=${5:-2}
exec bash "$(dirname "$0")/gpu-abn.sh" "$suite" "$filter" "$rounds" "$new" "$old" "$new"
