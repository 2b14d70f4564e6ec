"""Host time of one eager twblas.torch call, against the dense FFN's PyTorch ops, in one process.

At a size where computing costs next to nothing (1 token, d_model 16, d_ff 32 by default) the
time per call is what the binding and PyTorch's dispatch add to every eager call: the compiled
op (torch.ops.twblas.sparse_ffn: C++ kernels and autograd) against the dense MLP written with
PyTorch ops (three linears, a ReLU, a product), and one dense op alone (F.linear) for scale.

On CUDA (the default where a GPU is seen) the figures are host time: a repeat of --calls calls is
timed from a synchronised start until the last call returns, without waiting for the GPU (the
calls only enqueue; --calls stays small enough that the launch queue never fills); `synced`
rows time the same loop up to torch.cuda.synchronize(), what the GPU adds when it is the slower.
Prints one small JSON object (also written to --out).

    pip install --no-build-isolation ./bindings/python
    python3 bench/python/call_overhead.py [--device cuda] [--out bench/results/python-call-overhead.json]
"""
import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import twblas
from twblas.torch import SparseMLP, sparse_ffn


def per_call_us(fn, calls, repeats, sync, synced=False):
    for _ in range(max(calls // 4, 3)):  # warm-up: descriptors, caches, allocator
        fn()
    sync()
    runs = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        if synced:
            sync()
        runs.append((time.perf_counter() - t) / calls * 1e6)
        sync()
    return round(statistics.median(runs), 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=16)
    ap.add_argument("--d-ff", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    d, h = args.d_model, args.d_ff
    kw = {"device": dev, "dtype": dtype}
    sparse = SparseMLP(d, h, **kw)
    wg, wu, wd = sparse.gate_proj.weight, sparse.up_proj.weight, sparse.down_proj.weight
    gate, up, down = (torch.nn.Linear(d, h, bias=False, **kw), torch.nn.Linear(d, h, bias=False, **kw),
                      torch.nn.Linear(h, d, bias=False, **kw))
    dwg, dwu, dwd = gate.weight, up.weight, down.weight
    x = torch.randn(args.tokens, d, **kw)
    xg = x.clone().requires_grad_(True)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def dense_ffn(v):
        return F.linear(F.relu(F.linear(v, dwg)) * F.linear(v, dwu), dwd)

    def sparse_train():
        y, l1 = sparse_ffn(xg, wg, wu, wd)
        (y.sum() + l1).backward()

    def dense_train():
        dense_ffn(xg).sum().backward()

    cases = {  # inference/* run under torch.no_grad(), train_step/* with gradients
        "inference/sparse_ffn": lambda: sparse_ffn(x, wg, wu, wd),
        "inference/sparse_mlp_module": lambda: sparse(x),
        "inference/dense_ffn_ops": lambda: dense_ffn(x),
        "inference/one_dense_linear": lambda: F.linear(x, dwg),
        "train_step/sparse_ffn": sparse_train,
        "train_step/dense_ffn_ops": dense_train,
    }

    rows, synced = {}, {}
    for name, fn in cases.items():
        grad = name.startswith("train_step")
        calls = max(args.calls // 4, 10) if grad else args.calls
        with torch.enable_grad() if grad else torch.no_grad():
            rows[name] = per_call_us(fn, calls, args.repeats, sync)
            if dev.type == "cuda":
                synced[name] = per_call_us(fn, calls, args.repeats, sync, synced=True)
    result = {
        "what": "eager host time per call, us (median of repeats)",
        "device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "machine": platform.node(), "processor": platform.processor(),
        "torch": torch.__version__, "twblas": twblas.__version__,
        "shape": {"tokens": args.tokens, "d_model": d, "d_ff": h, "dtype": args.dtype},
        "calls_per_repeat": args.calls, "repeats": args.repeats,
        "host_us": rows,
        "ratio_sparse_to_dense": {
            "inference": round(rows["inference/sparse_ffn"] / rows["inference/dense_ffn_ops"], 3),
            "train_step": round(rows["train_step/sparse_ffn"] / rows["train_step/dense_ffn_ops"], 3),
        },
    }
    if synced:
        result["synced_us"] = synced
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
