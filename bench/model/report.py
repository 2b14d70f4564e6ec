#!/usr/bin/env python3
"""Renders bench/model/bench_model.py's JSON: a markdown table (dense against twblas per point,
ratios as dense / twblas, so above 1 means twblas is faster or uses less) and a PNG plot.

    python3 bench/model/report.py bench/results/h200-model.json            # table on stdout
    python3 bench/model/report.py bench/results/h200-model.json --md out.md --png out.png

Without --png the plot goes beside the JSON (<name>.png); it needs matplotlib (skipped, with a
note, where it is missing).
"""

import argparse
import json
import os
import sys

MODE_ORDER = {"prefill": 0, "decode-eager": 1, "decode-graph": 2, "train": 3}
# rounds that differ by more than this (either variant) compare something other than the variants
# (the host's state, for host-bound loops): no time or energy ratio is given for them
SPREAD_LIMIT = 0.2


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def _ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def settled(d, t):
    """Whether both variants' rounds agree (their ratios mean something)."""
    return all(r is not None and (r.get("ms_spread") or 0) <= SPREAD_LIMIT for r in (d, t))


def rows(doc):
    """Paired points: [(key, dense record or None, twblas record or None)] in a stable order."""
    pairs = {}
    for r in doc.get("records", []):
        key = (r["model"], r["layers"], r["mode"], r["batch"], r["seq"])
        pairs.setdefault(key, {})[r["variant"]] = r
    order = sorted(pairs, key=lambda k: (k[1], k[0], MODE_ORDER.get(k[2], 9), k[3], k[4]))
    return [(k, pairs[k].get("dense"), pairs[k].get("twblas")) for k in order]


def table(doc):
    out = []
    out.append(f"GPU: {doc.get('gpu_name')}; torch {doc.get('torch')}, transformers {doc.get('transformers')}, "
               f"twblas {doc.get('twblas')}, {doc.get('dtype')}; {doc.get('date', '')[:19]}"
               + (" (--quick)" if doc.get("quick") else "") + (" (--tiny: numbers meaningless)" if doc.get("tiny") else ""))
    planted = doc.get("planted", {})
    out.append(f"Planted sparsity: {planted.get('active_units_target')} active units a token a layer targeted "
               "(bias channel, bench/model/README.md); ratios are dense / twblas (> 1: twblas faster or smaller).")
    learned = doc.get("learned")
    if learned:
        out.append(f"Learned sparsity (model `learned`): {learned.get('example')}'s LM trained {learned.get('steps')} "
                   f"steps with L1 {learned.get('l1_coeff')} on {learned.get('text')}; held-out loss "
                   f"{_f(learned.get('val_loss'), '{:.3f}')}, active units per layer {learned.get('active_per_layer')} "
                   f"of {learned.get('d_ff')}.")
    out.append("")
    out.append("| model | mode | batch x seq | dense ms | twblas ms | speedup | dense tok/s | twblas tok/s "
               "| peak GiB dense / twblas | mJ/token dense / twblas | FFN ms dense / twblas (speedup) "
               "| FFN share (dense) | active units dense / twblas | rounds' spread dense / twblas |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (model, layers, mode, batch, seq), d, t in rows(doc):
        name = f"{model} ({layers} L)"
        shape = f"{batch} x {seq}" if not mode.startswith("decode") else f"{batch} (ctx {(d or t or {}).get('ctx', '?')})"

        def g(r, k):
            return None if r is None or r.get("error") else r.get(k)

        err = "; ".join(f"{v}: {r['error'][:80]}" for v, r in (("dense", d), ("twblas", t)) if r and r.get("error"))
        jd, jt = g(d, "j_per_token"), g(t, "j_per_token")
        fd, ft = g(d, "ffn_ms"), g(t, "ffn_ms")
        speedup = _f(_ratio(g(d, "ms"), g(t, "ms")), "**{:.2f}x**") if settled(d, t) else "- (rounds disagree)"
        out.append("| " + " | ".join([
            name, mode, shape, _f(g(d, "ms"), "{:.3f}"), _f(g(t, "ms"), "{:.3f}"),
            speedup,
            _f(g(d, "tokens_per_s"), "{:.0f}"), _f(g(t, "tokens_per_s"), "{:.0f}"),
            f"{_f(g(d, 'peak_gib'))} / {_f(g(t, 'peak_gib'))}",
            f"{_f(jd and jd * 1e3, '{:.3f}')} / {_f(jt and jt * 1e3, '{:.3f}')}",
            f"{_f(fd, '{:.3f}')} / {_f(ft, '{:.3f}')} ({_f(_ratio(fd, ft), '{:.2f}x')})",
            _f(g(d, "ffn_share"), "{:.0%}"),
            f"{_f(g(d, 'active_units'), '{:.1f}')} / {_f(g(t, 'active_units'), '{:.1f}')}",
            f"{_f(g(d, 'ms_spread'), '{:.1%}')} / {_f(g(t, 'ms_spread'), '{:.1%}')}",
        ]) + " |" + (f" {err}" if err else ""))
    return "\n".join(out)


def plot(doc, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no plot: matplotlib is not installed; pip install matplotlib for {path})", file=sys.stderr)
        return False
    labels, model_x, ffn_x, energy_x = [], [], [], []
    for (model, layers, mode, batch, seq), d, t in rows(doc):
        if not d or not t or d.get("error") or t.get("error"):
            continue
        labels.append(f"{model} {mode} b{batch}" + (f"x{seq}" if not mode.startswith("decode") else ""))
        ok = settled(d, t)
        model_x.append(_ratio(d["ms"], t["ms"]) if ok else None)
        ffn_x.append(_ratio(d.get("ffn_ms"), t.get("ffn_ms")))
        energy_x.append(_ratio(d.get("j_per_token"), t.get("j_per_token")) if ok else None)
    if not labels:
        print("(no plot: no paired points)", file=sys.stderr)
        return False
    n = len(labels)
    fig, ax = plt.subplots(figsize=(9, 0.42 * n + 1.6))
    ys = list(range(n))
    h = 0.27
    for off, vals, name, color in ((-h, model_x, "whole model (time)", "tab:blue"),
                                   (0.0, ffn_x, "FFN inside the model (time)", "tab:orange"),
                                   (h, energy_x, "energy per token", "tab:green")):
        pts = [(y + off, v) for y, v in zip(ys, vals) if v is not None]
        if pts:
            ax.barh([p[0] for p in pts], [p[1] for p in pts], height=h, label=name, color=color)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("dense / twblas (> 1: twblas better)")
    ax.set_title(f"HF Llama, dense vs twblas.sparsify, {doc.get('gpu_name')} ({doc.get('dtype')})", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("--md", help="write the table here too")
    ap.add_argument("--png", help="the plot (default: beside the JSON)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    with open(args.json) as f:
        doc = json.load(f)
    text = table(doc)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    if not args.no_plot:
        png = args.png or os.path.splitext(args.json)[0] + ".png"
        if plot(doc, png):
            print(f"\n(plot: {png})", file=sys.stderr)


if __name__ == "__main__":
    main()
