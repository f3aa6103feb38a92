#!/usr/bin/env python3
"""Reference figure: a plain torch.distributed all-reduce, written independently of the product's check.

torchrun --standalone --nproc_per_node=N plain_allreduce.py [SIZE_MB] — prints busbw in GB/s (nccl-tests' formula).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

size_mb = float(sys.argv[1]) if len(sys.argv) > 1 else 1024
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(int(size_mb * 2**20) // 2, dtype=torch.bfloat16, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
times = []
for _ in range(20):
    t0 = time.perf_counter()
    dist.all_reduce(x)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
mean = sum(times) / len(times)
busbw = x.numel() * x.element_size() / mean / 1e9 * 2 * (world - 1) / world
if rank == 0:
    print(f"plain-allreduce: world={world} size_mb={size_mb} busbw_gbps={busbw:.2f}", flush=True)
dist.destroy_process_group()
