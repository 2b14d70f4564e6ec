#!/usr/bin/env python3
"""Whole-model benchmark: Hugging Face transformers Llama at the paper's shapes, dense against the
same model after twblas.torch.sparsify(), one process, same inputs.

The paper's method: the model body without the LM head (LlamaModel), random token ids, warm-up,
then CUDA events around the timed loop. Modes
  prefill       batch x seq tokens in one forward (use_cache=False)
  decode-eager  one token per sequence and step on a DynamicCache after a ctx-token prefill
  decode-graph  the same step on a StaticCache, captured once in a torch.cuda.CUDAGraph and
                replayed (new token ids read by the graph itself; the cache advances on device)
  train         LlamaForCausalLM forward (labels = ids), backward, AdamW step (twblas adds the
                paper's L1 term, --l1-coeff, from the kernels' l1)
The variants are interleaved (README.md): one model, layer.mlp swapped between the dense module
and its SparseMLP (same Parameters); per point every variant is set up and warmed up,
alternating, then --rounds rounds of one timed loop per variant.
Per point: ms (the median over rounds of the loops' mean per forward / step; ms_rounds,
ms_spread), tokens_per_s, peak_gib (max_memory_allocated per loop, less the other variant's
state), j_per_token (NVML's energy counter read around each loop; power sampled on a thread
every 100 ms only where there is no counter), ffn_weight_copy_bytes (twblas records),
ffn_ms (CUDA events around the MLP modules, forward hooks; in train the MLPs' backward too,
through autograd marks; measured in separate iterations so the hooks do not touch the timed
loop), outside_ffn_ms (the rest of those same iterations), active_units (gate > 0 per token per
layer: hooks on the dense gate_proj, or SparseMLP.stats()); train also ms_iters (each timed step).

Sparsity is planted in the real model (README.md): a bias channel of the residual stream and a
calibrated negative gate component, about --active-units (29) of d_ff units per token per layer.
The model `learned` is examples/pytorch/train_sparse_lm.py's small LM instead, trained here with
its L1 term first (--learned-steps, at most --learned-max-s seconds): a sparsity pattern it learned.

    python3 bench/model/bench_model.py --quick                 # 2B only, < 4 min on an H200
    python3 bench/model/bench_model.py --models 0.5b,1b --append
    python3 bench/model/bench_model.py --models learned --modes prefill,train --append
    python3 bench/model/bench_model.py --tiny --device cpu     # the script end to end (numbers meaningless)
    python3 bench/model/bench_model.py --tiny --device cpu --models tiny,learned
    python3 bench/model/report.py bench/results/h200-model.json

Results: bench/results/<gpu>-model.json (written after every point; --append keeps the records of
other models already in the file).
"""

import argparse
import contextlib
import datetime
import gc
import inspect
import json
import math
import os
import re
import sys
import threading
import time
import traceback

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def log(*a):
    print(*a, flush=True)


# the paper's models (SakanaAI SparseLM 0.5B / 1B / 1.5B / 2B: D 2048, H 5632, 32 heads of 64,
# no GQA, vocab 49152, tied embeddings) and Llama-3-8B's shape at a few layers
MODELS = {
    "0.5b": dict(layers=8, d=2048, h=5632, heads=32, kv=32, vocab=49152, rope=10000.0),
    "1b": dict(layers=18, d=2048, h=5632, heads=32, kv=32, vocab=49152, rope=10000.0),
    "1.5b": dict(layers=28, d=2048, h=5632, heads=32, kv=32, vocab=49152, rope=10000.0),
    "2b": dict(layers=38, d=2048, h=5632, heads=32, kv=32, vocab=49152, rope=10000.0),
    "llama3-8b": dict(layers=4, d=4096, h=14336, heads=32, kv=8, vocab=128256, rope=500000.0),
    "tiny": dict(layers=2, d=64, h=176, heads=4, kv=4, vocab=128, rope=10000.0),
    # examples/pytorch/train_sparse_lm.py's LM at its default shape (byte vocabulary, learned
    # positions of `seq`), trained here before it is measured (build_learned); its prefill and train
    # points use its own seq and training batch
    "learned": dict(layers=4, d=512, h=2048, heads=8, kv=8, vocab=256, seq=256, batch=32),
}
LEARNED_TINY = dict(layers=2, d=64, h=256, heads=4, kv=4, vocab=256, seq=64, batch=4)
MODES = ("prefill", "decode-eager", "decode-graph", "train")


# ---------------------------------------------------------------------------------------------
# transformers across 5.x: the cache keyword and cache_position


def _forward_params():
    from transformers import LlamaModel

    return inspect.signature(LlamaModel.forward).parameters


def cache_kwargs(cache, cache_position=None):
    params = _forward_params()
    kw = {("cache" if "cache" in params else "past_key_values"): cache, "use_cache": True}
    if cache_position is not None and "cache_position" in params:
        kw["cache_position"] = cache_position
    return kw


def needs_cache_position():
    return "cache_position" in _forward_params()


def make_static_cache(config, batch, max_len, device, dtype):
    from transformers import StaticCache

    try:
        return StaticCache(config=config, max_cache_len=max_len)
    except TypeError:  # older signatures
        return StaticCache(config=config, max_batch_size=batch, max_cache_len=max_len, device=device, dtype=dtype)


def make_dynamic_cache(config):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:
        return DynamicCache()


# ---------------------------------------------------------------------------------------------
# the model and its planted sparsity


def build_model(spec, device, dtype, seed, seq_max):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=spec["d"], intermediate_size=spec["h"], num_hidden_layers=spec["layers"],
                      num_attention_heads=spec["heads"], num_key_value_heads=spec["kv"], vocab_size=spec["vocab"],
                      hidden_act="relu", max_position_embeddings=max(4096, seq_max), tie_word_embeddings=True,
                      rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False, use_cache=False,
                      rope_theta=spec["rope"])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        try:
            model = LlamaForCausalLM._from_config(cfg, dtype=dtype)
        except TypeError:
            model = LlamaForCausalLM._from_config(cfg, torch_dtype=dtype)
    return model.to(device=device, dtype=dtype).eval()


