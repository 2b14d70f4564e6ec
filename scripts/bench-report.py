#!/usr/bin/env python3
"""Writes docs/benchmarks.md and its plots from the twblas-bench JSON in bench/results.

    python3 scripts/bench-report.py [--results bench/results] [--docs docs] [--no-plots]

Each file in bench/results is one run of one suite on one GPU, named <gpu>-<suite>[-<set>].json
(bench/results/README.md). Every ratio compares timings of one file (one run, one card). The
plots need matplotlib; without it (or with --no-plots) the PNGs are left as they are.
"""
import argparse
import json
import math
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "model"))
import report  # noqa: E402  (bench/model/report.py: the whole model's table, plot and SPREAD_LIMIT)

FFN = re.compile(r"^ffn/(?P<variant>[a-z0-9_]+)/d(?P<d>\d+)_h(?P<h>\d+)/(?P<profile>[a-z0-9.+-]+)/m(?P<m>\d+)/")
FLOOR = re.compile(r"^floor/read/d(?P<d>\d+)_h(?P<h>\d+)/")
CONV = re.compile(r"^conv/(?P<variant>[a-z0-9_]+)/d(?P<h>\d+)/(?P<profile>[a-z0-9.+-]+)/m(?P<m>\d+)/")
UNIT = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
PAPER, LLAMA = (2048, 5632), (4096, 14336)
SHAPE_NAME = {PAPER: "the paper's shape (D 2048, H 5632)", LLAMA: "Llama-3-8B's shape (D 4096, H 14336)"}

DENSE_FFN = ("the dense cuBLAS FFN of the same data in the same run (cuBLASLt [g | u] = X [Wg; Wu]^T as one "
             "GEMM, h = ReLU(g) u, Y = h Wd), also replayed from a CUDA graph")


class Run:
    """One JSON file: its context and its medians, keyed by problem then variant."""

    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)
        with open(path) as f:
            data = json.load(f)
        self.ctx = data.get("context", {})
        self.rows = defaultdict(dict)  # (d, h, profile, m) or ("conv", h, profile, m) -> variant -> entry
        self.copy_bw = None
        self.read_bw = {}  # (d, h) -> the read floor's rate: its gate weights read once from DRAM
        for b in data.get("benchmarks", []):
            if b.get("aggregate_name") != "median" or b.get("error_occurred"):
                continue
            entry = {k: v for k, v in b.items() if isinstance(v, (int, float))}
            entry["ms"] = b["real_time"] * UNIT[b.get("time_unit", "us")]
            if b["name"].startswith("copy/"):
                self.copy_bw = b.get("copy_bw")
            elif m := FLOOR.match(b["name"]):
                self.read_bw[(int(m["d"]), int(m["h"]))] = b.get("read_bw")
            elif m := FFN.match(b["name"]):
                self.rows[(int(m["d"]), int(m["h"]), m["profile"], int(m["m"]))][m["variant"]] = entry
            elif m := CONV.match(b["name"]):
                self.rows[("conv", int(m["h"]), m["profile"], int(m["m"]))][m["variant"]] = entry

    def gpu(self):
        return self.ctx.get("gpu", "unknown GPU")

    def source(self):
        return (f"{self.gpu()} ({self.ctx.get('sm_count', '?')} SMs, CUDA runtime {self.ctx.get('cuda_runtime', '?')}), "
                f"`bench/results/{self.name}` ({self.ctx.get('date', '?')[:10]})")

    def get(self, key, variant, field="ms"):
        return self.rows.get(key, {}).get(variant, {}).get(field)


def ms(x):
    return "" if x is None else (f"{x * 1e3:.1f} us" if x < 1 else f"{x:.3f} ms")


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def rx(x, suffix="x"):
    return "" if x is None else f"{x:.2f}{suffix}"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def load(results, name):
    path = os.path.join(results, name)
    return Run(path) if os.path.exists(path) else None


# ---- serving: 1 to 512 tokens

def serving_keys(run, shape, profile):
    return sorted(k for k in run.rows if k[:3] == (*shape, profile) and "twblas" in run.rows[k])


def read_floor(run, shape, profile):
    """The shape's read floor (bytes per second) where the run has it and read_rate on its rows."""
    floor = run.read_bw.get(shape)
    keys = serving_keys(run, shape, profile)
    return floor if floor and any(run.get(k, "twblas", "read_rate") for k in keys) else None


