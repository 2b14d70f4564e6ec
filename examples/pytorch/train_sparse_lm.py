#!/usr/bin/env python3
"""A small LLaMA-style language model whose FFNs are twblas SparseMLPs, trained beside a dense twin.

Both models start from the same seed and see the same batches. The sparse one adds the paper's
L1 term (coefficient * mean over tokens of sum_j |h_tj|, per layer). The script logs per step:
loss, each layer's mean active units (from SparseMLP.stats()), FFN time (forward + backward of
the MLP blocks), and tokens/s. It writes the log as JSON and plots it.

Text: the King James Bible from Debian's bible-kjv packages (apt-get install bible-kjv), dumped
once with `bible "Gen1:1-Rev22:21" > kjv.txt` (the script does this itself when the `bible`
program is there); nothing is downloaded. On a machine without it, pass --text with the dumped
file that came along with the code. Bytes are the tokens (vocabulary 256).

    python3 examples/pytorch/train_sparse_lm.py --device cuda --steps 300 --out runs/h100
    python3 examples/pytorch/train_sparse_lm.py --device cpu --steps 20 --d-model 128 --layers 2 \
        --seq 64 --batch 8 --out runs/cpu-smoke          (a quick check of the script itself)
    torchrun --nproc_per_node=N examples/pytorch/train_sparse_lm.py --batch B ...
    torchrun --nproc_per_node=N examples/pytorch/train_sparse_lm.py --parallel fsdp2 --batch B ...

Under torchrun (DDP, NCCL, one GPU per process) --batch is per process: every step draws the
global batch of B x N sequences from one generator and each process takes its slice, so a run on N
GPUs sees the same data as one GPU with --batch B x N; the logged loss is the mean over processes.
Keep NVLink multicast off where it is (NCCL_NVLS_ENABLE=0). --parallel fsdp2 shards every block
and the model with FSDP2 (fully_shard) instead of DDP; FSDP2 takes contiguous parameters only, so
the sparse model's down_proj weights are kept as nn.Linear stores them (the library then copies
each one: docs/pytorch.md), and the per-layer statistics are not logged (the weights are sharded
between steps).
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from twblas.torch import SparseMLP


def load_text(path):
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    if shutil.which("bible"):
        data = subprocess.run(["bible", "Gen1:1-Rev22:21"], check=True, capture_output=True).stdout
        if path:
            with open(path, "wb") as f:
                f.write(data)
        return data
    raise SystemExit("no text: apt-get install bible-kjv, or pass --text with a dumped kjv.txt")


class DenseMLP(torch.nn.Module):
    """The dense twin's MLP, in LlamaMLP's form (act_fn a ReLU: twblas.torch.sparsify() takes it).
    track_l1: keep the L1 term's value in .l1 (logged for the twin too; off, nothing more runs)."""

    def __init__(self, d, h, track_l1=True):
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, h, bias=False)
        self.up_proj = torch.nn.Linear(d, h, bias=False)
        self.down_proj = torch.nn.Linear(h, d, bias=False)
        self.act_fn = torch.nn.ReLU()
        self.track_l1 = track_l1
        self.l1 = None

    def forward(self, x):
        h = self.act_fn(self.gate_proj(x)) * self.up_proj(x)
        if self.track_l1:
            self.l1 = h.float().abs().sum(-1).mean()
        return self.down_proj(h)


class Block(torch.nn.Module):
    def __init__(self, d, heads, mlp):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.RMSNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.proj = torch.nn.Linear(d, d, bias=False)
        self.norm2 = torch.nn.RMSNorm(d)
        self.mlp = mlp

    def forward(self, x, timer):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + timer(self.mlp, self.norm2(x))


class LM(torch.nn.Module):
    def __init__(self, d, layers, heads, d_ff, seq, sparse, save_dense=None):
        super().__init__()
        self.emb = torch.nn.Embedding(256, d)
        self.pos = torch.nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = torch.nn.ModuleList(
            Block(d, heads, SparseMLP(d, d_ff, gated=True, save_dense=save_dense) if sparse else DenseMLP(d, d_ff))
            for _ in range(layers))
        self.norm = torch.nn.RMSNorm(d)
        self.head = torch.nn.Linear(d, 256, bias=False)

    def forward(self, idx, timer):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x, timer)
        return self.head(self.norm(x))


class _MarkInBackward(torch.autograd.Function):
    """The identity; its backward appends (name, a time mark) to the timer's spans."""

    @staticmethod
    def forward(ctx, t, timer, name):
        ctx.timer, ctx.name = timer, name
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        ctx.timer.spans.append((ctx.name, ctx.timer._mark()))
        return g, None, None