@torch.no_grad()
def plant_sparsity(model, k, calib_ids, channel=0, value=1.0, embed_std=1.0, scaled_init=True, skew=0.0,
                   dead=0.0, seed=4321):
    """A bias channel in the residual stream and a calibrated negative gate component (README.md).

    Dimension `channel` of every token embedding is set to `value`; nothing reads it but the gates
    (its columns of q/k/v/up are zero) and nothing writes it (its rows of o_proj and down_proj are
    zero), so it stays `value` through every layer and the RMSNorm turns it into value * weight /
    rms(x_t) at each MLP's input. Gate row j gets -b_l in that column: unit j of layer l fires iff
    z_tj > b_l * n_tc (z the gate's pre-activation without the channel). b_l is chosen per layer,
    from one forward over calib_ids with the layers before already planted, so that k units fire
    per token on average. Returns the thresholds.

    skew > 0 and dead > 0 make units unequal (bench_ffn's llm-k in spirit): unit j's threshold is
    b_l + s_j, s_j ~ N(0, skew x the std of z / n over the calibration tokens), and a `dead`
    fraction of units gets a threshold no token reaches."""
    base = model.model
    emb = base.embed_tokens.weight
    if embed_std:
        # token embeddings of unit scale (HF's 0.02 leaves every token's own content far below what
        # the first attention layer adds, which later tokens of a sequence share: units then fire
        # per sequence, not per token)
        g = torch.Generator(device=emb.device).manual_seed(1234)
        emb.copy_(torch.randn(emb.shape, generator=g, device=emb.device, dtype=torch.float32).mul_(embed_std))
    emb[:, channel] = value
    if scaled_init:
        # GPT-2 / Megatron-LM's scaled init of the residual branches' output projections, std
        # 0.02 / sqrt(2 L): with HF's plain 0.02 at D = 2048 each random-init attention layer adds
        # a near-uniform average over the sequence at about the residual's own scale, which deep
        # layers accumulate into a component all tokens of a sequence share (units then fire per
        # sequence, not per token)
        f = 1.0 / math.sqrt(2 * len(base.layers))
        for layer in base.layers:
            layer.self_attn.o_proj.weight.mul_(f)
            layer.mlp.down_proj.weight.mul_(f)
    for layer in base.layers:
        a, m = layer.self_attn, layer.mlp
        for lin in (a.q_proj, a.k_proj, a.v_proj, m.up_proj, m.gate_proj):
            lin.weight[:, channel] = 0
        a.o_proj.weight[channel, :] = 0
        m.down_proj.weight[channel, :] = 0
    thresholds = []

    def hook(mlp, args):
        x = args[0].reshape(-1, args[0].shape[-1]).float()
        w = mlp.gate_proj.weight
        n_c = x[:, channel:channel + 1]
        r = (x @ w.float().t()) / n_c  # the channel's column is still 0 here
        offset = torch.zeros(r.shape[1], device=r.device)
        if skew or dead:
            g = torch.Generator(device="cpu").manual_seed(seed + len(thresholds))
            offset = (torch.randn(r.shape[1], generator=g) * skew * r.std().item()).to(r.device)
            n_dead = int(round(dead * r.shape[1]))
            if n_dead:
                offset[torch.randperm(r.shape[1], generator=g)[:n_dead].to(r.device)] = 1e4 * r.abs().max()
            r = r - offset
        total = max(1, min(r.numel() - 1, int(round(k * x.shape[0]))))
        top = torch.topk(r.flatten(), total + 1).values
        b = 0.5 * (top[-2] + top[-1])  # between the total-th and the next value
        w[:, channel] = -(b + offset).to(w.dtype)
        thresholds.append(float(b))

    handles = [layer.mlp.register_forward_pre_hook(hook) for layer in base.layers]
    try:
        base(input_ids=calib_ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return thresholds


class ActiveCounter:
    """Active units per token per layer of the dense model (gate_proj output > 0)."""

    def __init__(self, model):
        self.sums, self.tokens, self.maxes, self.handles = {}, {}, {}, []
        for i, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate_proj", None)
            self.handles.append(gate.register_forward_hook(self._hook(i)))

    def _hook(self, i):
        def f(mod, args, out):
            o = out.detach().reshape(-1, out.shape[-1])
            per_token = (o > 0).sum(-1)
            self.sums[i] = self.sums.get(i, 0) + per_token.sum().item()
            self.maxes[i] = max(self.maxes.get(i, 0), per_token.max().item())
            self.tokens[i] = self.tokens.get(i, 0) + o.shape[0]
        return f

    def remove(self):
        for h in self.handles:
            h.remove()

    def per_layer(self):
        return [self.sums[i] / max(1, self.tokens[i]) for i in sorted(self.sums)]

    def max_per_token(self):
        return max(self.maxes.values()) if self.maxes else None


def sparse_active(model):
    """(mean active units per token per layer, the most any token had) from SparseMLP.stats()."""
    out, mx = [], 0
    for layer in model.model.layers:
        st = getattr(layer.mlp, "stats", None)
        s = st() if st is not None else {"mean_active": float("nan"), "max_active": 0}
        out.append(s["mean_active"])
        mx = max(mx, s["max_active"])
    return out, mx


# ---------------------------------------------------------------------------------------------
# a model with a learned sparsity pattern: the small LM of examples/pytorch/train_sparse_lm.py,
# trained here with its L1 term, then measured like the others (its dense twin's MLPs are what
# sparsify() replaces)

TEXT_SUFFIXES = (".md", ".txt", ".py", ".h", ".hpp", ".cpp", ".cu", ".cuh", ".f90", ".cmake")


def load_example():
    """examples/pytorch/train_sparse_lm.py as a module: its LM, DenseMLP, load_text, unit_summary."""
    import importlib.util

    path = os.path.join(REPO, "examples", "pytorch", "train_sparse_lm.py")
    spec = importlib.util.spec_from_file_location("train_sparse_lm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def learned_text(path, ex):
    """(bytes, where from): the example's text (the King James Bible: a dumped kjv.txt at `path`, or
    the `bible` program), else this repository's documentation and sources (fixed order)."""
    import shutil

    if path and not os.path.exists(path) and not shutil.which("bible"):
        raise SystemExit(f"--learned-text {path}: no such file (and no `bible` program to dump it there)")
    if path or shutil.which("bible"):
        return ex.load_text(path), path or "bible-kjv (the bible program)"
    chunks = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "build", "_")) and d not in ("runs", "shared"))
        for f in sorted(files):
            if f.endswith(TEXT_SUFFIXES):
                with open(os.path.join(root, f), "rb") as fh:
                    chunks.append(fh.read())
    return b"\n".join(chunks), "this repository's text files (docs and sources)"


def _call_mlp(mlp, x):  # the example's blocks take a timer that calls the MLP
    return mlp(x)


class _LearnedBody(torch.nn.Module):
    """The example LM's body (embeddings, blocks, final norm; no head), called like LlamaModel."""

    def __init__(self, lm):
        super().__init__()
        self.emb, self.pos, self.layers, self.norm = lm.emb, lm.pos, lm.blocks, lm.norm

    def forward(self, input_ids, use_cache=False):
        x = self.emb(input_ids) + self.pos[: input_ids.shape[1]]
        for blk in self.layers:
            x = blk(x, _call_mlp)
        return self.norm(x)


class LearnedLM(torch.nn.Module):
    """The example's LM behind the interface the modes use: .model(input_ids=...) is the body,
    .model.layers[i].mlp the MLPs, and model(input_ids, labels) gives .loss (next-byte cross
    entropy, labels shifted as Hugging Face's causal LMs do)."""

    def __init__(self, lm):
        super().__init__()
        self.model, self.head, self.config = _LearnedBody(lm), lm.head, None

    def forward(self, input_ids, labels=None, use_cache=False):
        logits = self.head(self.model(input_ids))
        loss = None
        if labels is not None:
            v = logits.shape[-1]
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, v), labels[:, 1:].reshape(-1))
        return type("Out", (), {"loss": loss, "logits": logits})()


