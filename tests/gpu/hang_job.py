#!/usr/bin/env python3
"""A real NCCL job that hangs: rank 1 skips one all_reduce (a rank-dependent branch) at --skip-at, so rank 0 waits in
it until the NCCL watchdog's timeout (TRAINYARD_COLLECTIVE_TIMEOUT_S), which dumps every rank's flight recorder
(TORCH_NCCL_DUMP_ON_TIMEOUT=1, TORCH_FR_DUMP_TEMP_FILE from the environment). Used by tests/gpu/hang_collect.py."""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=50)
p.add_argument("--skip-at", type=int, default=20)
p.add_argument("--numel", type=int, default=1 << 20)
a = p.parse_args()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
dist.init_process_group("nccl", timeout=datetime.timedelta(
    seconds=float(os.environ.get("TRAINYARD_COLLECTIVE_TIMEOUT_S", "30"))))
rank = dist.get_rank()
x = torch.ones(a.numel, device="cuda")
for step in range(1, a.steps + 1):
    if step == a.skip_at and rank == 1:
        print("trainyard: hang injected: rank 1 skips all_reduce at step %d at %.3f" % (step, time.time()), flush=True)
        continue
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print("trainyard: step %d rank %d" % (step, rank), flush=True)
    time.sleep(0.05)
dist.destroy_process_group()
