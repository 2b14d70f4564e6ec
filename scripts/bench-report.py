#!/usr/bin/env python3
"""Turns twblas-bench JSON (Google Benchmark) into a markdown table and a plot.

    scripts/bench-report.py bench/results/FILE.json [--md docs/benchmarks.md] [--plot docs/speedup.png]
                            [--train bench/results/TRAIN.json]

Every ratio compares timings of one run (one JSON file): twblas against the dense cuBLAS FFN,
against the gate GEMM alone, and against the cuSPARSE pipeline. The plot shows the speedup over
dense cuBLAS against the measured active units per token, with the break-even line.
"""
import argparse
import json
import re
import sys
from collections import defaultdict

NAME = re.compile(r"^ffn/(?P<variant>[a-z_]+)/d(?P<d>\d+)_h(?P<h>\d+)/(?P<profile>[a-z]+-[0-9.]+)/m(?P<m>\d+)")


def load(path):
    with open(path) as f:
        data = json.load(f)
    rows = defaultdict(dict)  # (d, h, profile, m) -> variant -> entry
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median" or b.get("error_occurred"):
            continue
        m = NAME.match(b["name"])
        if not m:
            continue
        key = (int(m["d"]), int(m["h"]), m["profile"], int(m["m"]))
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "us")]
        entry = {"ms": b["real_time"] * unit}
        entry.update({k: v for k, v in b.items() if isinstance(v, (int, float)) and k not in ("real_time", "cpu_time")})
        rows[key][m["variant"]] = entry
    return data.get("context", {}), rows


def fmt_ms(x):
    return "" if x is None else (f"{x * 1e3:.1f} us" if x < 1 else f"{x:.3f} ms")


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def fmt_ratio(x, suffix="x"):
    return "" if x is None else f"{x:.2f}{suffix}"