def serving_table(run, shape, profile):
    keys = serving_keys(run, shape, profile)
    if not keys:
        return None
    floor = read_floor(run, shape, profile)
    body = []
    for k in keys:
        tw, de = run.get(k, "twblas"), run.get(k, "dense")
        te, dee = run.get(k, "twblas_eager"), run.get(k, "dense_eager")
        host = run.get(k, "twblas_eager", "host_us")
        bw = run.get(k, "twblas", "need_bw")
        t = run.rows[k]["twblas"]
        act = f"{t['mean_nnz']:.1f}, {int(t['max_nnz'])}" if "mean_nnz" in t else ""
        body.append([str(k[3]), act, ms(tw), ms(de), rx(ratio(de, tw)), ms(te), ms(dee), rx(ratio(dee, te)),
                     "" if host is None else f"{host:.1f} us",
                     "" if bw is None or not run.copy_bw else f"{100 * bw / run.copy_bw:.0f} %"])
        if floor:
            rate = run.get(k, "twblas", "read_rate")
            body[-1].append("" if rate is None else f"{100 * rate / floor:.0f} %")
    return table(["M", "active/token (mean, max)", "twblas", "dense", "vs dense", "twblas eager", "dense eager",
                  "eager vs dense", "host time / eager call", "bytes' rate / copy rate"]
                 + (["% of read floor"] if floor else []), body)


def serving_section(results):
    out = ["## 1. Serving and decode: 1 to 512 tokens", "",
           "Baseline: " + DENSE_FFN + ". The eager columns call both without a graph, N calls back to back "
           "on one stream (time per call with the launch gaps; host time per call beside). \"Bytes' rate / "
           "copy rate\": the bytes a call must read (Wg, the rows of the units active for some token, X, Y) "
           "per second of the graph-replayed call, against the device-to-device copy rate of the same run. "
           "uniform-29: about 29 active units a token (35 at one token); llm-29: the first M tokens of a "
           "sequence, whose first tokens have ~600 active units, so the FFN runs in dense mode (cuBLAS "
           "projections) from a few tokens on."]
    for name, shape, profile in (("h100-serving.json", PAPER, "uniform-29"), ("h100-serving-llama.json", LLAMA, "uniform-29"),
                                 ("h100-serving-llm29.json", PAPER, "llm-29"), ("h200-serving.json", PAPER, "uniform-29"),
                                 ("h200-serving-llama.json", LLAMA, "uniform-29"),
                                 ("h200-serving-llm29.json", PAPER, "llm-29")):
        run = load(results, name)
        t = run and serving_table(run, shape, profile)
        if t:
            floor = read_floor(run, shape, profile)
            note = ("" if not floor else
                    " \"% of read floor\": the bytes the call must read (X, Wg, the Wu and Wd rows of the units "
                    "active for some token) per second of the graph-replayed call, against a plain kernel reading "
                    f"Wg's bytes once from DRAM in the same run ({floor / 1e12:.2f} TB/s, launch included).")
            out += ["", f"### {run.gpu()}, {SHAPE_NAME[shape]}, {profile}", "", f"From {run.source()}.{note}", "", t]
    return out


# ---- prefill-size FFN: 4096 tokens and more, sparsity profiles

def uniform_points(run):
    return sorted((v["twblas"].get("mean_nnz", 0.0), v["dense"]["ms"] / v["twblas"]["ms"])
                  for k, v in run.rows.items() if k[:2] == PAPER and k[3] == 16384 and k[2].startswith("uniform")
                  and "twblas" in v and "dense" in v)


def break_even(run):
    """Active units where the uniform-k speedup crosses 1 (log-linear interpolation)."""
    pts = uniform_points(run)
    for (k0, s0), (k1, s1) in zip(pts, pts[1:]):
        if s0 >= 1.0 > s1:
            f = (s0 - 1.0) / (s0 - s1)
            return math.exp(math.log(k0) + f * (math.log(k1) - math.log(k0)))
    return None


def batch_section(results):
    out = []
    for name in ("h200-full.json", "h100-full.json"):
        run = load(results, name)
        if run:
            out += batch_tables(run, first=not out)
    return out