def build_learned(ctx, spec, args):
    """Trains the example's LM (SparseMLPs, its L1 term, AdamW at lr 1e-3 as the example) for
    --learned-steps steps or --learned-max-s seconds, whichever ends first; measures each layer's
    active units and unit firing rates on held-out text; returns its weights in the example's dense
    twin (DenseMLPs, replaced by sparsify() later) as a LearnedLM, a sampler of held-out windows
    for the points' ids, and what the training gave."""
    import torch.nn.functional as F

    ex = load_example()
    device, dtype = ctx.device, ctx.dtype
    text, source = learned_text(args.learned_text, ex)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    split = int(0.95 * len(data))
    train, val = data[:split], data[split:]
    d, layers, heads, h, seq, batch = (spec[k] for k in ("d", "layers", "heads", "h", "seq", "batch"))
    if len(val) <= seq + 1:
        raise SystemExit(f"learned: {len(data)} bytes of text are too few for windows of {seq}")

    def windows(src, n, gen):
        i = torch.randint(0, len(src) - seq - 1, (n,), generator=gen)
        w = src[i[:, None] + torch.arange(seq + 1)]
        return w[:, :-1].contiguous().to(device), w[:, 1:].contiguous().to(device)

    torch.manual_seed(args.seed)
    lm = ex.LM(d, layers, heads, h, seq, sparse=True).to(device, dtype)
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    coeff, curve, steps = args.learned_l1, [], 0
    t0 = time.perf_counter()
    for step in range(1, args.learned_steps + 1):
        x, y = windows(train, batch, gen)
        opt.zero_grad(set_to_none=True)
        ce = F.cross_entropy(lm(x, _call_mlp).float().view(-1, 256), y.reshape(-1))
        l1 = sum(blk.mlp.l1 for blk in lm.blocks)
        (ce + coeff * l1).backward()
        opt.step()
        steps = step
        last = step == args.learned_steps or time.perf_counter() - t0 > args.learned_max_s
        if step == 1 or step % 50 == 0 or last:  # .item() waits for the GPU: not every step
            active = [blk.mlp.stats()["mean_active"] for blk in lm.blocks]
            curve.append({"step": step, "loss": round(ce.item(), 4), "l1": round(l1.item(), 4),
                          "active": [round(a, 1) for a in active]})
            log(f"  learned: step {step:5d}  loss {ce.item():.3f}  active/layer "
                f"[{' '.join(f'{a:.0f}' for a in active)}] of {h}  ({time.perf_counter() - t0:.1f} s)")
        if last:
            break
    ctx.clock.sync()
    train_s = time.perf_counter() - t0
    # held-out text: loss, each layer's active units and how they spread over the units
    vgen = torch.Generator().manual_seed(args.seed + 1)
    for blk in lm.blocks:
        blk.mlp.neuron_counts(reset=True)
    losses, active = [], [[] for _ in lm.blocks]
    with torch.no_grad():
        for _ in range(4):
            x, y = windows(val, batch, vgen)
            losses.append(F.cross_entropy(lm(x, _call_mlp).float().view(-1, 256), y.reshape(-1)).item())
            for a, blk in zip(active, lm.blocks):
                a.append(blk.mlp.stats()["mean_active"])
    tokens = 4 * batch * seq
    info = {"example": "examples/pytorch/train_sparse_lm.py", "text": source, "text_bytes": len(data),
            "d_model": d, "d_ff": h, "layers": layers, "heads": heads, "seq": seq, "batch": batch,
            "steps": steps, "steps_asked": args.learned_steps, "train_s": round(train_s, 1),
            "tokens_trained": steps * batch * seq, "l1_coeff": coeff, "lr": 1e-3, "curve": curve,
            "val_loss": sum(losses) / len(losses),
            "active_per_layer": [round(sum(a) / len(a), 2) for a in active],
            "units_per_layer": [ex.unit_summary(blk.mlp.neuron_counts(), tokens) for blk in lm.blocks]}
    # the same weights in the dense twin (its DenseMLPs compute no L1 term: a plain MLP)
    state = {k: v.detach().clone() for k, v in lm.state_dict().items()}
    del lm, opt
    torch.manual_seed(args.seed)
    twin = ex.LM(d, layers, heads, h, seq, sparse=False).to(device, dtype)
    for blk in twin.blocks:
        blk.mlp.track_l1 = False
    twin.load_state_dict(state)
    del state
    model = LearnedLM(twin).eval()

    def ids(shape, seed):
        g = torch.Generator().manual_seed(seed)
        b, t = shape
        i = torch.randint(0, len(val) - t, (b,), generator=g)
        return val[i[:, None] + torch.arange(t)].to(device)

    return model, ids, info


# ---------------------------------------------------------------------------------------------
# clocks, FFN timing, energy


class Clock:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, a, b):
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


class _Mark(torch.autograd.Function):
    """Identity; its backward calls `fn` (a mark on the stream where the gradient arrives)."""

    @staticmethod
    def forward(ctx, t, fn):
        ctx.fn = fn
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        ctx.fn()
        return g, None


class FfnTimer:
    """Marks around every MLP module's forward (and, with backward=True, around its backward: the
    gradient reaching its output, then its input); total_ms() sums their spans."""

    def __init__(self, mlps, clock, backward=False):
        self.clock, self.backward = clock, backward
        self.spans, self.handles, self._start, self._bstart = [], [], None, None
        for m in mlps:
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post))

    def _pre(self, mod, args):
        self._start = self.clock.mark()
        x = args[0]
        if self.backward and torch.is_grad_enabled() and x.requires_grad:
            return (_Mark.apply(x, self._bwd_end),) + tuple(args[1:])
        return None

    def _post(self, mod, args, out):
        self.spans.append((self._start, self.clock.mark()))
        if self.backward and torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad:
            return _Mark.apply(out, self._bwd_start)
        return None

    def _bwd_start(self):
        self._bstart = self.clock.mark()

    def _bwd_end(self):
        if self._bstart is not None:
            self.spans.append((self._bstart, self.clock.mark()))
            self._bstart = None

    def remove(self):
        for h in self.handles:
            h.remove()

    def total_ms(self):
        self.clock.sync()
        return sum(self.clock.ms(a, b) for a, b in self.spans)


class HostTimer:
    """The host's time inside every MLP module's forward (perf_counter around it): what an eager
    loop spends launching the FFN, whatever the GPU does meanwhile."""

    def __init__(self, mlps):
        self.seconds, self._start, self.handles = 0.0, None, []
        for m in mlps:
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post))

    def _pre(self, mod, args):
        self._start = time.perf_counter()

    def _post(self, mod, args, out):
        self.seconds += time.perf_counter() - self._start

    def remove(self):
        for h in self.handles:
            h.remove()

    def total_ms(self):
        return self.seconds * 1e3


def per_call_ms(timer, fn, n):
    """`n` calls of fn with `timer`'s hooks in place (FfnTimer or HostTimer): its total a call;
    the hooks removed after."""
    try:
        for _ in range(n):
            fn()
        return timer.total_ms() / n
    finally:
        timer.remove()


