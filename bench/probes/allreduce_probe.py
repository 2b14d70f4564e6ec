"""The all-reduce a DDP step pays, on the GPUs of this host: NCCL all_reduce of bf16 buffers from
16 to 256 MB (the d_model 1024 example's gradients are ~134 MB), median of 10 after 3 warm-ups,
with the bus bandwidth NCCL's own tests report (2 (n - 1) / n x bytes / time), and whether the
GPUs reach each other's memory directly (peer access).
    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=N bench/probes/allreduce_probe.py
"""
import os

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
if rank == 0:
    peers = [(a, b, torch.cuda.can_device_access_peer(a, b)) for a in range(world) for b in range(world) if a != b]
    print(f"{world} GPUs ({torch.cuda.get_device_name()}), peer access: {peers}", flush=True)
for mb in (16, 64, 134, 256):
    t = torch.ones(mb * 2**20 // 2, dtype=torch.bfloat16, device="cuda")
    times = []
    for i in range(13):
        dist.barrier()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dist.all_reduce(t)
        e.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(s.elapsed_time(e))
    times.sort()
    ms = times[len(times) // 2]
    if rank == 0:
        bus = 2 * (world - 1) / world * mb * 2**20 / (ms * 1e-3) / 1e9
        print(f"all_reduce {mb:4d} MB bf16: {ms:8.3f} ms  bus bandwidth {bus:7.1f} GB/s", flush=True)
dist.destroy_process_group()