def batch_tables(run, first):
    def order(k):
        family, kk = k[2].rsplit("-", 1)
        return (k[0], k[2] != "uniform-29", family != "uniform", family, float(kk), k[3])

    keys = sorted((k for k in run.rows if k[0] != "conv" and k[3] >= 4096 and "twblas" in run.rows[k]), key=order)
    newer = any("dense_fused" in run.rows[k] for k in keys)  # FP8, the fused dense FFN, training
    body = []
    for k in keys:
        tw, de, ga, cs = (run.get(k, v) for v in ("twblas", "dense", "gate", "cusparse"))
        t = run.rows[k]["twblas"]
        row = [f"{k[0]} x {k[1]}", k[2], str(k[3]), f"{t.get('mean_nnz', 0):.1f}", str(int(t.get("overflow_rows", 0))),
               ms(tw), ms(de), ms(ga), ms(cs), rx(ratio(de, tw)), rx(ratio(tw, ga), ""), rx(ratio(cs, tw))]
        if newer:
            row += [rx(ratio(run.get(k, "dense_fused"), tw)), rx(ratio(de, run.get(k, "twblas_fp8"))),
                    rx(ratio(run.get(k, "train_dense"), run.get(k, "train_twblas")))]
        body.append(row)
    head = ["D x H", "profile", "M", "active/token", "dense-path rows", "twblas", "dense", "gate GEMM", "cuSPARSE",
            "vs dense", "/ gate", "vs cuSPARSE"]
    if newer:
        head += ["vs fused dense", "FP8 vs dense", "training vs dense"]
    if not first:
        return ["", f"### {run.gpu()}, both shapes, sparsity profiles", "", f"From {run.source()}.", "",
                table(head, body)]
    out = ["## 2. Prefill-size FFN: 4096 tokens and more", "", f"### {run.gpu()}, both shapes, sparsity profiles", "",
           f"From {run.source()}. Baseline: " + DENSE_FFN + "; \"/ gate\" is twblas's time over the gate GEMM "
           "alone (X Wg^T, the floor no sparse method skips); the cuSPARSE pipeline is cuBLAS's gate+up GEMM, "
           "ReLU * product, cusparseDenseToSparse (CSR) and cusparseSpMM (cuSPARSE's SDDMM has no bf16, so its "
           "up projection is dense; its dense -> CSR needs the count on the host, so it is timed phase by phase, "
           "not in a graph). Profiles: uniform-k, k active units a token on average; heavy-29, 1 % of the rows "
           "with hundreds of units (the dense path's rows); llm-29, activations shaped like a trained model's.",
           "", table(head, body)]
    be = break_even(run)
    if be:
        out += ["", f"Break-even at 16384 tokens (uniform-k): twblas is faster than the dense FFN below about {be:.0f} "
                f"active units a token ({100 * be / PAPER[1]:.1f} % of H), interpolated between the measured points; "
                "above it dense mode keeps it at the dense time."
                + (" The FP8 suite (section 5) re-times DEFAULT at these sizes with a newer library."
                   if run.name == "h100-full.json" else "")]
    elif uniform_points(run):
        pts = uniform_points(run)
        out += ["", f"At 16384 tokens twblas is at least as fast as the dense FFN at every uniform-k point measured "
                f"({pts[0][0]:.0f} to {pts[-1][0]:.0f} active units a token: {min(s for _, s in pts):.2f}x to "
                f"{max(s for _, s in pts):.2f}x); past the sparse paths' break-even dense mode runs the dense FFN's "
                "GEMMs."]
    out += ["", "![speedup against sparsity](speedup-vs-sparsity.png)", "",
            "![speedup against tokens per call](speedup-vs-tokens.png)"]
    return out


# ---- training

def train_section(results):
    out = []
    for name in ("h200-train.json", "h100-train.json"):
        out += train_tables(load(results, name), first=not out)
    run = load(results, "h100-train-eager.json")
    return out + train_eager_tables(run)


def train_tables(run, first):
    out = []
    if run:
        body = []
        pinned = False  # a row timed only with TW_FFN_ATTR_SAVE_DENSE (runs without the default there)
        for k in sorted(run.rows, key=lambda k: (k[3], k[2] != "uniform-29", k[2])):
            v = run.rows[k]
            variant = "train_twblas" if "train_twblas" in v else "train_twblas_save_dense"
            t, de = v.get(variant), run.get(k, "train_dense")
            if not t:
                continue
            pinned |= variant.endswith("save_dense")
            errs = ", ".join(f"{t.get(e, float('nan')):.1e}" for e in ("rel_err_dx", "rel_err_dwgu", "rel_err_dwd"))
            body.append([k[2], str(k[3]), f"{t.get('mean_nnz', 0):.1f}",
                         "SAVE_DENSE" if variant.endswith("save_dense") else "", ms(t["ms"]), ms(de),
                         rx(ratio(de, t["ms"])), f"{t.get('saved_over_dense_h', 0):.3f}", errs])
        out += (["## 3. Training: forward + backward", ""] if first else [""]) + [f"### {run.gpu()}, the paper's shape, 16384 tokens", "",
                f"From {run.source()}; {SHAPE_NAME[PAPER]}, bf16, l1Coeff 1e-3, one forward + backward replayed "
                "from a CUDA graph. Baseline: the dense step in the same run, cuBLASLt [g | u] = X [Wg; Wu]^T, "
                "h = ReLU(g) u, Y = h Wd; dH = dY Wd^T, the element-wise backward (L1 term included), dX, "
                "[dWg; dWu] and dWd: nine GEMMs' worth of flops, keeping [g | u] and h (3 M x H values). The "
                "gradients are checked against it before timing (relative errors in the last column). At 100 "
                "and 911 active units the FFN is in dense mode; "
                + ("the rows marked SAVE_DENSE set TW_FFN_ATTR_SAVE_DENSE." if pinned else
                   "with default attributes its forward saves the dense form itself (saved state about twice "
                   "the dense h)."), "",
                table(["profile", "M", "active/token", "mode", "twblas step", "dense step", "vs dense",
                       "saved state / dense h", "rel. err dX, dW[g;u], dWd"], body)]
    return out


