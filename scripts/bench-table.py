#!/usr/bin/env python3
"""Prints the medians of a twblas-bench JSON file: one line per benchmark, with the ratio of the
dense cuBLAS FFN of the same shape, profile and M (graph or eager twin) to it.
   scripts/bench-table.py FILE.json [FILE2.json ...]"""
import json
import re
import sys

for path in sys.argv[1:]:
    rows = {}
    for b in json.load(open(path))["benchmarks"]:
        if not b["name"].endswith("_median"):
            continue
        name = re.sub(r"/min_time.*", "", b["name"])
        rows[name] = b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b.get("time_unit", "us")]
    print(f"== {path}")
    for name, t in rows.items():
        parts = name.split("/")
        kind = parts[1]
        base = kind.replace("twblas", "dense", 1) if kind.startswith("twblas") else None
        ratio = ""
        if base:
            other = "/".join([parts[0], re.sub(r"dense_save_dense", "dense", base)] + parts[2:])
            if other in rows:
                ratio = f"  {rows[other] / t:.2f}x dense"
        print(f"{name:70s} {t:9.1f} us{ratio}")
