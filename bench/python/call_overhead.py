"""Host time of one twblas.torch call at a size where computing costs next to nothing: what the
binding (and PyTorch's dispatch) adds to every eager call, against the dense PyTorch MLP of the
same size. CPU backend by default (--device cuda for a GPU: then the times are host time to
enqueue, the GPU being far from busy). Writes JSON with --out.

    TWBLAS_LIBRARY=build/src/libtwblas.so PYTHONPATH=bindings/python \\
        python3 bench/python/call_overhead.py --out bench/results/python-call-overhead.json
"""
import argparse
import json
import platform
import statistics
import time

import torch

from twblas.torch import SparseMLP


def per_call_us(fn, calls, repeats):
    for _ in range(calls // 4):
        fn()
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    d, h = 16, 32
    sparse = SparseMLP(d, h, device=dev)
    gate, up, down = (torch.nn.Linear(d, h, bias=False, device=dev), torch.nn.Linear(d, h, bias=False, device=dev),
                      torch.nn.Linear(h, d, bias=False, device=dev))
    x = torch.randn(1, d, device=dev)
    xg = x.clone().requires_grad_(True)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def sparse_train():
        sparse(xg).sum().backward()

    def dense_train():
        down(torch.relu(gate(xg)) * up(xg)).sum().backward()

    rows = {}
    with torch.no_grad():
        rows["inference/sparse_mlp"] = per_call_us(lambda: sparse(x), args.calls, args.repeats)
        rows["inference/dense_mlp"] = per_call_us(lambda: down(torch.relu(gate(x)) * up(x)), args.calls, args.repeats)
    rows["train_step/sparse_mlp"] = per_call_us(sparse_train, args.calls // 4, args.repeats)
    rows["train_step/dense_mlp"] = per_call_us(dense_train, args.calls // 4, args.repeats)
    sync()
    for k, v in rows.items():
        print(f"{k:28s} {v:7.1f} us per call (median of {args.repeats})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": args.device, "machine": platform.node(), "processor": platform.processor(),
                       "torch": torch.__version__, "shape": {"tokens": 1, "d_model": d, "d_ff": h},
                       "us_per_call": rows}, f, indent=1)


if __name__ == "__main__":
    main()