def train_eager_tables(run):
    out = []
    if run:
        body = []
        for k, v in sorted(run.rows.items()):
            body.append([f"{k[0]} x {k[1]}", k[2], str(k[3]), ms(run.get(k, "train_twblas")), ms(run.get(k, "train_dense")),
                         rx(ratio(run.get(k, "train_dense"), run.get(k, "train_twblas"))),
                         ms(run.get(k, "train_twblas_eager")), ms(run.get(k, "train_dense_eager")),
                         f"{run.get(k, 'train_twblas_eager', 'host_us') or 0:.0f} / "
                         f"{run.get(k, 'train_dense_eager', 'host_us') or 0:.0f} us"])
        out += ["", f"### {run.gpu()}, a small layer with hot units", "",
                f"From {run.source()}: the PyTorch example's layer (D 512, H 2048), about 6 active units a token "
                "plus 8 units active on every token, against the same dense step; graph-replayed and eager "
                "(host time per step: twblas / dense).", "",
                table(["D x H", "profile", "M", "twblas", "dense", "vs dense", "twblas eager", "dense eager",
                       "host time"], body)]
    if out:
        out += ["", "![training step against dense](training-vs-dense.png)"]
    return out


# ---- conversions

CONV_PAIRS = (  # label, twblas variant, baseline variant, baseline label
    ("dense -> TwELL (analysis + convert)", "twblas_dense_to_twell", "cusparse_dense_to_csr", "cuSPARSE dense -> CSR"),
    ("dense -> TwELL (convert alone)", "twblas_dense_to_twell_convert", "cusparse_dense_to_csr", "cuSPARSE dense -> CSR"),
    ("TwELL -> dense", "twblas_twell_to_dense", "cusparse_csr_to_dense", "cuSPARSE CSR -> dense"),
    ("TwELL -> dense, 8 queued", "twblas_twell_to_dense_queued", "cusparse_csr_to_dense_queued", "cuSPARSE CSR -> dense, 8 queued"),
    ("dense -> hybrid", "twblas_dense_to_hybrid", "cusparse_dense_to_csr", "cuSPARSE dense -> CSR"),
    ("hybrid transpose", "twblas_hybrid_transpose", None, ""),
    ("validate (TwELL)", "twblas_twell_validate", None, ""),
    ("info (TwELL)", "twblas_twell_info", None, ""),
    ("twGemmToSparse (gate GEMM into TwELL, ReLU)", "twblas_gemm_to_twell", "cublas_gate_gemm", "cuBLASLt gate GEMM, dense output"),
)


def conv_table(run, skip=()):
    """One row per operation and profile; a column per size: twblas's time (baseline / twblas)."""
    sizes = sorted({k[3] for k in run.rows if k[0] == "conv"})
    body = []
    for label, tw, base, base_label in CONV_PAIRS:
        if tw in skip:
            continue
        for prof in sorted({k[2] for k in run.rows if k[0] == "conv" and tw in run.rows[k]}, key=lambda p: (p != "uniform-29", p)):
            cells = []
            for m in sizes:
                k = ("conv", PAPER[1], prof, m)
                t, b = run.get(k, tw), run.get(k, base) if base else None
                cells.append(ms(t) + (f" ({rx(ratio(b, t))})" if b is not None and t is not None else ""))
            body.append([label, base_label or "none", prof] + cells)
    return table(["operation", "baseline", "profile"] + [f"{m} rows" for m in sizes], body)