def ffn_split(ctx, mlps, fn, n, backward):
    """`n` more calls of fn with the MLPs' marks (FfnTimer), each also timed as a whole: the FFN's
    share and the rest measured on the same iterations. ffn_ms and outside_ffn_ms are medians over
    them; ffn_ms_iters and hooked_ms_iters list each one (training steps differ from one another:
    an outlier step in the timed loop shows in ms_iters, not in a single hooked step)."""
    clock, ffn_ms, whole = ctx.clock, [], []
    for _ in range(max(1, n)):
        ffn = FfnTimer(mlps, clock, backward=backward)
        try:
            clock.sync()
            a = clock.mark()
            fn()
            b = clock.mark()
            ffn_ms.append(ffn.total_ms())  # synchronises
            whole.append(clock.ms(a, b))
        finally:
            ffn.remove()
    rec = {"ffn_ms": _median(ffn_ms), "outside_ffn_ms": _median([w - f for w, f in zip(whole, ffn_ms)])}
    if n > 1:
        rec["ffn_ms_iters"] = [round(x, 3) for x in ffn_ms]
        rec["hooked_ms_iters"] = [round(x, 3) for x in whole]
    return rec


class Energy:
    """NVML board energy over a span: the total-energy counter read before and after (no thread)
    where the GPU has one; only where it is missing, board power sampled on a thread (every
    `period` s, 100 ms: a faster thread competes for the GIL in host-bound loops) and integrated."""

    def __init__(self, device, period=0.1):
        self.ok, self.period, self.counter = False, period, False
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.h = self._handle(device)
            self.ok = True
        except Exception as e:  # noqa: BLE001
            log(f"  (energy: NVML unavailable: {e})")
            return
        try:
            self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h)
            self.counter = True
        except Exception:  # noqa: BLE001
            log("  (energy: no NVML energy counter; sampling power every 100 ms instead)")
            self.counter = False

    def _handle(self, device):
        nv, idx = self.nv, device.index if device.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        try:
            bus = f"{getattr(p, 'pci_domain_id', 0):08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            return nv.nvmlDeviceGetHandleByPciBusId(bus)
        except Exception:  # noqa: BLE001
            vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            ids = [v for v in vis.split(",") if v.strip()]
            if ids and all(v.strip().isdigit() for v in ids):
                idx = int(ids[idx])
            return nv.nvmlDeviceGetHandleByIndex(idx)

    def start(self):
        if not self.ok:
            return
        self.t0 = time.perf_counter()
        if self.counter:
            self.e0 = self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h)
            return
        self.samples, self.stop_flag = [], threading.Event()

        def run():
            while not self.stop_flag.is_set():
                try:
                    self.samples.append((time.perf_counter(), self.nv.nvmlDeviceGetPowerUsage(self.h) / 1e3))
                except Exception:  # noqa: BLE001
                    pass
                self.stop_flag.wait(self.period)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self):
        """(joules from the counter or None, joules integrated from samples or None, mean W)"""
        if not self.ok:
            return None, None, None
        t1 = time.perf_counter()
        counter = integ = None
        if self.counter:
            counter = (self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h) - self.e0) / 1e3
        else:
            self.stop_flag.set()
            self.thread.join()
            s = self.samples
            if len(s) >= 2:
                integ = sum(0.5 * (s[i][1] + s[i + 1][1]) * (s[i + 1][0] - s[i][0]) for i in range(len(s) - 1))
                # the ends: held at the first / last sample
                integ += s[0][1] * (s[0][0] - self.t0) + s[-1][1] * (t1 - s[-1][0])
            elif len(s) == 1:
                integ = s[0][1] * (t1 - self.t0)
        joules = counter if counter is not None else integ
        watts = joules / (t1 - self.t0) if joules is not None and t1 > self.t0 else None
        return counter, integ, watts


# ---------------------------------------------------------------------------------------------
# one point: every variant prepared and warmed up, then rounds alternating the variants (each a
# timed loop with energy), the median over rounds per variant


def time_one(fn, clock):
    clock.sync()
    t0 = time.perf_counter()
    fn()
    clock.sync()
    return time.perf_counter() - t0


def timed_loop(fn, clock, energy, n):
    marks = []
    clock.sync()
    energy.start()
    marks.append(clock.mark())
    for _ in range(n):
        fn()
        marks.append(clock.mark())
    clock.sync()
    counter, integ, watts = energy.stop()
    per = [clock.ms(marks[i], marks[i + 1]) for i in range(n)]
    return {"ms": clock.ms(marks[0], marks[-1]) / n, "per": per, "iters": n,
            "j_counter": counter, "j_sampled": integ, "watts": watts}


def _median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def aggregate(loops, tokens_per_iter):
    """A variant's record fields from its rounds' timed loops."""
    ms_rounds = [t["ms"] for t in loops]
    per = sorted(x for t in loops for x in t["per"])
    iters = sum(t["iters"] for t in loops)
    ms = _median(ms_rounds)
    rec = {"ms": ms, "tokens_per_s": tokens_per_iter / ms * 1e3, "ms_median": _median(per), "ms_min": per[0],
           "iters": iters, "rounds": len(loops), "ms_rounds": [round(x, 4) for x in ms_rounds],
           "ms_spread": (max(ms_rounds) - min(ms_rounds)) / ms if ms else None,
           "new_segments_per_iter": sum(t.get("segments", 0) for t in loops) / iters if iters else None}
    n = iters * tokens_per_iter
    jc = [t["j_counter"] for t in loops]
    js = [t["j_sampled"] for t in loops]
    jc = sum(jc) if all(j is not None for j in jc) else None
    js = sum(js) if all(j is not None for j in js) else None
    j = jc if jc is not None else js
    rec["j_per_token"] = j / n if j is not None else None
    rec["j_per_token_sampled"] = js / n if js is not None else None
    rec["energy_source"] = "nvml-counter" if jc is not None else "nvml-sampled-100ms" if js is not None else None
    w = [t["watts"] for t in loops if t["watts"] is not None]
    rec["avg_power_w"] = sum(w) / len(w) if w else None
    return rec


