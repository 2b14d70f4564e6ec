#!/usr/bin/env python3
"""Per-kernel table of an Nsight Compute CSV (--csv --page raw, metric gpu__time_duration.sum),
whose lines are mixed with the benchmark's own output: launches seen and median duration."""
import csv
import statistics
import sys

name, path = sys.argv[1], sys.argv[2]
rows = list(csv.reader(line for line in open(path, errors="replace") if line.startswith('"')))
if not rows:
    print(f"== {name}: no kernels profiled")
    sys.exit(0)
kernel, time = rows[0].index("Kernel Name"), rows[0].index("gpu__time_duration.sum")
by_kernel = {}
for r in rows[1:]:
    try:
        us = float(r[time].replace(",", "")) / 1000.0
    except ValueError:  # the units row
        continue
    by_kernel.setdefault(r[kernel][:70], []).append(us)
print(f"== {name} (launches, median us)")
for k, v in sorted(by_kernel.items(), key=lambda kv: -statistics.median(kv[1]) * len(kv[1])):
    print(f"  {len(v):5d}  {statistics.median(v):8.2f}  {k}")