def conv_section(results):
    out = []
    run = load(results, "h100-conversions.json")
    newer = load(results, "h100-conversions-gemm-to-sparse.json")
    if run:
        out += ["## 4. Conversions", "", f"### {run.gpu()}, every conversion", "",
                f"From {run.source()}. The matrix is the FFN's hidden activation h = ReLU(X Wg^T) at H = 5632 "
                "(bf16, row-major, M rows). Every entry, cuSPARSE's too, is timed as a user makes the calls: host "
                "wall time from before the first call to after the stream synchronisation (twblas's setup calls "
                "may synchronise, so nothing is graph-captured); \"8 queued\" is eight calls per synchronisation. "
                "Baselines: cuSPARSE's dense <-> CSR (int32 indices, bf16 values) on the same matrix, and for "
                "twGemmToSparse cuBLASLt's gate GEMM into a dense output. Each cell: twblas's time (the baseline's "
                "time over twblas's: above 1, twblas is faster). The copy rate of this run: "
                f"{(run.copy_bw or 0) / 1e12:.2f} TB/s.", "",
                conv_table(run, skip=("twblas_gemm_to_twell",) if newer else ())]
    if newer:
        out += ["", f"### {newer.gpu()}, twGemmToSparse (a newer run)", "", f"From {newer.source()}.", "",
                conv_table(newer)]
    h200 = load(results, "h200-conversions-to-dense.json")
    if h200:
        out += ["", f"### {h200.gpu()}: TwELL -> dense", "", f"From {h200.source()}.", "", conv_table(h200)]
    return out


# ---- FP8 weights