def peak_reset(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return None


def allocated(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated(device)
    return 0


def segments(device):
    """Memory segments the caching allocator has taken from the driver so far (cudaMalloc calls)."""
    if device.type == "cuda":
        return torch.cuda.memory_stats(device).get("segment.all.allocated", 0)
    return 0


def free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def gen_ids(shape, vocab, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g).to(device)


def model_ids(ctx, shape, seed):
    """A point's token ids: random ids, or windows of held-out text for the learned model."""
    if getattr(ctx, "ids", None) is not None:
        return ctx.ids(shape, seed)
    return gen_ids(shape, ctx.vocab, seed, ctx.device)


def mlps_of(model):
    return [layer.mlp for layer in model.model.layers]


def active_after(model, variant, fn):
    """Active units per token per layer over one more call of fn."""
    if variant == "dense":
        c = ActiveCounter(model)
        try:
            fn()
        finally:
            c.remove()
        return c.per_layer(), c.max_per_token()
    fn()
    return sparse_active(model)


def weight_copy_bytes(mlps):
    """Bytes of weight copies the library keeps for these SparseMLPs (0: weights read in place)."""
    op = getattr(getattr(torch.ops, "twblas", None), "ffn_weight_copy_bytes", None)
    total = 0
    try:
        for m in mlps:
            total += int(op(m.gate_proj.weight if getattr(m, "gate_proj", None) is not None else None,
                            m.up_proj.weight, m.down_proj.weight))
    except Exception as e:  # noqa: BLE001
        return f"unavailable ({type(e).__name__}: {e})"[:200]
    return total


class Variants:
    """The model with its dense MLP modules or their SparseMLP replacements (same Parameters) in
    place: use(variant) swaps layer.mlp."""

    def __init__(self, model, sparsify, names):
        self.model, self.layers = model, list(model.model.layers)
        self.mlps = {"dense": [layer.mlp for layer in self.layers]}
        if "twblas" in names:
            _, n = sparsify(model, return_count=True)
            self.mlps["twblas"] = [layer.mlp for layer in self.layers]
            log(f"  sparsify: {n} MLPs replaced (the dense modules kept; variants swap layer.mlp)")
            self.use("dense")

    def use(self, variant):
        for layer, m in zip(self.layers, self.mlps[variant]):
            layer.mlp = m


class Prepared:
    """One variant's state at one point: fn (one timed iteration), tokens per iteration, counts,
    after() (ffn_ms, active units; run once after the rounds) and close()."""

    def __init__(self, fn, tokens, iters, max_iters, after, close=None, **extra):
        self.fn, self.tokens, self.iters, self.max_iters = fn, tokens, iters, max_iters
        self.after, self.close, self.extra = after, close or (lambda: None), extra


# ---------------------------------------------------------------------------------------------
# the modes: prepare(ctx, model, variant, batch, seq, steps) -> Prepared, with `variant`'s modules
# in place; `steps` bounds the calls of fn (warm-up and every round)


def prep_prefill(ctx, model, variant, batch, seq, steps):
    base, clock = model.model, ctx.clock
    ids = model_ids(ctx, (batch, seq), 1000 + batch)

    def fn():
        with torch.inference_mode():
            base(input_ids=ids, use_cache=False)

    def after():
        rec = {}
        rec.update(ffn_split(ctx, mlps_of(model), fn, 1, backward=False))
        sub = ids[:min(batch, 4)]
        with torch.inference_mode():
            rec["active_per_layer"] = active_after(model, variant, lambda: base(input_ids=sub, use_cache=False))
        return rec

    return Prepared(fn, batch * seq, ctx.it["prefill_iters"], 1000, after)


def prep_decode_eager(ctx, model, variant, batch, seq, steps):
    base, clock, dc = model.model, ctx.clock, ctx.decode_ctx
    ids = gen_ids((batch, dc), ctx.vocab, 2000 + batch, ctx.device)
    step_ids = gen_ids((steps + 16, batch, 1), ctx.vocab, 3000 + batch, ctx.device)
    state = {"i": 0}
    with torch.inference_mode():
        cache = make_dynamic_cache(model.config)
        base(input_ids=ids, **cache_kwargs(cache))

    def fn():
        i = state["i"]
        state["i"] += 1
        with torch.inference_mode():
            base(input_ids=step_ids[i], **cache_kwargs(cache))

    def after():
        rec = {"ffn_ms": per_call_ms(FfnTimer(mlps_of(model), clock), fn, 3),
               "ffn_host_ms": per_call_ms(HostTimer(mlps_of(model)), fn, 3)}
        rec["active_per_layer"] = active_after(model, variant, fn)
        rec["ctx"] = dc
        rec["ctx_end"] = dc + state["i"]
        return rec

    def close():
        nonlocal cache
        cache = None

    return Prepared(fn, batch, ctx.it["decode_iters"], ctx.it["decode_max"], after, close)


def _rewinder(cache, pos):
    """A function that undoes one step's advance of a StaticCache (on the device, so that it can
    be captured): every replay then decodes at the same context length, overwriting one slot."""
    lens = [layer.cumulative_length for layer in getattr(cache, "layers", [])
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]

    def rewind():
        for t in lens:
            t.sub_(1)
    return rewind if pos is None else (lambda: None)  # with cache_position the step never advances


def _rewinder_ok(cache):
    layers = getattr(cache, "layers", [])
    return bool(layers) and all(isinstance(getattr(l, "cumulative_length", None), torch.Tensor) for l in layers)


def prep_decode_graph(ctx, model, variant, batch, seq, steps):
    if ctx.device.type != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device")
    base, dc = model.model, ctx.decode_ctx
    warm = 3
    ids = gen_ids((batch, dc), ctx.vocab, 2000 + batch, ctx.device)
    n_ids = warm + steps + 16
    step_ids = gen_ids((n_ids, batch), ctx.vocab, 3000 + batch, ctx.device)
    step_idx = torch.zeros(1, dtype=torch.long, device=ctx.device)
    pos = torch.full((1,), dc, dtype=torch.long, device=ctx.device) if needs_cache_position() else None
    # every step decodes token dc + 1 (the cache is rewound on the device after it), so the cache
    # needs dc + 1 slots; attention reads all max_len of them (masked), as HF's static cache does
    cache = make_static_cache(model.config, batch, dc + 8, ctx.device, ctx.dtype)
    with torch.inference_mode():
        prefill_pos = torch.arange(dc, device=ctx.device) if pos is not None else None
        base(input_ids=ids, **cache_kwargs(cache, prefill_pos))
    if not needs_cache_position() and not _rewinder_ok(cache):
        raise RuntimeError("this transformers' StaticCache has no cumulative_length to rewind")
    rewind = _rewinder(cache, pos)

    def step():
        tok = step_ids.index_select(0, step_idx).view(batch, 1)
        out = base(input_ids=tok, **cache_kwargs(cache, pos)).last_hidden_state
        step_idx.add_(1)
        rewind()
        return out

    with torch.inference_mode():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warm):
                step()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
    torch.cuda.synchronize()
    replays = {"n": 0}

    def fn():
        replays["n"] += 1
        if warm + replays["n"] > n_ids - 2:
            raise RuntimeError("out of step ids")
        graph.replay()

    def after():
        rec = {"ffn_ms": None, "ctx": dc}
        with torch.inference_mode():
            rec["active_per_layer"] = active_after(model, variant, step)  # one eager step
        return rec

    def close():
        nonlocal graph, cache
        graph = cache = None

    return Prepared(fn, batch, ctx.it["graph_iters"], ctx.it["graph_max"], after, close)


def prep_train(ctx, model, variant, batch, seq, steps):
    ids = model_ids(ctx, (batch, seq), 4000 + batch)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=ctx.args.train_lr, fused=ctx.device.type == "cuda")
    mlps = mlps_of(model)
    coeff = ctx.l1_coeff if variant == "twblas" else 0.0

    def fn():
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        if coeff:
            loss = loss + coeff * torch.stack([m.l1 for m in mlps]).sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def after():
        rec = {"l1_coeff": coeff}
        rec.update(ffn_split(ctx, mlps, fn, ctx.it["train_ffn_steps"], backward=True))
        rec["active_per_layer"] = active_after(model, variant, fn)
        return rec

    def close():
        nonlocal opt
        model.eval()
        opt = None
        model.zero_grad(set_to_none=True)

    return Prepared(fn, batch * seq, ctx.it["train_iters"], 50, after, close)


