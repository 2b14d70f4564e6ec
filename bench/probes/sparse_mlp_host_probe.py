"""Host time against GPU time of one SparseMLP training step (forward + backward) at the DDP
example's layer size (d_model 1024, d_ff 4096, bf16, ~8 active units a token), 8192 and 16384
tokens, beside the dense twin (three nn.Linear). For each: the host time to issue a step (wall
clock of 5 steps issued while the GPU is still busy with a long sleep, so that no call waits on
it), the GPU time of a step (CUDA events around 20 steps back to back), and, for the sparse one,
the Python functions with the most own time (cProfile). A step whose host time is above its GPU
time is host-bound.
    TWBLAS_LIBRARY=build/src/libtwblas.so PYTHONPATH=bindings/python python3 bench/probes/sparse_mlp_host_probe.py
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


for m in (8192, 16384):
    for kind in ("sparse", "dense"):
        measure(kind, m)