class FfnTimer:
    """Times the MLP blocks' forward and backward (CUDA events on a GPU, wall clock on the CPU)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.spans = []

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def __call__(self, mlp, x):
        # identities whose backward records a mark: the one after the MLP runs first in the
        # backward (its start), the one before it last (its end)
        x = _MarkInBackward.apply(x, self, "bwd_end")
        self.spans.append(("fwd_start", self._mark()))
        y = mlp(x)
        self.spans.append(("fwd_end", self._mark()))
        return _MarkInBackward.apply(y, self, "bwd_start")

    def total_ms(self):
        if self.cuda:
            torch.cuda.synchronize()
        total, open_ = 0.0, {}
        for name, mark in self.spans:
            kind, edge = name.split("_")
            if edge == "start":
                open_[kind] = mark
            elif kind in open_:
                s = open_.pop(kind)
                total += s.elapsed_time(mark) if self.cuda else 1e3 * (mark - s)
        self.spans = []
        return total


def profile_steps(step, n, device, timer):
    """Where n training steps spend their time, under the torch profiler: host wall time per step,
    the FFN spans as the events measure them, the GPU's kernel time per step (all kernels, and
    twblas's and the FFNs' GEMMs apart are in the table), and the ops with the most host time."""
    from torch.profiler import profile, ProfilerActivity
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for _ in range(3):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    timer.total_ms()
    with profile(activities=acts) as p:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        wall = (time.perf_counter() - t0) * 1e3 / n
    ffn = timer.total_ms() / n
    ev = p.key_averages()
    gpu = sum(e.self_device_time_total for e in ev) / 1e3 / n if device.type == "cuda" else 0.0
    table = ev.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60)
    if device.type == "cuda":
        table += "\n" + ev.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=60)
    return {"wall_ms_per_step": wall, "ffn_ms_per_step": ffn, "gpu_kernel_ms_per_step": gpu, "table": table}


def unit_summary(counts, tokens):
    """Dead units, units active on over 10 % of the tokens, and the five highest firing rates."""
    rates = counts.double().cpu() / max(1, tokens)
    top = torch.topk(rates, min(5, rates.numel())).values
    return {"dead": int((counts == 0).sum()), "over_10pct": int((rates > 0.1).sum()),
            "top_rates": [round(float(r), 4) for r in top]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--d-ff", type=int, default=0, help="default 4 x d_model")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--l1", type=float, default=2e-5, help="the paper's L1 coefficient")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text", default="", help="a dumped kjv.txt (written there when missing and `bible` exists)")
    ap.add_argument("--out", default="runs/train-sparse-lm")
    ap.add_argument("--unit-stats-every", type=int, default=50,
                    help="log each layer's unit firing rates (dead units, the busiest) every N steps")
    ap.add_argument("--save-dense", default="auto", choices=["auto", "always", "never"],
                    help="g and u kept for the backward of dense-mode steps (the early steps, before sparsity "
                         "emerges): when the step runs in dense mode (auto), room in every step, or never (the "
                         "least memory, slower dense steps); SparseMLP's save_dense None / True / False")
    ap.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp2"],
                    help="under torchrun: DistributedDataParallel, or FSDP2 (fully_shard per block)")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="after training, run N more steps of each model under the torch profiler and write "
                         "where the time went (host, GPU kernels, idle GPU) to profile.txt and the log")
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device(args.device)
    if world > 1:  # NCCL between GPUs, one per process; gloo on the CPU (a check of the script)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    d_ff = args.d_ff or 4 * args.d_model
    data = torch.tensor(list(load_text(args.text)), dtype=torch.long)
    split = int(0.95 * len(data))
    train, val = data[:split], data[split:]
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)

    models, opts = {}, {}
    for name in ("sparse", "dense"):
        torch.manual_seed(args.seed)  # the same initial weights for both
        m = LM(args.d_model, args.layers, args.heads, d_ff, args.seq, sparse=(name == "sparse"),
               save_dense={"auto": None, "always": True, "never": False}[args.save_dense]).to(device, dtype)
        if world > 1 and args.parallel == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for blk in m.blocks:
                down = getattr(blk.mlp, "down_proj", None)
                if down is not None and not down.weight.is_contiguous():
                    down.weight.data = down.weight.data.contiguous()  # FSDP2: contiguous parameters only
                fully_shard(blk)
            fully_shard(m)
        opts[name] = torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.0)
        if world > 1 and args.parallel == "ddp":
            m = torch.nn.parallel.DistributedDataParallel(m, device_ids=[device.index] if device.type == "cuda" else None)
        models[name] = m
    sharded = world > 1 and args.parallel == "fsdp2"
    timer = FfnTimer(device)
    gen = torch.Generator().manual_seed(args.seed)

    def batch(src):
        # the global batch from one generator, this process's slice of it
        i = torch.randint(0, len(src) - args.seq - 1, (args.batch * world,), generator=gen)
        i = i[rank * args.batch: (rank + 1) * args.batch]
        x = torch.stack([src[j: j + args.seq] for j in i.tolist()])
        y = torch.stack([src[j + 1: j + 1 + args.seq] for j in i.tolist()])
        return x.to(device), y.to(device)

    log = {"args": vars(args), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "processes": world, "steps": []}

    def blocks(m):
        return (m.module if world > 1 and not sharded else m).blocks

    def mean_over_processes(v):
        if world == 1:
            return v
        t = torch.tensor([v], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.item() / world
    last_unit_stats = 0
    for step in range(1, args.steps + 1):
        x, y = batch(train)
        rec = {"step": step}
        for name, m in models.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            opts[name].zero_grad(set_to_none=True)
            logits = m(x, timer)
            ce = F.cross_entropy(logits.float().view(-1, 256), y.view(-1))
            l1 = sum(blk.mlp.l1 for blk in blocks(m))
            loss = ce + args.l1 * l1 if name == "sparse" else ce
            loss.backward()
            opts[name].step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            rec[name] = {"loss": mean_over_processes(ce.item()), "l1": float(l1.detach()), "ffn_ms": timer.total_ms(),
                         "step_ms": 1e3 * dt, "tokens_per_s": world * args.batch * args.seq / dt}
            if name == "sparse" and not sharded:
                rec[name]["mean_active"] = [blk.mlp.stats()["mean_active"] for blk in blocks(m)]
                if step % args.unit_stats_every == 0 or step == args.steps:
                    # how the active units are spread: firing rates since the last record
                    tokens = (step - last_unit_stats) * args.batch * args.seq
                    rec[name]["units"] = [unit_summary(blk.mlp.neuron_counts(reset=True), tokens) for blk in blocks(m)]
                    last_unit_stats = step
        log["steps"].append(rec)
        if rank == 0 and (step % 10 == 0 or step == 1 or step == args.steps):
            s, d = rec["sparse"], rec["dense"]
            act = " ".join(f"{a:.0f}" for a in s.get("mean_active", []))
            print(f"step {step:5d}  loss sparse {s['loss']:.3f} dense {d['loss']:.3f}  active/layer [{act}] of {d_ff}"
                  f"  ffn ms {s['ffn_ms']:.1f} vs {d['ffn_ms']:.1f}  tok/s {s['tokens_per_s']:.0f} vs {d['tokens_per_s']:.0f}",
                  flush=True)
    if args.profile_steps > 0 and rank == 0:
        log["profile"] = {}
        for name, m in models.items():
            def one_step(m=m, name=name):
                x, y = batch(train)
                opts[name].zero_grad(set_to_none=True)
                logits = m(x, timer)
                ce = F.cross_entropy(logits.float().view(-1, 256), y.view(-1))
                l1 = sum(blk.mlp.l1 for blk in blocks(m))
                (ce + args.l1 * l1 if name == "sparse" else ce).backward()
                opts[name].step()
            log["profile"][name] = profile_steps(one_step, args.profile_steps, device, timer)
        with open(os.path.join(args.out, "profile.txt"), "w") as f:
            for name, prof in log["profile"].items():
                f.write(f"== {name}\n{prof['table']}\n")
        for name, prof in log["profile"].items():
            print(f"profile {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in prof.items() if k != "table"))
    with torch.no_grad():
        xv, yv = batch(val)
        log["val_loss"] = {n: mean_over_processes(F.cross_entropy(m(xv, timer).float().view(-1, 256), yv.view(-1)).item())
                           for n, m in models.items()}
        timer.spans = []
    if world > 1:
        dist.destroy_process_group()
    if rank != 0:
        return
    with open(os.path.join(args.out, "log.json"), "w") as f:
        json.dump(log, f, indent=1)
    plot(log, d_ff, os.path.join(args.out, "train.png"))
    print("validation loss:", log["val_loss"], "->", args.out)


def plot(log, d_ff, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    steps = [r["step"] for r in log["steps"]]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for n in ("sparse", "dense"):
        ax[0].plot(steps, [r[n]["loss"] for r in log["steps"]], label=n)
        ax[2].plot(steps, [r[n]["ffn_ms"] for r in log["steps"]], label=n)
    layers = len(log["steps"][0]["sparse"].get("mean_active", []))
    for i in range(layers):
        ax[1].plot(steps, [r["sparse"]["mean_active"][i] for r in log["steps"]], label=f"layer {i}")
    ax[0].set(title="training loss (cross entropy)", xlabel="step")
    ax[1].set(title=f"mean active units per token (of {d_ff})", xlabel="step", yscale="log")
    ax[2].set(title="FFN forward + backward per step (ms)", xlabel="step")
    for a in ax:
        a.legend()
    fig.suptitle(f"twblas SparseMLP vs dense twin, {log['device_name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