PREPARE = {"prefill": prep_prefill, "decode-eager": prep_decode_eager, "decode-graph": prep_decode_graph,
           "train": prep_train}
WARMUP = {"prefill": "prefill_warmup", "decode-eager": "decode_warmup", "decode-graph": "decode_warmup",
          "train": "train_warmup"}
MAX_ITERS = {"prefill": 1000, "decode-eager": "decode_max", "decode-graph": "graph_max", "train": 50}
# modes whose KV-cache lengths are all visited once before the timed loops: the first step at a
# new length is slow whichever variant makes it (PyTorch's cuDNN attention builds a graph per
# length), so without the pass the rounds compare the order, not the variants
SEEN_LENGTHS = {"decode-eager"}


def run_point(ctx, model, vs, variants, mode, batch, seq, rounds):
    """Prepares every variant (its modules in place), warms them up alternating, then `rounds`
    rounds of one timed loop per variant (the order reversed every other round). Returns
    {variant: record fields or {"error": ...}}."""
    device, clock, it = ctx.device, ctx.clock, ctx.it
    warm = max(2, it[WARMUP[mode]])
    mx = MAX_ITERS[mode]
    mx = it[mx] if isinstance(mx, str) else mx
    steps = warm + rounds * mx + 8  # calls of fn a variant may make
    preps, held, errors, out = {}, {}, {}, {}
    try:
        for v in variants:
            m0 = allocated(device)
            vs.use(v)
            try:
                preps[v] = PREPARE[mode](ctx, model, v, batch, seq, steps)
                preps[v].fn()  # lazy set-up (handles, workspaces, the caches' first growth)
                held[v] = allocated(device) - m0  # what this variant's state keeps during the others'
            except Exception as e:  # noqa: BLE001
                errors[v] = e
                log(f"  {v:6s} {mode:12s} b {batch:3d}: FAILED in set-up: {type(e).__name__}: {e}"[:400])
                p = preps.pop(v, None)
                if p is not None:
                    p.close()
        live = [v for v in variants if v in preps]
        if mode in SEEN_LENGTHS and live:
            # one throwaway pass over every KV-cache length the loops will reach, so that no timed
            # loop meets a length first: the steady state of a process that has decoded before
            vs.use(live[0])
            first = PREPARE[mode](ctx, model, live[0], batch, seq, steps)
            try:
                for _ in range(steps):
                    first.fn()
            finally:
                first.close()
        # the warm-up, alternating, so that no variant pays for being measured first; the last
        # call's time sets the loop's iteration count
        t_one = {}
        for _ in range(warm - 1):
            for v in list(live):
                vs.use(v)
                try:
                    t_one[v] = time_one(preps[v].fn, clock)
                except Exception as e:  # noqa: BLE001
                    errors[v] = e
                    live.remove(v)
        n = {v: max(preps[v].iters, min(preps[v].max_iters,
                                        int(math.ceil(it["min_s"] / max(t_one.get(v, 1.0), 1e-6)))))
             for v in live}
        loops = {v: [] for v in live}
        peaks = {v: [] for v in live}
        for r in range(rounds):
            for v in (live if r % 2 == 0 else live[::-1]):
                if v in errors:
                    continue
                vs.use(v)
                peak_reset(device)
                s0 = segments(device)
                try:
                    loops[v].append(timed_loop(preps[v].fn, clock, ctx.energy, n[v]))
                except Exception as e:  # noqa: BLE001
                    errors[v] = e
                    continue
                loops[v][-1]["segments"] = segments(device) - s0
                p = peak_gib(device)
                if p is not None:
                    p -= sum(held[u] for u in held if u != v) / 2**30
                peaks[v].append(p)
        for v in live:
            if v in errors:
                continue
            vs.use(v)
            try:
                rec = aggregate(loops[v], preps[v].tokens)
                rec["peak_gib"] = max(peaks[v]) if peaks[v] and peaks[v][0] is not None else None
                if mode == "train":  # each step's time, in order (steps differ: ms is their mean)
                    rec["ms_iters"] = [round(x, 3) for t in loops[v] for x in t["per"]]
                rec.update(preps[v].after())
                out[v] = rec
            except Exception as e:  # noqa: BLE001
                errors[v] = e
    finally:
        for v, p in preps.items():
            vs.use(v)
            p.close()
        preps.clear()
    for v, e in errors.items():
        out[v] = {"error": f"{type(e).__name__}: {e}"}
        if e.__traceback__ is not None:
            traceback.print_exception(type(e), e, e.__traceback__, file=sys.stdout)
    sys.stdout.flush()
    return out


def warm_model(ctx, model, vs, variants):
    """A few small forwards of every variant before the first point (allocator, handles, the
    host's first-call costs), so that the first point measured pays for none of it."""
    ids = model_ids(ctx, (1, 32), 99)
    for _ in range(3):
        for v in variants:
            vs.use(v)
            with torch.inference_mode():
                if getattr(model, "config", None) is None:  # the learned model: no KV cache
                    model.model(input_ids=ids)
                    model.model(input_ids=ids[:, :4])
                    continue
                cache = make_dynamic_cache(model.config)
                model.model(input_ids=ids, **cache_kwargs(cache))
                for i in range(4):
                    model.model(input_ids=ids[:, i:i + 1], **cache_kwargs(cache))
    ctx.clock.sync()


# ---------------------------------------------------------------------------------------------


class Ctx:
    pass