def model_section(results, docs=None):
    """The whole model (bench/model): its own report's table, and its plot beside this page's."""
    path = os.path.join(results, "h200-model.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        doc = json.load(f)
    if docs:
        report.plot(doc, os.path.join(docs, "model-h200.png"))
    return ["## 0. The whole model: Hugging Face Llama, dense against sparsify()", "",
            "From `bench/results/h200-model.json` (`bench/model/bench_model.py`, method and planted sparsity in "
            "[bench/model/README.md](../bench/model/README.md)): the paper's 2B shape (38 layers, D 2048, H 5632, "
            "ReLU gated FFN), the model body without the LM head, the dense model and the same model after "
            "`twblas.torch.sparsify()` in one process, alternating rounds. Baseline: the dense HF model "
            "(PyTorch's matmuls). Eager decode is host-bound (HF's Python); its loops run at KV-cache lengths "
            "visited once before them, as in a process that has decoded before (a new length's first step is "
            "slow whichever variant makes it; bench/model/README.md).", "",
            report.table(doc), "", "![the whole model, dense against twblas](model-h200.png)"]


# ---- the README's two tables (between their markers)

MODE_NAMES = {"prefill": "prefill", "decode-eager": "decode step, eager", "decode-graph": "decode step, CUDA graph",
              "train": "training step (AdamW)"}


def readme_model_table(results):
    path = os.path.join(results, "h200-model.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        doc = json.load(f)
    pairs = {}
    for r in doc.get("records", []):
        if not r.get("error"):
            pairs.setdefault((r["model"], r["mode"], r["batch"], r["seq"]), {})[r["variant"]] = r
    order = {"prefill": 0, "decode-graph": 1, "decode-eager": 2, "train": 3}
    body, noisy = [], []
    for k in sorted(pairs, key=lambda k: (k[0], order.get(k[1], 9), k[2])):
        d, t = pairs[k].get("dense"), pairs[k].get("twblas")
        if not d or not t:
            continue
        shape = f"{k[2]} x {k[3]}" if k[1] in ("prefill", "train") else f"batch {k[2]}"
        if not report.settled(d, t):  # the rounds disagree: not the variants set the time
            best = ""
            if d.get("ms_rounds") and t.get("ms_rounds"):
                best = (f" (rounds {' / '.join(f'{x:.1f}' for x in d['ms_rounds'])} against "
                        f"{' / '.join(f'{x:.1f}' for x in t['ms_rounds'])} ms")
                if d.get("ffn_host_ms") is not None and t.get("ffn_host_ms") is not None:
                    best += f"; host time in the MLPs {d['ffn_host_ms']:.1f} against {t['ffn_host_ms']:.1f} ms a step"
                best += ")"
            noisy.append(f"{MODE_NAMES.get(k[1], k[1])} {shape}{best}")
            continue
        body.append([f"{k[0].upper()}, {MODE_NAMES.get(k[1], k[1])}, {shape}", f"{d['ms']:.2f} ms", f"{t['ms']:.2f} ms",
                     rx(ratio(d["ms"], t["ms"])),
                     f"{d['peak_gib']:.2f} / {t['peak_gib']:.2f} GiB"])
    return (f"One {doc.get('gpu_name')}, bf16, torch {doc.get('torch')}, transformers {doc.get('transformers')}: "
            "the paper's 2B shape as a Hugging Face Llama (38 layers, D 2048, H 5632, ReLU gated MLPs, about 29 "
            "active units a token planted in the real model), dense against the same model after `sparsify()`, "
            "one process (`bench/results/h200-model.json`, [docs/benchmarks.md](docs/benchmarks.md)):\n\n"
            + table(["what", "dense HF", "twblas", "speedup", "peak memory dense / twblas"], body)
            + ("\n\nLeft out, their alternating rounds differing by more than 20 % (dense against twblas in "
               "parentheses): " + "; ".join(noisy) + ". Such rounds measure something besides the variants: "
               "the loops are host-bound (HF's Python) and their steps vary from one loop to the next by "
               "more than the FFN changes; the host time in the MLPs is what the FFN changes." if noisy else ""))


def readme_ffn_table(results):
    # each row from the newest run that has it: the serving and sweep suites are re-run as the
    # kernels change, the fp8 and train suites less often
    runs = {name: load(results, name) for name in
            ("h200-serving.json", "h200-sweep.json", "h200-full.json", "h200-fp8.json", "h200-train.json")}
    if not runs["h200-fp8.json"] and not runs["h200-sweep.json"]:
        return None

    def pick(key, tw_variant, de_variant, names):
        for name in names:
            run = runs.get(name)
            if run and run.get(key, tw_variant) and run.get(key, de_variant):
                return run.get(key, tw_variant), run.get(key, de_variant), name
        return None

    def fmt(value, m):
        return f"{value * 1e3:.1f} us" if m <= 512 else f"{value:.3f} ms"

    rows = [(f"forward, {m} token{'s' if m > 1 else ''}", (2048, 5632, "uniform-29", m), "twblas", "dense", m,
             ("h200-serving.json", "h200-sweep.json", "h200-full.json", "h200-fp8.json"))
            for m in (1, 8, 64, 512, 16384, 65536)]
    rows.append(("forward, 16384 tokens, 1 % dense rows (exact)", (2048, 5632, "heavy-29", 16384), "twblas", "dense",
                 16384, ("h200-full.json", "h200-fp8.json")))
    rows.append(("training, forward + backward, 16384 tokens", (2048, 5632, "uniform-29", 16384), "train_twblas",
                 "train_dense", 16384, ("h200-sweep.json", "h200-full.json", "h200-train.json")))
    body = []
    for label, key, tw_variant, de_variant, m, names in rows:
        got = pick(key, tw_variant, de_variant, names)
        if got:
            tw, de, name = got
            body.append([label, fmt(tw, m), fmt(de, m), rx(ratio(de, tw)), f"`{name}`"])
    gpu = next(run for run in runs.values() if run).gpu()
    text = (f"The FFN alone, one {gpu}, the paper's shape, 29 active units a token, CUDA-graph replay; "
            "baseline: " + DENSE_FFN + " (each row's file in `bench/results/`):\n\n"
            + table(["case", "twblas", "dense cuBLAS", "speedup", "from"], body))
    sweep = load(results, "h200-sweep.json")
    if sweep:
        def vs_fused(k, m):
            return ratio(sweep.get((2048, 5632, f"uniform-{k}", m), "dense_fused"),
                         sweep.get((2048, 5632, f"uniform-{k}", m), "twblas"))
        dense_ks = [k for k in (100, 300, 911, 2816) if vs_fused(k, 16384)]
        low = [vs_fused(k, m) for k in dense_ks for m in (512, 16384) if vs_fused(k, m)]
        text += ("\n\nAgainst the strongest dense FFN, gate and up as one CUTLASS GEMM with ReLU(z) u in its "
                 f"epilogue (`bench/results/h200-sweep.json`): {rx(vs_fused(29, 512))} at 512 tokens and "
                 f"{rx(vs_fused(29, 16384))} at 16384 with 29 active units a token"
                 + (f"; with 100 to 2816 active units a token {min(low):.2f}-{max(low):.2f}x, not yet level "
                    "([docs/benchmarks.md](docs/benchmarks.md), section 6)." if low else "."))
    return text


def update_readme(results, path):
    if not os.path.exists(path):
        return
    with open(path) as f:
        text = f.read()
    for name, make in (("model", readme_model_table), ("ffn", readme_ffn_table)):
        start, end = f"<!-- {name} table: generated by scripts/bench-report.py -->", f"<!-- end of {name} table -->"
        content = make(results)
        if content is None or start not in text or end not in text:
            continue
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + start + "\n" + content + "\n" + end + tail
    with open(path, "w") as f:
        f.write(text)


def fp8_section(results):
    out = []
    for name in ("h200-fp8.json", "h100-fp8.json"):
        t = fp8_tables(load(results, name), first=not out)
        out += ([""] if out and t else []) + t
    return out


def fp8_tables(run, first):
    if not run:
        return []
    body = []
    for k in sorted((k for k in run.rows if "twblas_fp8" in run.rows[k]), key=lambda k: (k[2] != "uniform-29", k[2], k[3])):
        tw, fp, de, ga = (run.get(k, v) for v in ("twblas", "twblas_fp8", "dense", "gate"))
        err = run.get(k, "twblas_fp8", "rel_err_vs_dense")
        body.append([k[2], str(k[3]), ms(tw), ms(fp), ms(de), ms(ga), rx(ratio(de, tw)), rx(ratio(de, fp)),
                     rx(ratio(fp, ga), ""), "" if err is None else f"{err:.3f}"])
    return (["## 5. FP8 weights (TW_COMPUTE_FP8_WEIGHTS)", ""] if first else []) + [f"### {run.gpu()}, the paper's shape", "",
            f"From {run.source()}; {SHAPE_NAME[PAPER]}. The opt-in reads the active units' up and down rows as FP8 "
            "E4M3 with a scale per row (docs/api-guide.md, section 4); the gate stays bf16. Baseline: " + DENSE_FFN +
            ", and the gate GEMM alone. The last column is the FP8 result's normwise distance from the dense "
            "bf16 FFN.", "",
            table(["profile", "M", "DEFAULT", "FP8", "dense", "gate GEMM", "DEFAULT vs dense", "FP8 vs dense",
                   "FP8 / gate", "FP8 rel. err"], body)]


def sweep_section(results):
    run = load(results, "h200-sweep.json")
    if not run:
        return []
    body = []
    for k in sorted(run.rows, key=lambda k: (k[3], int(k[2].split("-")[1]))):
        g = {v: run.get(k, v) for v in ("twblas", "twblas_fp8", "dense", "dense_fused", "train_twblas", "train_dense")}
        body.append([k[2].split("-")[1], str(k[3]), ms(g["twblas"]), ms(g["twblas_fp8"]), ms(g["dense"]),
                     ms(g["dense_fused"]), rx(ratio(g["dense"], g["twblas"])), rx(ratio(g["dense_fused"], g["twblas"])),
                     rx(ratio(g["dense"], g["twblas_fp8"])), ms(g["train_twblas"]), ms(g["train_dense"]),
                     rx(ratio(g["train_dense"], g["train_twblas"]))])
    return ["## 6. Sparsity sweep: where sparse stops paying", "",
            f"From {run.source()}; {SHAPE_NAME[PAPER]}, uniform profiles of k active units a token, default "
            "attributes. Two dense baselines: " + DENSE_FFN + "; and the fused dense FFN (gate and up as one "
            "CUTLASS GEMM of N = 2H whose epilogue forms ReLU(z) u, then the down GEMM), as well-tuned inference "
            "engines run it. Training: forward + backward against the dense step, the saved state sized after "
            "the FFN settled (as a framework sizing it per step does), so that dense-mode steps keep z and u "
            "(TW_SAVE_DENSE_AUTO, the default).", "",
            table(["k", "M", "DEFAULT", "FP8", "dense", "fused dense", "vs dense", "vs fused dense", "FP8 vs dense",
                   "training", "dense step", "training vs dense"], body)]


# ---- plots

def plots(results, docs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def foot(fig, text):
        fig.text(0.01, 0.01, text, fontsize=6, color="gray")

    full = load(results, "h100-full.json")
    if full:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        pts = sorted((v["twblas"].get("mean_nnz", 0.0), v["dense"]["ms"] / v["twblas"]["ms"],
                      v["dense"]["ms"] / v["cusparse"]["ms"] if "cusparse" in v else None, k[2])
                     for k, v in full.rows.items() if k[:2] == PAPER and k[3] == 16384 and "twblas" in v and "dense" in v)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label="twblas / dense cuBLAS FFN")
        cs = [p for p in pts if p[2] is not None]
        ax.plot([p[0] for p in cs], [p[2] for p in cs], "s", label="cuSPARSE pipeline / dense cuBLAS FFN")
        for p in pts:
            ax.annotate(p[3], (p[0], p[1]), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xscale="log", xlabel="active units per token (mean, of H = 5632)", ylabel="speedup over dense (x)",
               title="D 2048, H 5632, M 16384, bf16, graph replay")
        ax.legend(fontsize=8)
        foot(fig, f"{full.gpu()}, bench/results/{full.name}")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(os.path.join(docs, "speedup-vs-sparsity.png"), dpi=100)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.8))
    notes = []
    for name, shape, style, label in (("h100-serving.json", PAPER, "o-", "paper's shape"),
                                      ("h100-serving-llama.json", LLAMA, "^-", "Llama-3-8B's shape")):
        run = load(results, name)
        if not run:
            continue
        keys = sorted(k for k in run.rows if k[:3] == (*shape, "uniform-29") and "twblas" in run.rows[k] and "dense" in run.rows[k])
        ax.plot([k[3] for k in keys], [ratio(run.get(k, "dense"), run.get(k, "twblas")) for k in keys], style,
                label=f"graph, {label}")
        eager = [k for k in keys if "twblas_eager" in run.rows[k] and "dense_eager" in run.rows[k]]
        ax.plot([k[3] for k in eager], [ratio(run.get(k, "dense_eager"), run.get(k, "twblas_eager")) for k in eager],
                style[0] + ":", alpha=0.7, label=f"eager, {label}")
        notes.append(name)
    if full:
        keys = sorted(k for k in full.rows if k[:3] == (*PAPER, "uniform-29") and k[3] > 512 and "twblas" in full.rows[k])
        ax.plot([k[3] for k in keys], [ratio(full.get(k, "dense"), full.get(k, "twblas")) for k in keys], "D-",
                label="graph, paper's shape, batch sizes")
        notes.append(full.name)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="tokens per call (M)", ylabel="speedup over the dense cuBLAS FFN (x)",
           title="uniform-29, bf16, one H100")
    ax.legend(fontsize=7)
    foot(fig, "bench/results/: " + ", ".join(notes))
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(os.path.join(docs, "speedup-vs-tokens.png"), dpi=100)
    plt.close(fig)

    train = load(results, "h100-train.json")
    if train:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        pts = []
        for k, v in train.rows.items():
            variant = "train_twblas" if "train_twblas" in v else "train_twblas_save_dense"
            if variant in v and "train_dense" in v:
                pts.append((v[variant].get("mean_nnz", float(k[2].rsplit("-", 1)[1])),
                            v["train_dense"]["ms"] / v[variant]["ms"], k[2]))
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o")
        for p in pts:
            ax.annotate(p[2], (p[0], p[1]), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xscale="log", xlabel="active units per token (mean, of H = 5632)", ylabel="dense step / twblas step (x)",
               title="training step (forward + backward), D 2048, H 5632, M 16384, bf16")
        foot(fig, f"{train.gpu()}, bench/results/{train.name}")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(os.path.join(docs, "training-vs-dense.png"), dpi=100)
        plt.close(fig)


