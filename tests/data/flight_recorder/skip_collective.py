#!/usr/bin/env python3
"""A real 2-rank gloo job in which rank 1 skips one all_reduce (a rank-dependent branch): rank 0 waits in it until
the collective timeout. Then every rank writes its flight-recorder buffer BY HAND (torch's _dump_fr_trace) to
$FR_OUT/rank_<rank>: gloo records the entries but never dumps on a timeout (only NCCL does,
TORCH_NCCL_DUMP_ON_TIMEOUT=1), so this is how a CPU test gets real dumps of a real hang.

    TORCH_FR_BUFFER_SIZE=2000 FR_OUT=DIR torchrun --nproc_per_node 2 skip_collective.py
"""

import datetime
import os

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("FR_TIMEOUT_S", "3"))))
x = torch.ones(1024)
for _ in range(3):
    dist.all_reduce(x)
if rank != 1:
    try:
        dist.all_reduce(torch.ones(4096))  # rank 1 never calls this one
    except RuntimeError as e:
        print("rank %d: collective timed out: %s" % (rank, str(e).splitlines()[0]), flush=True)
with open(os.path.join(os.environ["FR_OUT"], "rank_%d" % rank), "wb") as f:
    f.write(_dump_fr_trace(True, True, False))