def table(context, rows):
    out = []
    gpu = context.get("gpu", "unknown GPU")
    out.append(f"Measured on {gpu} ({context.get('sm_count', '?')} SMs), CUDA runtime "
               f"{context.get('cuda_runtime', '?')}, {context.get('date', '')}. bf16, medians of 5 "
               "repetitions, CUDA events, CUDA-graph replay, inputs rotated over 3 copies.")
    out.append("")
    out.append("| D x H | profile | M | active/token (mean, max) | tile-overflow rows | twblas | dense cuBLAS | gate GEMM | "
               "cuSPARSE* | vs dense | / gate | vs cuSPARSE | CPU twblas | CPU dense |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    def order(kv):
        d, h, prof, m = kv[0]
        family, k = prof.rsplit("-", 1)
        return (d, prof != "uniform-29", family != "uniform", family, float(k), m)

    graph_and_cpu = ("twblas", "dense", "gate", "cusparse", "cpu_twblas", "cpu_dense")
    for (d, h, prof, m), v in sorted(rows.items(), key=order):
        if not any(k in v for k in graph_and_cpu):
            continue  # points measured only eagerly (twblas_eager, dense_eager) or only in training
        tw, de, ga, cs = (v.get(k, {}).get("ms") for k in ("twblas", "dense", "gate", "cusparse"))
        cpu_tw, cpu_de = (v.get(k, {}).get("ms") for k in ("cpu_twblas", "cpu_dense"))
        t = v.get("twblas", {})
        act = f"{t['mean_nnz']:.1f}, {int(t['max_nnz'])}" if "mean_nnz" in t else ""
        over = str(int(t["overflow_rows"])) if "overflow_rows" in t else ""
        out.append(f"| {d} x {h} | {prof} | {m} | {act} | {over} | {fmt_ms(tw)} | {fmt_ms(de)} | {fmt_ms(ga)} | "
                   f"{fmt_ms(cs)} | {fmt_ratio(ratio(de, tw))} | {fmt_ratio(ratio(tw, ga), '')} | "
                   f"{fmt_ratio(ratio(cs, tw))} | {fmt_ms(cpu_tw)} | {fmt_ms(cpu_de)} |")
    be = break_even(rows)
    if be:
        out.append("")
        out.append(f"Break-even (D = 2048, H = 5632, M = 16384, uniform-k): twblas is faster than the dense cuBLAS FFN "
                   f"below about {be:.0f} active units per token ({100 * be / 5632:.1f} % of H), interpolated "
                   "between the measured points; above it the path choice keeps it near the dense time.")
    out.append("")
    out.append("*cuSPARSE pipeline: cuBLAS gate+up GEMM, ReLU*product, cusparseDenseToSparse (CSR), "
               "cusparseSpMM. cuSPARSE SDDMM has no bf16, so its up projection is dense; dense -> CSR "
               "needs the nnz on the host (a synchronisation), so it is timed phase by phase, not in a graph.")
    return "\n".join(out)


def train_table(context, rows):
    """Forward + backward (train_twblas) against the dense nine-GEMM step (train_dense)."""
    out = [f"Measured on {context.get('gpu', 'unknown GPU')} ({context.get('sm_count', '?')} SMs), CUDA runtime "
           f"{context.get('cuda_runtime', '?')}, {context.get('date', '')}. bf16, l1Coeff 1e-3, medians of 5 "
           "repetitions, CUDA-graph replay of one forward + backward; the gradients are checked against the "
           "dense step before timing (relative errors below).", ""]
    out.append("| D x H | profile | M | active/token | tile-overflow rows | twblas fwd+bwd | dense step | vs dense | "
               "vs uniform-29 | saved / dense h | rel. err dX, dW[g;u], dWd |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    base = {}
    for (d, h, prof, m), v in rows.items():
        if prof == "uniform-29" and "train_twblas" in v:
            base[(d, h, m)] = v["train_twblas"]["ms"]

    def order(kv):
        d, h, prof, m = kv[0]
        family, k = prof.rsplit("-", 1)
        return (d, m, family != "uniform", family, float(k))

    for (d, h, prof, m), v in sorted(rows.items(), key=order):
        t = v.get("train_twblas")
        de = v.get("train_dense", {}).get("ms")
        if not t:
            continue
        vs_uniform = ratio(t["ms"], base.get((d, h, m)))
        errs = ", ".join(f"{t.get(k, float('nan')):.1e}" for k in ("rel_err_dx", "rel_err_dwgu", "rel_err_dwd"))
        out.append(f"| {d} x {h} | {prof} | {m} | {t.get('mean_nnz', 0):.1f} | {int(t.get('overflow_rows', 0))} | "
                   f"{fmt_ms(t['ms'])} | {fmt_ms(de)} | {fmt_ratio(ratio(de, t['ms']))} | "
                   f"{'' if prof == 'uniform-29' else fmt_ratio(vs_uniform)} | {t.get('saved_over_dense_h', 0):.3f} | {errs} |")
    out.append("")
    out.append("Dense step: cuBLASLt [g | u] = X [Wg; Wu]^T, h = relu(g) u, Y = h Wd; dH = dY Wd^T, the element-wise "
               "backward (L1 term included), dX = [dG | dU] [Wg; Wu], [dWg; dWu] = [dG | dU]^T X, dWd = H^T dY: nine "
               "GEMMs' worth of flops. It keeps [g | u] and h (3 M x H values) for its backward.")
    return "\n".join(out)


def uniform_points(rows):
    pts = []
    for (d, h, prof, m), v in rows.items():
        if (d, h, m) == (2048, 5632, 16384) and prof.startswith("uniform") and "twblas" in v and "dense" in v:
            pts.append((v["twblas"].get("mean_nnz", 0.0), v["dense"]["ms"] / v["twblas"]["ms"]))
    return sorted(pts)


def break_even(rows):
    """Active units where the uniform-k speedup crosses 1 (log-linear interpolation)."""
    import math
    pts = uniform_points(rows)
    for (k0, s0), (k1, s1) in zip(pts, pts[1:]):
        if s0 >= 1.0 > s1:
            f = (s0 - 1.0) / (s0 - s1)
            return math.exp(math.log(k0) + f * (math.log(k1) - math.log(k0)))
    return None


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pts = []
    for (d, h, prof, m), v in rows.items():
        if (d, h, m) != (2048, 5632, 16384) or "twblas" not in v or "dense" not in v:
            continue
        t = v["twblas"]
        pts.append((t.get("mean_nnz", 0.0), v["dense"]["ms"] / t["ms"], prof))
    if not pts:
        return False
    pts.sort()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    uni = [p for p in pts if p[2].startswith("uniform")]
    ax.plot([p[0] for p in uni], [p[1] for p in uni], "o-", label="uniform-k")
    for p in pts:
        if not p[2].startswith("uniform"):
            ax.plot(p[0], p[1], "s", label=p[2])
    ax.axhline(1.0, color="gray", ls="--", label="dense cuBLAS FFN")
    be = break_even(rows)
    if be:
        ax.axvline(be, color="red", ls=":", label=f"break-even ~{be:.0f} active units")
    ax.set_xscale("log")
    ax.set_xlabel("measured active units per token (of H = 5632)")
    ax.set_ylabel("speedup over dense cuBLAS FFN")
    ax.set_title("twblas fused gated FFN, D = 2048, H = 5632, M = 16384, bf16")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--md", help="write the table into this markdown file (else stdout)")
    ap.add_argument("--plot", help="write the speedup-vs-sparsity plot (PNG, needs matplotlib)")
    ap.add_argument("--train", help="a training-suite JSON: adds the forward + backward table")
    args = ap.parse_args()
    context, rows = load(args.json)
    text = table(context, rows)
    if args.md and args.plot:
        text += f"\n\n![speedup versus sparsity]({args.plot.split('/')[-1]})"
    if args.train:
        tcontext, trows = load(args.train)
        text += "\n\n## Training: forward + backward\n\nFrom `" + args.train + "`.\n\n" + train_table(tcontext, trows)
    if args.md:
        with open(args.md, "w") as f:
            f.write("# twblas benchmark results\n\nGenerated by `scripts/bench-report.py " + args.json + "`.\n\n")
            f.write(text + "\n")
    else:
        print(text)
    if args.plot and not plot(rows, args.plot):
        print("no M = 16384 points for the plot", file=sys.stderr)


if __name__ == "__main__":
    main()