RENDERED = {"h100-serving.json", "h100-serving-llama.json", "h100-serving-llm29.json", "h200-serving.json",
            "h200-serving-llama.json", "h200-serving-llm29.json", "h100-full.json", "h200-full.json", "h100-train.json",
            "h100-train-eager.json", "h100-conversions.json", "h100-conversions-gemm-to-sparse.json",
            "h200-conversions-to-dense.json", "h100-fp8.json", "h200-fp8.json", "h200-train.json", "h200-sweep.json",
            "h200-model.json"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="bench/results")
    ap.add_argument("--docs", default="docs")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args()
    others = sorted(f for f in os.listdir(a.results) if f.endswith(".json") and f not in RENDERED)
    if others:
        print("not rendered here: " + ", ".join(others), file=sys.stderr)
    text = ["# twblas benchmark results", "",
            "Generated by `python3 scripts/bench-report.py` from the JSON in `bench/results` (its README says "
            "which command makes each file); do not edit by hand. bf16 throughout; medians of 5 repetitions, "
            "CUDA events; unless a section says otherwise, calls replayed from a CUDA graph, with X and the "
            "weights rotated over three copies so that repeated calls do not sit in L2. Every twblas point "
            "was checked against the dense FFN of the same data before it was timed. Ratios compare timings "
            "within one file (one run on one card); between runs the same card varies by a few per cent. "
            "Why the numbers are what they are, and what was tried and rejected: "
            "[performance-notes.md](performance-notes.md).", "",
            "Sections: 0. the whole model; 1. serving and decode (1-512 tokens); 2. prefill-size FFN (4096 tokens and more, "
            "sparsity profiles, cuSPARSE); 3. training; 4. conversions; 5. FP8 weights; 6. sparsity sweep."]
    lines = model_section(a.results, None if a.no_plots else a.docs)
    if lines:
        text += [""] + lines
    for section in (serving_section, batch_section, train_section, conv_section, fp8_section, sweep_section):
        lines = section(a.results)
        if lines:
            text += [""] + lines
    with open(os.path.join(a.docs, "benchmarks.md"), "w") as f:
        f.write("\n".join(text) + "\n")
    update_readme(a.results, os.path.join(os.path.dirname(os.path.abspath(a.docs)), "README.md"))
    if not a.no_plots:
        try:
            plots(a.results, a.docs)
        except ImportError:
            print("matplotlib missing: plots left as they are", file=sys.stderr)


if __name__ == "__main__":
    main()
