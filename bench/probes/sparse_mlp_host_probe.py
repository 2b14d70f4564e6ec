"""Host time against GPU time of one SparseMLP training step (forward + backward) at the DDP
example's layer size (d_model 1024, d_ff 4096, bf16, ~8 active units a token), 8192 and 16384
tokens, beside the dense twin (three nn.Linear). For each: the host time to issue a step (wall
clock of 5 steps issued while the GPU is still busy with a long sleep, so that no call waits on
it), the GPU time of a step (CUDA events around 20 steps back to back), and, for the sparse one,
the Python functions with the most own time (cProfile). A step whose host time is above its GPU
time is host-bound.
    TWBLAS_LIBRARY=build/src/libtwblas.so PYTHONPATH=bindings/python python3 bench/probes/sparse_mlp_host_probe.py [breakdown]
With `breakdown`: the sparse step's host time split over the binding's functions and C calls.
"""
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F
from twblas.torch import SparseMLP

D, H = 1024, 4096


class DenseMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(D, H, bias=False)
        self.up_proj = torch.nn.Linear(D, H, bias=False)
        self.down_proj = torch.nn.Linear(H, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.relu(self.gate_proj(x)) * self.up_proj(x))


def make(kind, m):
    torch.manual_seed(0)
    mlp = (SparseMLP(D, H, device="cuda", dtype=torch.bfloat16) if kind == "sparse"
           else DenseMLP().to("cuda", torch.bfloat16))
    with torch.no_grad():  # about ACTIVE units a token: a bias of -2.88 sigma through x[:, 0] = 1
        w = mlp.gate_proj.weight
        w.normal_(0, 0.02)
        w[:, 0] = -2.88 * 0.02 * (D - 1) ** 0.5
    x = torch.randn(m, D, device="cuda", dtype=torch.bfloat16)
    x[:, 0] = 1.0
    x.requires_grad_(True)

    def step():
        y = mlp(x)
        loss = y.float().square().mean()
        if kind == "sparse":
            loss = loss + 3e-4 * mlp.l1
        loss.backward()
    return mlp, step


def measure(kind, m):
    mlp, step = make(kind, m)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    n = 20
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        step()
    end.record()
    torch.cuda.synchronize()
    gpu_ms = start.elapsed_time(end) / n
    # host time: the GPU kept busy by a long sleep first, then steps issued back to back (every
    # launch returns at once); the issue time per step. Five steps: twenty of the sparse step
    # filled the launch queue (~60 launches a step) and waited for the sleep (10 ms a step).
    issued = 5
    torch.cuda._sleep(400_000_000)
    t0 = time.perf_counter()
    for _ in range(issued):
        step()
    host_ms = 1e3 * (time.perf_counter() - t0) / issued
    torch.cuda.synchronize()
    active = mlp.stats()["mean_active"] if kind == "sparse" else float("nan")
    print(f"{kind:6s} m {m:6d}  step {gpu_ms:7.3f} ms (events, back to back)  host {host_ms:7.3f} ms (issue time)"
          f"  mean active {active:.1f}", flush=True)
    if kind == "sparse":
        torch.cuda._sleep(200_000_000)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            step()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)




def breakdown(m=8192, steps=50):
    """Where the sparse step's host time goes: wall time of the binding's Python functions and of
    its C calls (each wrapped in a timer), per step, steps synchronised one by one so that no call
    waits for the GPU. The timers add ~1 us a call."""
    import twblas.torch as T
    from twblas import _lib as C
    mlp, step = make("sparse", m)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    acc = {}

    def timed(name, f):
        def w(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
        return w
    lib = C.lib()
    saved = {}
    for n in ("twSpGEMMFusedForwardTrain", "twSpGEMMFusedBackward", "twSetStream", "twFfnSetAttribute"):
        saved[n] = getattr(lib, n)
        setattr(lib, n, timed("C " + n, saved[n]))
    for n in ("_forward_impl", "_backward_impl", "_described", "_workspace", "_handle", "_check_inputs"):
        saved[n] = getattr(T, n)
        setattr(T, n, timed("py " + n, saved[n]))
    fwd = bwd = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        y = mlp(x_of(mlp, m))
        loss = y.float().square().mean() + 3e-4 * mlp.l1
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        fwd, bwd = fwd + t1 - t0, bwd + t2 - t1
    print(f"breakdown, sparse m {m}: forward + loss {1e3 * fwd / steps:.3f} ms, backward() {1e3 * bwd / steps:.3f} ms a step")
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"   {k:40s} {1e3 * v / steps:7.3f} ms a step")
    for n, f in saved.items():
        setattr(lib if n.startswith("tw") else T, n, f)


_inputs = {}


def x_of(mlp, m):
    if m not in _inputs:
        x = torch.randn(m, D, device="cuda", dtype=torch.bfloat16)
        x[:, 0] = 1.0
        _inputs[m] = x.requires_grad_(True)
    return _inputs[m]


if __name__ == "__main__":
    import sys
    if "breakdown" in sys.argv[1:]:
        breakdown()
    else:
        for m in (8192, 16384):
            for kind in ("sparse", "dense"):
                measure(kind, m)
