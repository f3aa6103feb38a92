#!/usr/bin/env python3
"""A real job that hangs: at --skip-at, rank 1 skips one all_reduce (a rank-dependent branch) and then stays away
(sleeps --hold-s, as a rank stuck in its data loader or a host-side wait would), so rank 0 waits in that all_reduce
until the collective timeout (TRAINYARD_COLLECTIVE_TIMEOUT_S). With NCCL the watchdog then dumps every rank's flight
recorder (TORCH_NCCL_DUMP_ON_TIMEOUT=1, TORCH_FR_DUMP_TEMP_FILE from the environment, as nccl.env sets them).

Rank 1 must not go on to the next step's all_reduce: NCCL would pair it with rank 0's pending one (same size), the
job would run on one collective out of step and only hang at its very end.

--backend gloo (tests/gpu/hang_collect.py --cpu-rehearsal): gloo records the entries but never dumps on a timeout,
so every rank writes its buffer by hand (torch's _dump_fr_trace) to the same file names: rank 0 when its
collective times out, rank 1 right after it skipped. Used by tests/gpu/hang_collect.py.
"""

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
p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
p.add_argument("--hold-s", type=float, default=0.0, help="how long rank 1 stays away (default: 4 x timeout + 60)")
a = p.parse_args()
timeout_s = float(os.environ.get("TRAINYARD_COLLECTIVE_TIMEOUT_S", "30"))
hold_s = a.hold_s or 4 * timeout_s + 60


def dump_by_hand(rank):
    """gloo only: write this rank's flight-recorder buffer where NCCL's watchdog would."""
    from torch._C._distributed_c10d import _dump_fr_trace
    prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    with open(prefix + str(rank) + ".tmp", "wb") as f:
        f.write(_dump_fr_trace(True, True, False))
    os.replace(prefix + str(rank) + ".tmp", prefix + str(rank))


if a.backend == "nccl":
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=timeout_s))
rank = dist.get_rank()
x = torch.ones(a.numel, device="cuda" if a.backend == "nccl" else "cpu")
for step in range(1, a.steps + 1):
    if step == a.skip_at and rank == 1:
        print("trainyard: hang injected: rank 1 skips all_reduce at step %d at %.3f" % (step, time.time()), flush=True)
        if a.backend == "gloo":
            dump_by_hand(rank)
        time.sleep(hold_s)
        raise SystemExit("trainyard: rank 1 held %.0f s after skipping the all_reduce of step %d" % (hold_s, step))
    try:
        dist.all_reduce(x)
    except RuntimeError as e:
        print("trainyard: rank %d: the all_reduce of step %d failed: %s" % (rank, step, str(e).splitlines()[0]),
              flush=True)
        if a.backend == "gloo":
            dump_by_hand(rank)
        raise
    if a.backend == "nccl":
        torch.cuda.synchronize()
    print("trainyard: step %d rank %d" % (step, rank), flush=True)
    time.sleep(0.05)
dist.destroy_process_group()
