#!/usr/bin/env python3
"""Reference figure: a plain torch.distributed all-reduce, written independently of the product's check.

torchrun --standalone --nproc_per_node=N plain_allreduce.py [SIZE_MB] — prints busbw in GB/s (nccl-tests' formula).

busbw_gbps is timed as nccl-tests times it (src/common.cu: the iterations are enqueued back to back and the stream
is synchronised once, the time divided by the iteration count); the median of 5 such rounds of 20 iterations, the
slowest rank's time in each. per_iter_sync_busbw_gbps is the same all-reduce with a synchronisation after every
iteration (the host's launch and wait in each figure), printed beside it for comparison.
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

size_mb = float(sys.argv[1]) if len(sys.argv) > 1 else 1024
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(int(size_mb * 2**20) // 2, dtype=torch.bfloat16, device="cuda")
nbytes = x.numel() * x.element_size()


def busbw(seconds):
    return nbytes / seconds / 1e9 * 2 * (world - 1) / world


def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
rounds = []
for _ in range(5):
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    rounds.append(slowest((time.perf_counter() - t0) / 20))
per_iter = []
for _ in range(20):
    t0 = time.perf_counter()
    dist.all_reduce(x)
    torch.cuda.synchronize()
    per_iter.append(time.perf_counter() - t0)
per_iter_mean = slowest(sum(per_iter) / len(per_iter))
if rank == 0:
    print(f"plain-allreduce: world={world} size_mb={size_mb} busbw_gbps={busbw(statistics.median(rounds)):.2f} "
          f"rounds_gbps={','.join(f'{busbw(s):.1f}' for s in rounds)} "
          f"per_iter_sync_busbw_gbps={busbw(per_iter_mean):.2f}", flush=True)
dist.destroy_process_group()
