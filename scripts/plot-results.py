#!/usr/bin/env python3
"""The plots of docs/benchmarks.md, each drawn from committed twblas-bench JSON and naming the
GPU, the date and the file it came from (ratios are always within one file: one run).

    scripts/plot-results.py [--batch bench/results/h100-2026-11-22.json]
                            [--serving bench/results/h100-serving-v4.json]
                            [--serving-llama bench/results/h100-serving-llama-v2.json]
                            [--train bench/results/h100-train-2026-11-22.json] [--out docs]

Writes speedup-vs-sparsity.png (twblas and the cuSPARSE pipeline against dense cuBLAS, by active
units per token), speedup-vs-tokens.png (serving and batch regimes, M = 1 to 65536) and
training-vs-dense.png (training step against the dense step, by active units), and prints the
markdown that docs/benchmarks.md shows them with.
"""
import argparse
import importlib.util
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_report", os.path.join(os.path.dirname(__file__), "bench-report.py"))
br = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(br)


def source(ctx, path):
    return f"{ctx.get('gpu', '?')}, {ctx.get('date', '?')[:10]}, {os.path.basename(path)}"


def speedup(rows, key, over, under="twblas"):
    v = rows.get(key, {})
    a, b = v.get(over, {}).get("ms"), v.get(under, {}).get("ms")
    return None if a is None or b is None else a / b


def sparsity_plot(path, out):
    ctx, rows = br.load(path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    pts = sorted((v["twblas"]["mean_nnz"], speedup(rows, k, "dense"), speedup(rows, k, "dense", "cusparse"), k[2])
                 for k, v in rows.items() if k[:2] == (2048, 5632) and k[3] == 16384 and "twblas" in v
                 and "dense" in v and "mean_nnz" in v["twblas"])
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label="twblas / dense cuBLAS FFN")
    cs = [(p[0], p[2]) for p in pts if p[2] is not None]
    ax.plot([p[0] for p in cs], [p[1] for p in cs], "s", label="cuSPARSE pipeline / dense cuBLAS FFN")
    for p in pts:
        ax.annotate(p[3], (p[0], p[1]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xscale="log", xlabel="active units per token (mean, of H = 5632)", ylabel="speedup over dense (x)",
           title="D 2048, H 5632, M 16384, bf16, graph replay")
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, source(ctx, path), fontsize=7, color="gray")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "speedup-vs-sparsity.png"), dpi=100)
    return source(ctx, path)


def tokens_plot(serving, serving_llama, batch, out):
    fig, ax = plt.subplots(figsize=(8, 4.8))
    notes = []
    for path, d, h, style, name in ((serving, 2048, 5632, "o-", "paper's shape"),
                                    (serving_llama, 4096, 14336, "^-", "Llama-3-8B's shape")):
        ctx, rows = br.load(path)
        keys = sorted(k for k in rows if k[:3] == (d, h, "uniform-29") and "twblas" in rows[k] and "dense" in rows[k])
        ax.plot([k[3] for k in keys], [speedup(rows, k, "dense") for k in keys], style, label=f"twblas, graph, {name}")
        eager = [k for k in keys if "twblas_eager" in rows[k] and "dense_eager" in rows[k]]
        ax.plot([k[3] for k in eager], [speedup(rows, k, "dense_eager", "twblas_eager") for k in eager], style[0] + ":",
                alpha=0.7, label=f"twblas, eager (host time included), {name}")
        notes.append(f"serving ({name}): {source(ctx, path)}")
    ctx, rows = br.load(batch)
    keys = sorted(k for k in rows if k[:3] == (2048, 5632, "uniform-29") and k[3] > 512 and "twblas" in rows[k]
                  and "dense" in rows[k])
    ax.plot([k[3] for k in keys], [speedup(rows, k, "dense") for k in keys], "D-", label="twblas, graph, batch regime")
    cs = [k for k in keys if "cusparse" in rows[k]]
    ax.plot([k[3] for k in cs], [speedup(rows, k, "dense", "cusparse") for k in cs], "s--",
            label="cuSPARSE pipeline, batch regime")
    notes.append(f"batch: {source(ctx, batch)}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xscale="log", xlabel="tokens per call (M)", ylabel="speedup over the dense cuBLAS FFN (x)",
           title="uniform-29, bf16: serving (M <= 512) and batch (M > 512) regimes")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    fig.text(0.01, 0.01, "\n".join(notes), fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(os.path.join(out, "speedup-vs-tokens.png"), dpi=100)
    return notes


def training_plot(path, out):
    ctx, rows = br.load(path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    pts = sorted((v["train_twblas"].get("mean_nnz", float(k[2].rsplit("-", 1)[1])), speedup(rows, k, "train_dense", "train_twblas"),
                  f"{k[2]} m{k[3]}") for k, v in rows.items() if "train_twblas" in v and "train_dense" in v)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o")
    for p in pts:
        ax.annotate(p[2], (p[0], p[1]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xscale="log", xlabel="active units per token (mean, of H = 5632)",
           ylabel="dense step / twblas step (x)", title="training step (forward + backward), D 2048, H 5632, bf16")
    fig.text(0.01, 0.01, source(ctx, path), fontsize=7, color="gray")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "training-vs-dense.png"), dpi=100)
    return source(ctx, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="bench/results/h100-2026-11-22.json")
    ap.add_argument("--serving", default="bench/results/h100-serving-v4.json")
    ap.add_argument("--serving-llama", default="bench/results/h100-serving-llama-v2.json")
    ap.add_argument("--train", default="bench/results/h100-train-2026-11-22.json")
    ap.add_argument("--out", default="docs")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    s1 = sparsity_plot(a.batch, a.out)
    s2 = tokens_plot(a.serving, a.serving_llama, a.batch, a.out)
    s3 = training_plot(a.train, a.out)
    print("## Plots\n")
    print(f"![speedup against sparsity](speedup-vs-sparsity.png)\n\nSource: {s1}.\n")
    print(f"![speedup against tokens per call](speedup-vs-tokens.png)\n\nSources: {'; '.join(s2)}.\n")
    print(f"![training step against dense](training-vs-dense.png)\n\nSource: {s3}.")


if __name__ == "__main__":
    main()
