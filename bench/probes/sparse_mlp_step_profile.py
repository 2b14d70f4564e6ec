"""One SparseMLP training step (forward + backward, 8192 tokens, d_model 512, d_ff 2048, bf16) on a
GPU under the torch profiler, for gate patterns from ~35 active units a token (dense mode) down to
~0.4, some with units active on every token, with and without save_dense: GPU time per step and
the six costliest kernels.
    TWBLAS_LIBRARY=build/src/libtwblas.so PYTHONPATH=bindings/python python3 bench/probes/sparse_mlp_step_profile.py
It found autograd's backward thread using an FFN descriptor of its own (2026-11-23: 12.3 of 12.7 ms
a step in the gathered GEMM; docs/pytorch/README.md)."""
import sys, torch
from twblas.torch import SparseMLP
from torch.profiler import profile, ProfilerActivity
D, H, M = 512, 2048, 8192
def run(name, thr, hot, save_dense):
    torch.manual_seed(0)
    mlp = SparseMLP(D, H, device="cuda", dtype=torch.bfloat16, save_dense=save_dense)
    with torch.no_grad():
        mlp.gate_proj.weight.normal_(0, 0.02); mlp.gate_proj.weight[:, 0] = -thr; mlp.gate_proj.weight[:hot, 0] = 1.0
    x = torch.randn(M, D, device="cuda", dtype=torch.bfloat16); x[:, 0] = 1.0; x.requires_grad_(True)
    def step():
        y = mlp(x); (y.float().sum() + 3e-4 * mlp.l1).backward()
    for _ in range(6): step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5): step()
        torch.cuda.synchronize()
    ev = sorted(p.key_averages(), key=lambda e: -e.device_time_total)
    tot = sum(e.self_device_time_total for e in p.key_averages()) / 5e3
    print(f"== {name} save_dense={save_dense}: {mlp.stats()}  GPU {tot:.2f} ms/step")
    for e in [e for e in ev if e.self_device_time_total > 0][:6]:
        print(f"   {e.self_device_time_total/5e3:7.3f} ms  x{e.count//5}  {e.key[:90]}")
for sd in (True, False):
    run("hot8+35", 1.0, 8, sd)
    run("uniform~35", 1.0, 0, sd)
    run("uniform~8", 1.3, 0, sd)
    run("hot2+uniform~4", 1.3, 2, sd)  # sparse mode, two units active on every token
    run("hot8+uniform~4", 1.3, 8, sd)
    run("uniform~2", 1.6, 0, sd)