def gpu_tag(device):
    if device.type != "cuda":
        return "cpu", "cpu"
    name = torch.cuda.get_device_name(device)
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]*)\b", name.replace("NVIDIA", ""))
    return (m.group(1).lower() if m else re.sub(r"\W+", "-", name.lower()).strip("-")), name


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def points_for(args, model_name, modes):
    pts = []
    learned = model_name == "learned"
    seq = MODELS[model_name]["seq"] if learned else args.seq
    for mode in modes:
        if mode == "prefill":
            pts += [(mode, b, seq) for b in args.batches]
        elif mode in ("decode-eager", "decode-graph") and learned:
            log(f"  ({mode} skipped for the learned model: it has no KV cache)")
        elif mode == "decode-graph" and args.device.startswith("cpu"):
            log("  (decode-graph skipped: CUDA graphs need a CUDA device)")
        elif mode in ("decode-eager", "decode-graph"):
            pts += [(mode, b, 1) for b in args.decode_batches]
        elif mode == "train" and model_name in args.train_models:
            pts.append((mode, MODELS[model_name]["batch"] if learned else args.train_batch, seq))
    return pts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="2B only, fewer iterations (< 4 min on an H200)")
    ap.add_argument("--tiny", action="store_true",
                    help="a tiny model (D 64, H 176, 2 layers) to check the script; with --models learned, the "
                         "learned model at a tiny shape")
    ap.add_argument("--models", default=None,
                    help="comma list of " + ",".join(MODELS) + " (default: 0.5b,1b,1.5b,2b,llama3-8b; --quick: 2b)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--variants", default="dense,twblas")
    ap.add_argument("--batches", default=None, help="prefill batches (default 1,8,64)")
    ap.add_argument("--decode-batches", default=None, help="decode batches (default 1,8,64)")
    ap.add_argument("--seq", type=int, default=None, help="prefill and training sequence length (2048)")
    ap.add_argument("--decode-ctx", type=int, default=None, help="tokens prefilled before decoding (512)")
    ap.add_argument("--train-batch", type=int, default=None, help="training sequences a step (8: 16k tokens)")
    ap.add_argument("--train-models", default="2b,tiny,learned", help="models the train mode runs on")
    ap.add_argument("--train-lr", type=float, default=0.0,
                    help="the timed steps' AdamW lr (0: the optimizer's whole pass over parameters and moments, "
                         "the weights left in place, so every step sees the planted sparsity; README.md)")
    ap.add_argument("--l1-coeff", type=float, default=2e-5, help="the L1 term twblas's training step adds")
    ap.add_argument("--llama-layers", type=int, default=4, help="layers of the Llama-3-8B-shaped model")
    ap.add_argument("--learned-steps", type=int, default=None,
                    help="training steps of the learned model (1000; --tiny 30), bounded by --learned-max-s")
    ap.add_argument("--learned-max-s", type=float, default=75.0,
                    help="stop the learned model's training after this many seconds (it is then measured)")
    ap.add_argument("--learned-l1", type=float, default=3e-4,
                    help="the learned model's L1 coefficient, in its training and in its twblas train points "
                         "(3e-4: a few active units of 2048 within a few hundred steps, docs/pytorch.md)")
    ap.add_argument("--learned-text", default="",
                    help="the learned model's text: a dumped kjv.txt as the example takes (default: the bible "
                         "program when installed, else this repository's docs and sources)")
    ap.add_argument("--layers", type=int, default=None, help="override every model's layer count (checks)")
    ap.add_argument("--active-units", type=float, default=None, help="planted units a token (29; tiny 4)")
    ap.add_argument("--skew", type=float, default=0.0,
                    help="spread of the units' thresholds (0: every unit alike, uniform-k; 1: firing rates differ "
                         "by orders of magnitude)")
    ap.add_argument("--dead", type=float, default=0.0, help="fraction of units that never fire (e.g. 0.3)")
    ap.add_argument("--dtype", default=None, help="bf16 (default), fp16, fp32")
    ap.add_argument("--min-s", type=float, default=None,
                    help="least seconds per timed loop, one loop per variant and round (0.5; --quick 0.4)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds per point, each one timed loop per variant, alternating (5; --quick 3); "
                         "train runs one round per variant, one variant after the other")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/<gpu>-model.json)")
    ap.add_argument("--append", action="store_true", help="keep the file's records of models not run now")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="list the points and exit")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip the points left after this many seconds (default 230 with --quick, 570 otherwise: "
                         "one 10-minute command); the JSON holds what was measured")
    args = ap.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available() and not args.dry_run:
        sys.exit("no CUDA device: use --device cpu (with --tiny)")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    dtype = dtypes[args.dtype or ("fp32" if device.type == "cpu" and args.tiny else "bf16")]
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    if args.tiny:
        models = (args.models or "tiny").split(",")
        if any(m not in ("tiny", "learned") for m in models):
            sys.exit("--tiny runs the models tiny and learned (at a tiny shape)")
        MODELS["learned"] = dict(LEARNED_TINY)
        args.batches, args.decode_batches = ints(args.batches or "1,2"), ints(args.decode_batches or "1,2")
        args.seq, args.decode_ctx = args.seq or 64, args.decode_ctx or 16
        args.train_batch = args.train_batch or 2
        k = args.active_units or 4
    else:
        models = (args.models or ("2b" if args.quick else "0.5b,1b,1.5b,2b,llama3-8b")).split(",")
        args.batches, args.decode_batches = ints(args.batches or "1,8,64"), ints(args.decode_batches or "1,8,64")
        args.seq, args.decode_ctx = args.seq or 2048, args.decode_ctx or 512
        args.train_batch = args.train_batch or 8
        k = args.active_units or 29
    args.train_models = args.train_models.split(",")
    if args.learned_steps is None:
        args.learned_steps = 30 if args.tiny else 1000
    # train last: its optimizer steps move the weights
    modes = sorted({m for m in args.modes.split(",") if m}, key=lambda m: MODES.index(m) if m in MODES else -1)
    variants = [v for v in args.variants.split(",") if v]
    for m in models:
        if m not in MODELS:
            sys.exit(f"unknown model {m}: one of {', '.join(MODELS)}")
    for m in modes:
        if m not in MODES:
            sys.exit(f"unknown mode {m}: one of {', '.join(MODES)}")
    MODELS["llama3-8b"]["layers"] = args.llama_layers
    if args.layers:
        for spec in MODELS.values():
            spec["layers"] = args.layers

    quick = args.quick or args.tiny
    it = {"prefill_warmup": 2, "prefill_iters": 2 if quick else 5,
          "decode_warmup": 3, "decode_iters": 20 if quick else 30,
          # eager steps grow the KV cache, and every length is visited once before the loops
          # (SEEN_LENGTHS): a fixed count keeps that pass short
          "decode_max": 20 if quick else 30,
          "graph_iters": 50 if quick else 100, "graph_max": 1000,
          "train_warmup": 2, "train_iters": 4 if quick else 5, "train_ffn_steps": 2 if args.tiny else 3,
          "min_s": args.min_s if args.min_s is not None else (0.0 if args.tiny else 0.4 if quick else 0.5)}
    rounds = args.rounds or (3 if quick else 5)

    if args.dry_run:
        for name in models:
            for mode, batch, seq in points_for(args, name, modes):
                log(f"{name} ({MODELS[name]['layers']} layers) {mode} batch {batch} seq {seq} "
                    f"{'ctx ' + str(args.decode_ctx) if mode.startswith('decode') else ''} x {','.join(variants)}")
        log(f"iterations: {it}, rounds {rounds}")
        return

    import transformers
    import twblas
    from twblas import torch as tt
    sparsify = getattr(tt, "sparsify", None)
    if sparsify is None:
        from twblas._sparsify import sparsify

    tag, gpu_name = gpu_tag(device)
    out = args.out or os.path.join(REPO, "bench", "results", f"{tag}{'-tiny' if args.tiny else ''}-model.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    try:
        twv = twblas.version()
    except Exception as e:  # noqa: BLE001
        twv = f"unknown ({e})"
    doc = {"gpu": tag, "gpu_name": gpu_name, "torch": torch.__version__, "transformers": transformers.__version__,
           "twblas": twv, "cuda": torch.version.cuda, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "dtype": str(dtype).replace("torch.", ""), "quick": bool(args.quick), "tiny": bool(args.tiny),
           "argv": sys.argv[1:], "method": "LlamaModel body (no LM head) for prefill/decode; LlamaForCausalLM "
           "with labels for train; random token ids; CUDA events; sdpa attention; the variants interleaved: one model, "
           "layer.mlp swapped between the dense module and its SparseMLP (same Parameters; down_proj.weight in the "
           "in-place layout for both), every variant warmed up alternating, then rounds of one timed loop per "
           "variant (order reversed every other round), ms the median over rounds; train one round per variant "
           "from the same weights; energy from NVML's energy counter around each loop; the learned model "
           "(examples/pytorch/train_sparse_lm.py's LM, trained first) on windows of its held-out text",
           "rounds": rounds, "iterations": it,
           "planted": {"active_units_target": k, "bias_channel": 0, "bias_value": 1.0, "embed_std": 1.0,
                       "scaled_init": True, "skew": args.skew, "dead": args.dead}, "records": []}
    if args.append and os.path.exists(out):
        with open(out) as f:
            old = json.load(f)
        doc["records"] = [r for r in old.get("records", []) if r.get("model") not in models]
        if "learned" not in models and "learned" in old:
            doc["learned"] = old["learned"]
        doc.setdefault("earlier_runs", old.get("earlier_runs", []))
        doc["earlier_runs"].append({k_: old.get(k_) for k_ in ("date", "argv", "torch", "transformers", "twblas")})
    log(f"# {gpu_name}, torch {torch.__version__}, transformers {transformers.__version__}, twblas {twv}, "
        f"{doc['dtype']}; models {models}, modes {modes}, variants {variants} -> {out}")

    ctx = Ctx()
    ctx.device, ctx.dtype, ctx.args, ctx.it, ctx.decode_ctx = device, dtype, args, it, args.decode_ctx
    ctx.clock, ctx.energy, ctx.rounds = Clock(device), Energy(device), rounds
    t_start = time.perf_counter()
    budget = args.budget_s if args.budget_s is not None else (230.0 if args.quick else 570.0)
    skipped = []

    for name in models:
        spec = MODELS[name]
        ctx.vocab = spec["vocab"]
        pts = points_for(args, name, modes)
        if not pts:
            continue
        t0 = time.perf_counter()
        ctx.ids, ctx.l1_coeff = None, args.l1_coeff
        weights_gib = lambda: torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else 0  # noqa: E731
        if name == "learned":
            log(f"\n## learned: {spec['layers']} layers, D {spec['d']}, H {spec['h']}, seq {spec['seq']}, "
                f"examples/pytorch/train_sparse_lm.py's LM trained with L1 {args.learned_l1} for up to "
                f"{args.learned_steps} steps / {args.learned_max_s:.0f} s")
            model, ctx.ids, info = build_learned(ctx, spec, args)
            ctx.l1_coeff = args.learned_l1
            doc["learned"] = info
            free(device)
            log(f"  trained {info['steps']} steps in {info['train_s']} s on {info['text']}; held-out loss "
                f"{info['val_loss']:.3f}; active units per layer {info['active_per_layer']} of {spec['h']}; "
                f"weights {weights_gib():.2f} GiB")
        else:
            model = build_model(spec, device, dtype, args.seed, args.seq)
            calib = gen_ids((2 if not args.tiny else 4, args.seq), spec["vocab"], 77, device)
            thresholds = plant_sparsity(model, k, calib, skew=args.skew, dead=args.dead)
            free(device)
            log(f"\n## {name}: {spec['layers']} layers, D {spec['d']}, H {spec['h']}, vocab {spec['vocab']}; built "
                f"and planted in {time.perf_counter() - t0:.1f} s (thresholds {thresholds[0]:.4g} .. "
                f"{thresholds[-1]:.4g}); weights {weights_gib():.2f} GiB")
        vs = Variants(model, sparsify, variants)
        warm_model(ctx, model, vs, variants)
        copy_bytes = weight_copy_bytes(vs.mlps["twblas"]) if "twblas" in vs.mlps else None
        if copy_bytes is not None:
            log(f"  twblas FFN weight copies: {copy_bytes} bytes (0: the weights are read in place)")
        for mode, batch, seq in pts:
            if time.perf_counter() - t_start > budget:
                skipped += [f"{name} {v} {mode} b{batch}" for v in variants]
                continue
            tp = time.perf_counter()
            if mode == "train":
                # the optimizer moves the weights: every variant starts from the same ones, one
                # after the other (one round each; AdamW's state is the variant's own)
                snapshot = [p.detach().clone() for p in model.parameters()]
                res = {}
                try:
                    for v in variants:
                        res.update(run_point(ctx, model, vs, [v], mode, batch, seq, 1))
                        with torch.no_grad():
                            for p, s in zip(model.parameters(), snapshot):
                                p.copy_(s)
                finally:
                    del snapshot
                    free(device)
            else:
                res = run_point(ctx, model, vs, variants, mode, batch, seq, ctx.rounds)
            for variant in variants:
                rec = {"model": name, "layers": spec["layers"], "d_model": spec["d"], "d_ff": spec["h"],
                       "mode": mode, "batch": batch, "seq": seq, "variant": variant}
                r = res.get(variant, {"error": "not run"})
                rec.update(r)
                if variant == "twblas":
                    rec["ffn_weight_copy_bytes"] = (weight_copy_bytes(vs.mlps["twblas"])
                                                    if "twblas" in vs.mlps else None)
                if "error" in rec:
                    log(f"  {variant:6s} {mode:12s} b {batch:3d} x {seq:5d}: FAILED {rec['error'][:300]}")
                else:
                    apl, rec["active_max"] = rec.pop("active_per_layer")
                    rec["active_units"] = sum(apl) / len(apl) if apl else None
                    rec["active_units_per_layer"] = [round(a, 2) for a in apl]
                    rec["ffn_share"] = rec["ffn_ms"] / rec["ms"] if rec.get("ffn_ms") is not None else None
                    nan = float("nan")
                    log(f"  {variant:6s} {mode:12s} b {batch:3d} x {seq:5d}: {rec['ms']:9.3f} ms "
                        f"(rounds {', '.join(f'{x:.3f}' for x in rec['ms_rounds'])}; spread "
                        f"{rec['ms_spread'] * 100 if rec['ms_spread'] is not None else nan:.1f}%, {rec['iters']} it), "
                        f"{rec['tokens_per_s']:12.1f} tok/s, "
                        f"peak {rec['peak_gib'] if rec['peak_gib'] is not None else nan:6.2f} GiB, "
                        f"{rec['j_per_token'] * 1e3 if rec['j_per_token'] is not None else nan:8.4f} mJ/tok, "
                        f"ffn {rec['ffn_ms'] if rec.get('ffn_ms') is not None else nan:8.3f} ms, "
                        f"active {rec['active_units']:.1f}"
                        + (f", ffn host {rec['ffn_host_ms']:.3f} ms" if rec.get("ffn_host_ms") is not None else "")
                        + (f", new segments {rec['new_segments_per_iter']:.1f}/it"
                           if rec.get("new_segments_per_iter") else ""))
                doc["records"].append(rec)
            log(f"    [{mode} b {batch}: {time.perf_counter() - tp:.1f} s]")
            write_json(out, doc)
            free(device)
        del vs, model
        free(device)
        log(f"  [{name}: {time.perf_counter() - t0:.1f} s]")
    doc["seconds"] = round(time.perf_counter() - t_start, 1)
    if skipped:
        doc["skipped_for_budget"] = skipped
        log(f"\n{len(skipped)} points skipped after the {budget:.0f} s budget (--budget-s): {', '.join(skipped)}")
    write_json(out, doc)
    log(f"\ndone in {doc['seconds']} s -> {out}")


if __name__ == "__main__":
    main()
