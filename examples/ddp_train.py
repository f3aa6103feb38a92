#!/usr/bin/env python3
"""Example multi-node job for CPU clusters: torch DDP over gloo, checkpoints, resume, fail-fast.

Run under torchrun (torchrun_launch does that on every node)::

    torchrun --nnodes=3 --nproc_per_node=1 --node_rank=R --master_addr=HEAD --master_port=39500 \
        ddp_train.py --steps 200 --save-every 10 --sleep 0.2 --output-root /srv/outputs

What it shows the launcher:
  * ``trainyard: rendezvous done rank=R world=W ...`` once the process group is up (with the interfaces gloo and
    NCCL were given), and
    ``trainyard: first step done step=N`` after its first optimizer step (the launch module's first-step
    marker);
  * checkpoints every ``--save-every`` steps as ``<output-root>/checkpoint-<step>/`` in the HF Trainer layout:
    ``pytorch_model.bin``, ``optimizer.pt``, ``rng_state.pth`` and, written last and atomically,
    ``trainer_state.json`` (the completion marker module_utils/checkpoints.py looks for). Rank 0 saves;
  * resume: the checkpoint named by ``--resume-from`` or ``TRAINYARD_RESUME_FROM`` is loaded on rank 0 (the
    only rank that needs the files: with node-local output roots only the head has them); the step and the
    weights reach the other ranks through a broadcast, so all ranks continue at the same step;
  * fail-fast: the process group has a short collective timeout (``--collective-timeout``, default 30 s), so
    when one rank dies the others fail at their next collective (at once when the peer's connection closes,
    at the latest after the timeout) and exit instead of waiting out a long watchdog; ``@record`` puts the
    traceback into torchrun's failure report.

  * ``--shard-checkpoint``: a sharded checkpoint as ZeRO saves one: SGD with momentum, the flattened weights and
    momentum split into one shard per rank, ``shard-rank<R>-of-<W>.pt``, each written on its own node (node-local
    output roots), ``--shard-copies 2`` also writes the next rank's shard there (a copy on a second node, so one
    lost node loses no shard); ``pytorch_model.bin`` and the marker on every node. A resume needs every shard of
    the same world size; at another world size it stops and asks for the conversion:
    ``ddp_train.py --convert <checkpoint>`` merges the shards into ``<checkpoint>/universal/`` (any world size,
    as DeepSpeed's ds_to_universal does; playbooks/recover.yml runs it). ``TRAINYARD_RESUME_MODE=weights`` resumes
    the weights alone (fresh optimizer).

The data network interface comes from GLOO_SOCKET_IFNAME (the rendered env file).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

MARKER = "trainer_state.json"


def log(msg: str) -> None:
    print("trainyard: %s" % msg, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100, help="total optimizer steps (a resumed run stops here too)")
    p.add_argument("--save-every", type=int, default=10, help="checkpoint interval in steps (0: never)")
    p.add_argument("--sleep", type=float, default=0.1, help="seconds each step sleeps (simulated work)")
    p.add_argument("--output-root", default=os.environ.get("TRAINYARD_OUTPUT_ROOT", "outputs"))
    p.add_argument("--resume-from", "--resume_from_checkpoint", dest="resume_from",
                   default=os.environ.get("TRAINYARD_RESUME_FROM", ""),
                   help="checkpoint directory to resume from (default: $TRAINYARD_RESUME_FROM)")
    p.add_argument("--collective-timeout", type=float, default=30.0, help="seconds before a collective fails")
    p.add_argument("--backend", default="gloo")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--work", type=int, default=0,
                   help="CPU-bound matrix products per step (simulated compute, timed per rank)")
    p.add_argument("--shard-checkpoint", action="store_true",
                   help="save a sharded checkpoint (one shard per rank, node-local) with SGD momentum")
    p.add_argument("--shard-copies", type=int, default=1, choices=(1, 2),
                   help="2: each rank also saves the next rank's shard (a copy on a second node)")
    p.add_argument("--convert", metavar="CHECKPOINT", default="",
                   help="merge CHECKPOINT's shards into CHECKPOINT/universal/ (loads at any world size) and exit")
    return p.parse_args(argv)


def batch(step: int, rank: int, hidden: int, seed: int):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(16, hidden, generator=g)
    y = x.sum(dim=1, keepdim=True) * 0.1
    return x, y


def atomic_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


class Progress:
    """Per-rank progress file for the status playbook: $TRAINYARD_PROGRESS_DIR/rank_<rank>.json (rendered into
    nccl.env), rewritten atomically every step: the step, the rank's own compute time per step (between its
    collectives, so a slow node shows even though every rank waits for it at the all-reduce) and the step time,
    both averaged over the last 20 steps."""

    def __init__(self, rank: int, total: int):
        root = os.environ.get("TRAINYARD_PROGRESS_DIR", "")
        self.path = os.path.join(root, "rank_%d.json" % rank) if root and os.path.isdir(root) else ""
        self.base = {"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                     "node_rank": int(os.environ.get("GROUP_RANK", "0")), "pid": os.getpid(), "steps_total": total}
        self.last = time.time()
        self.recent: list = []  # (compute, step) seconds of the last 20 steps: one step alone is noisy

    def step(self, step: int, compute_s: float) -> None:
        now = time.time()
        self.recent = (self.recent + [(compute_s, now - self.last)])[-20:]
        if self.path:
            tmp = self.path + ".tmp"
            n = len(self.recent)
            with open(tmp, "w") as f:
                json.dump(dict(self.base, step=step, time=now,
                               compute_s=round(sum(c for c, _ in self.recent) / n, 6),
                               step_s=round(sum(s for _, s in self.recent) / n, 6)), f)
            os.replace(tmp, self.path)
        self.last = now


def save_checkpoint(root: str, step: int, model, optimizer, history: list, args) -> str:
    path = os.path.join(root, "checkpoint-%d" % step)
    os.makedirs(path, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(path, "pytorch_model.bin"))
    torch.save(optimizer.state_dict(), os.path.join(path, "optimizer.pt"))
    torch.save({"cpu": torch.get_rng_state()}, os.path.join(path, "rng_state.pth"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "trainyard-ddp-example", "hidden": args.hidden}, f)
    # The completion marker goes last: a checkpoint without it is incomplete (crash during save).
    atomic_json(os.path.join(path, MARKER), {"global_step": step, "max_steps": args.steps,
                                             "log_history": history[-20:], "best_model_checkpoint": None,
                                             "world_size": dist.get_world_size()})
    return path


def load_checkpoint(path: str, model, optimizer) -> int:
    with open(os.path.join(path, MARKER)) as f:
        state = json.load(f)
    model.load_state_dict(torch.load(os.path.join(path, "pytorch_model.bin"), map_location="cpu"))
    opt = os.path.join(path, "optimizer.pt")
    if os.path.exists(opt):
        optimizer.load_state_dict(torch.load(opt, map_location="cpu"))
    return int(state["global_step"])


SHARD = "shard-rank%d-of-%d.pt"
UNIVERSAL = "universal"


def flat_state(model, optimizer):
    """The weights and the momentum as two flat vectors (momentum zero before the first step)."""
    params = list(model.parameters())
    flat_p = torch.cat([p.detach().reshape(-1) for p in params])
    flat_m = torch.cat([optimizer.state.get(p, {}).get("momentum_buffer", torch.zeros_like(p)).reshape(-1)
                        for p in params])
    return flat_p, flat_m


def set_flat_state(model, optimizer, flat_p, flat_m) -> None:
    i = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(flat_p[i:i + n].view_as(p))
            optimizer.state[p]["momentum_buffer"] = flat_m[i:i + n].view_as(p).clone()
            i += n


def save_sharded(root: str, step: int, model, optimizer, history: list, args) -> str:
    """Every rank writes its shard (and with --shard-copies 2 the next rank's) into its node's output root; then
    the first rank of every node writes the weights and, last, the marker."""
    rank, world = dist.get_rank(), dist.get_world_size()
    path = os.path.join(root, "checkpoint-%d" % step)
    os.makedirs(path, exist_ok=True)
    flat_p, flat_m = flat_state(model, optimizer)
    chunks_p, chunks_m = torch.tensor_split(flat_p, world), torch.tensor_split(flat_m, world)
    for r in sorted({rank, (rank + 1) % world} if args.shard_copies == 2 else {rank}):
        tmp = os.path.join(path, SHARD % (r, world) + ".tmp")
        torch.save({"rank": r, "world_size": world, "step": step, "numel": flat_p.numel(),
                    "params": chunks_p[r].clone(), "momentum": chunks_m[r].clone()}, tmp)
        os.replace(tmp, os.path.join(path, SHARD % (r, world)))
    dist.barrier()  # every shard of every node is on disk before any marker says the checkpoint is complete
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        torch.save(model.state_dict(), os.path.join(path, "pytorch_model.bin"))
        atomic_json(os.path.join(path, MARKER), {"global_step": step, "max_steps": args.steps,
                                                 "log_history": history[-20:], "best_model_checkpoint": None,
                                                 "world_size": world, "format": "trainyard-sharded"})
    return path


def convert(path: str) -> int:
    """Merge every shard of path into path/universal/ (flat weights and momentum, any world size)."""
    with open(os.path.join(path, MARKER)) as f:
        state = json.load(f)
    world = int(state["world_size"])
    missing = [r for r in range(world) if not os.path.isfile(os.path.join(path, SHARD % (r, world)))]
    if missing:
        log("cannot convert %s: the shards of rank(s) %s of %d are missing" % (
            path, ", ".join(map(str, missing)), world))
        return 2
    shards = [torch.load(os.path.join(path, SHARD % (r, world)), map_location="cpu") for r in range(world)]
    out = os.path.join(path, UNIVERSAL)
    os.makedirs(out, exist_ok=True)
    torch.save({"params": torch.cat([s["params"] for s in shards]), "momentum": torch.cat([s["momentum"] for s in shards]),
                "step": int(state["global_step"]), "world_size": world}, os.path.join(out, "flat.pt"))
    atomic_json(os.path.join(out, MARKER), dict(state, converted_from_world_size=world))
    log("converted %s (%d shards) into %s" % (path, world, out))
    return 0


def load_sharded(path: str, model, optimizer, weights_only: bool) -> int:
    """Every rank loads from its own node's copy: the converted checkpoint when there is one, else its own shard
    (same world size only) and the others' through an all-gather."""
    rank, world = dist.get_rank(), dist.get_world_size()
    uni = os.path.join(path, UNIVERSAL, "flat.pt")
    if not weights_only and os.path.isfile(uni):  # a node that joins holds only the converted copy
        flat = torch.load(uni, map_location="cpu")
        set_flat_state(model, optimizer, flat["params"], flat["momentum"])
        return int(flat["step"])
    with open(os.path.join(path, MARKER)) as f:
        state = json.load(f)
    step = int(state["global_step"])
    if weights_only:
        model.load_state_dict(torch.load(os.path.join(path, "pytorch_model.bin"), map_location="cpu"))
        return step
    saved = int(state.get("world_size", world))
    if saved != world:
        raise SystemExit("trainyard: checkpoint %s was saved by %d ranks and this job has %d: convert it first "
                         "(ansible-playbook playbooks/recover.yml does; or ddp_train.py --convert %s), or resume "
                         "weights-only (TRAINYARD_RESUME_MODE=weights)" % (path, saved, world, path))
    mine = torch.load(os.path.join(path, SHARD % (rank, world)), map_location="cpu")
    parts: list = [None] * world
    dist.all_gather_object(parts, (mine["params"], mine["momentum"]))
    set_flat_state(model, optimizer, torch.cat([p for p, _ in parts]), torch.cat([m for _, m in parts]))
    return step


@record
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.convert:
        return convert(args.convert)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.collective_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    log("rendezvous done rank=%d world=%d node=%s local_rank=%s gloo_socket_ifname=%s nccl_socket_ifname=%s" % (
        rank, world, os.environ.get("GROUP_RANK", "?"), os.environ.get("LOCAL_RANK", "?"),
        os.environ.get("GLOO_SOCKET_IFNAME") or "-", os.environ.get("NCCL_SOCKET_IFNAME") or "-"))
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(args.hidden, args.hidden), torch.nn.Tanh(),
                                torch.nn.Linear(args.hidden, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9 if args.shard_checkpoint else 0.0)
    weights_only = os.environ.get("TRAINYARD_RESUME_MODE", "full") == "weights"

    # Rank 0 decides where to start (only it is sure to have the checkpoint files); everyone gets the step.
    start = torch.zeros(1, dtype=torch.long)
    if rank == 0:
        path = args.resume_from
        if path and args.shard_checkpoint and os.path.isfile(os.path.join(path, MARKER)):
            with open(os.path.join(path, MARKER)) as f:
                start[0] = int(json.load(f)["global_step"])
        elif path and os.path.isfile(os.path.join(path, MARKER)):
            start[0] = load_checkpoint(path, model, optimizer)
            log("resumed from %s at step %d" % (path, int(start[0])))
        elif path:
            log("resume checkpoint %s has no %s: starting from step 0" % (path, MARKER))
        else:
            log("no checkpoint to resume from: starting from step 0")
    dist.broadcast(start, src=0)
    step = int(start[0])
    if args.shard_checkpoint and step > 0:
        step = load_sharded(args.resume_from, model, optimizer, weights_only)
        log("resumed %s from %s at step %d (world size %d)" % (
            "weights-only" if weights_only else "model and optimizer", args.resume_from, step, world))
    # DDP broadcasts rank 0's parameters to every rank when it wraps the model.
    ddp = DDP(model)
    history: list = []
    first = True
    loss_fn = torch.nn.MSELoss()
    progress = Progress(rank, args.steps)
    work = torch.randn(128, 128, generator=torch.Generator().manual_seed(rank))
    while step < args.steps:
        t0 = time.perf_counter()
        for _ in range(args.work):
            work = torch.tanh(work @ work)
        x, y = batch(step, rank, args.hidden, args.seed)
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        compute_s = time.perf_counter() - t0
        loss.backward()  # gradients are all-reduced here (a dead peer fails this collective)
        optimizer.step()
        step += 1
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        mean = float(reduced) / world
        history.append({"step": step, "loss": round(mean, 6)})
        if first:
            log("first step done step=%d" % step)
            first = False
        if args.log_every and step % args.log_every == 0 and rank == 0:
            log("step %d loss %.6f" % (step, mean))
        if args.save_every and step % args.save_every == 0 and args.shard_checkpoint:
            path = save_sharded(args.output_root, step, ddp.module, optimizer, history, args)
            if rank == 0:
                log("saved %s" % path)
            dist.barrier()
        elif args.save_every and step % args.save_every == 0:
            if rank == 0:
                path = save_checkpoint(args.output_root, step, ddp.module, optimizer, history, args)
                log("saved %s" % path)
            dist.barrier()
        if args.sleep:
            time.sleep(args.sleep)
        progress.step(step, compute_s)
    log("done steps=%d rank=%d" % (step, rank))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
