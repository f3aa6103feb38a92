#!/usr/bin/env python3
"""All-reduce bus bandwidth, measured the way nccl-tests reports it, through torch.distributed.

Run under torchrun (one process per GPU, or per CPU slot with gloo):

    torchrun --nnodes=2 --nproc_per_node=2 ... allreduce_bench.py --sizes-mb 1,4,16,64,256,1024 --iters 20 \
        [--env-file nccl.env] [--iface eth1] [--json OUT]

busbw = algbw * 2 (n - 1) / n, with algbw = bytes / time per all-reduce and n the world size
(nccl-tests' definition, so figures compare with all_reduce_perf). Every size of the sweep is timed in turn; the
result's top-level figures are the largest size's (the one verdicts compare, docs/bandwidth.md). Each node's local
rank 0 prints one JSON line prefixed "trainyard-allreduce:" and writes it to --json when given, with its data NIC
(--iface) as sysfs describes it: link speed, virtual or not, and the RDMA ports.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

# Variables torchrun set for this process; an env file never overrides them.
_LAUNCHER_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                  "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "NODE_RANK"}


def load_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines (the format of the rendered nccl.env), the value literally as docker --env-file reads it
    (";", ",", ":" and inner quotes kept); comments and blanks skipped."""
    env: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh.read().split("\n"):
            line = line.lstrip(" \t")
            if not line.strip() or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.partition("=")
            env[key] = value
    return env


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes) for one all-reduce of nbytes taking seconds."""
    if seconds <= 0 or world < 1:
        raise ValueError("seconds must be positive and world >= 1")
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * (2 * (world - 1) / world if world > 1 else 1.0)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:  # absent, or EINVAL: a link that is down has no speed
        return None


def nic_facts(iface: str, sys_root: str = "/sys") -> dict:
    """{iface, speed_mbps (None: unknown), virtual, rdma: [{device, port, rate_gbps, link_layer, state}]} of the data
    NIC and the node's RDMA ports, from sysfs (read-only)."""
    out: dict = {"iface": iface, "speed_mbps": None, "virtual": False, "rdma": []}
    if iface and "/" not in iface and iface not in (".", ".."):
        net = os.path.join(sys_root, "class", "net", iface)
        speed = _read(os.path.join(net, "speed"))
        out["speed_mbps"] = int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None
        out["virtual"] = "/devices/virtual/" in os.path.realpath(net)
    ib = os.path.join(sys_root, "class", "infiniband")
    for dev in sorted(os.listdir(ib)) if os.path.isdir(ib) else []:
        ports = os.path.join(ib, dev, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            base = os.path.join(ports, port)
            rate = (_read(os.path.join(base, "rate")) or "").split()  # "400 Gb/sec (4X NDR)"
            try:
                gbps = float(rate[0]) if rate else None
            except ValueError:
                gbps = None
            out["rdma"].append({"device": dev, "port": port, "rate_gbps": gbps,
                                "link_layer": _read(os.path.join(base, "link_layer")),
                                "state": _read(os.path.join(base, "state"))})
    return out


def parse_sizes(text: str) -> list[float]:
    """"1,4,16" -> [1.0, 4.0, 16.0] MiB, ascending, each > 0."""
    sizes = sorted({float(x) for x in text.split(",") if x.strip()})
    if not sizes or sizes[0] <= 0:
        raise ValueError(f"--sizes-mb {text!r}: give sizes in MiB above 0, e.g. 1,4,16")
    return sizes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=float, default=1024, help="one size (MiB), when --sizes-mb is not given")
    p.add_argument("--sizes-mb", default="", help="the sweep: sizes in MiB, comma-separated")
    p.add_argument("--iface", default="", help="the data NIC to describe in the result")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    p.add_argument("--env-file", action="append", default=[])
    p.add_argument("--json", default="")
    p.add_argument("--label", default="")
    args = p.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes_mb) if args.sizes_mb else [args.size_mb]
    except ValueError as exc:
        p.error(str(exc))

    for path in args.env_file:
        for key, value in load_env_file(path).items():
            if key not in _LAUNCHER_VARS:
                os.environ[key] = value

    import torch
    import torch.distributed as dist

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dtype = torch.bfloat16
    else:
        device = torch.device("cpu")
        dtype = torch.float32
    dist.init_process_group(backend=backend)
    world = dist.get_world_size()
    element = torch.tensor([], dtype=dtype).element_size()

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize()

    def timed(size_mb: float) -> dict:
        buf = torch.ones(max(1, int(size_mb * 1024 * 1024) // element), dtype=dtype, device=device)
        nbytes = buf.numel() * buf.element_size()
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        sync()
        elapsed = (time.perf_counter() - t0) / args.iters
        # The slowest rank defines the collective's time.
        t = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        elapsed = float(t.item())
        algbw, busbw = bus_bandwidth(nbytes, elapsed, world)
        del buf
        return {"bytes": nbytes, "seconds_per_iter": elapsed, "algbw_gbps": round(algbw, 3),
                "busbw_gbps": round(busbw, 3)}

    sweep = [timed(size) for size in sizes]
    largest = sweep[-1]
    # Every node reports (its local rank 0): each node's check records the cluster's figure, not only the head's.
    if local_rank == 0:
        result = {
            "label": args.label, "backend": backend, "world_size": world,
            "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("NNODES", "0")) or 0),
            "iters": args.iters, **largest, "sizes": sweep, "host": socket.gethostname(),
            "nic": nic_facts(args.iface),
            "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
        }
        line = json.dumps(result, sort_keys=True)
        print(f"trainyard-allreduce: {line}", flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(line + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
