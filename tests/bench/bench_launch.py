#!/usr/bin/env python3
"""Launch figures on a simulated cluster (prints them; asserts nothing).

    .venv/bin/python tests/bench/bench_launch.py --name ln [--rounds 2]

1. launch: duration of the launch role's "Start torchrun" task (all nodes in parallel, wait_for=rendezvous with
   the example's "rendezvous done" line as the marker, so it ends when every rank is past init_process_group);
2. by hand: the same torchrun commands started over SSH on every node at once (`docker exec -d` into the
   training container, like the reference procedure's SSH loop) and the same log line polled over SSH;
   ratio = launch / by hand (target under 1.3);
3. time to name a dead rank: kill -9 of node rank 1's worker, then the status play run until it names that node
   and rank (time from the kill to the play's answer), and the status play's own duration.

Needs the cluster up (tests/sim/simcluster.py up --name NAME) and the training container (the launch test
playbook prepares it on the first round).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from helpers import SimCluster, run_playbook, sim_down, sim_up  # noqa: E402

PLAYBOOK = "tests/integration/playbooks/launch.yml"
MARKER = "trainyard: rendezvous done"
ARGV = ["--steps", "100000", "--save-every", "0", "--sleep", "0.2", "--output-root", "/srv/outputs/bench"]
_DUR = re.compile(r"\((\d+):(\d\d):(\d\d\.\d+)\)")


def task_duration(output: str, task: str) -> float | None:
    """profile_tasks prints the previous task's duration on the next header line."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("TASK [") and task in line:
            for nxt in lines[i + 1:]:
                if nxt.startswith("TASK [") or nxt.startswith("PLAY RECAP"):
                    for follow in lines[lines.index(nxt) + 1: lines.index(nxt) + 3]:
                        m = _DUR.search(follow)
                        if m:
                            return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
                    return None
    return None


def play(c: SimCluster, *args: str) -> subprocess.CompletedProcess:
    return c.playbook(PLAYBOOK, *args)


def extra(**kw) -> list[str]:
    d = {"launch_example_argv": ARGV, "launch_rendezvous_marker": MARKER, "launch_resume_from": "",
         "launch_wait_timeout": 900}
    d.update(kw)
    return ["-e", json.dumps(d)]


def by_hand(c: SimCluster, port: int) -> float:
    token = "bench-" + uuid.uuid4().hex
    log = f"/tmp/{token}.log"
    n = len(c.nodes)
    head = c.data[c.head]

    def start(rank_node):
        rank, node = rank_node
        cmd = ["torchrun", f"--nnodes={n}", "--nproc_per_node=1", f"--node_rank={rank}", f"--master_addr={head}",
               f"--master_port={port}", "--rdzv_backend=static", "--max_restarts=0", "/srv/code/ddp_train.py", *ARGV]
        inner = f"cd /srv/code && exec env GLOO_SOCKET_IFNAME=eth1 OMP_NUM_THREADS=1 TRAINYARD_LAUNCH_ID={token} " \
                f"{shlex.join(cmd)} > {log} 2>&1"
        c.ssh(node, ["docker", "exec", "-d", "trainyard-train", "sh", "-c", shlex.quote(inner)])

    def wait(node):
        while True:
            r = c.ssh(node, ["docker", "exec", "trainyard-train", "grep", "-q", shlex.quote(MARKER), log], check=False)
            if r.returncode == 0:
                return
            time.sleep(0.2)

    t0 = time.monotonic()
    with ThreadPoolExecutor(len(c.nodes)) as ex:
        list(ex.map(start, enumerate(c.nodes)))
        list(ex.map(wait, c.nodes))
    elapsed = time.monotonic() - t0
    # Clean up exactly what this round started: processes carrying its token.
    killer = ("import os, signal\nfor p in os.listdir('/proc'):\n  if p.isdigit():\n    try:\n"
              "      e = open('/proc/%s/environ' % p, 'rb').read().split(b'\\0')\n    except OSError:\n      continue\n"
              f"    if b'TRAINYARD_LAUNCH_ID={token}' in e:\n      os.kill(int(p), signal.SIGKILL)\n")
    for node in c.nodes:
        c.exec(node, ["python3", "-c", killer], check=False)
    return elapsed


def name_dead_rank(c: SimCluster) -> tuple[float, float]:
    victim = c.nodes[1]
    out = c.exec(victim, ["ps", "-eo", "pid=,args="]).stdout
    pids = [line.split()[0] for line in out.splitlines() if "ddp_train.py" in line and "torchrun" not in line
            and "launcher.py" not in line]
    t0 = time.monotonic()
    c.exec(victim, ["kill", "-9", pids[0]])
    want = f"first failure: node {victim} (node rank 1), rank 1"
    while True:
        s0 = time.monotonic()
        r = play(c, "-e", "test_launch_entry=status")
        if want in r.stdout:
            return time.monotonic() - t0, time.monotonic() - s0
        if time.monotonic() - t0 > 600:
            return float("nan"), float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", help="use this running simulated cluster (default: bring up bench-ln, 3 nodes)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    own = args.name is None
    c = sim_up("bench-ln", nodes=3) if own else SimCluster(args.name)
    try:
        return run(c, args.rounds)
    finally:
        if own:
            sim_down("bench-ln")


def run(c: SimCluster, rounds: int) -> int:
    r = play(c, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
    r = play(c, "-e", "test_launch_entry=none", *extra())
    if r.returncode != 0:
        print(r.stdout[-3000:])
        return 1
    rows = []
    for i in range(rounds):
        play(c, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
        r = play(c, "-e", "test_launch_prepare=false", *extra())
        launch = task_duration(r.stdout, "launch : Start torchrun")
        if r.returncode != 0 or launch is None:
            print(r.stdout[-3000:])
            return 1
        if i == rounds - 1:
            dead, status_s = name_dead_rank(c)
            # The product's reset.yml from that crashed state (one rank killed, the others exited).
            t0 = time.monotonic()
            rr = run_playbook(c.inventory, "reset.yml", "-e", "reset_confirm=true")
            reset_s = time.monotonic() - t0 if rr.returncode == 0 else float("nan")
        else:
            dead = status_s = float("nan")
        play(c, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
        hand = by_hand(c, 39600 + i)
        rows.append((launch, hand, dead, status_s))
        print(f"round {i + 1}: launch task {launch:.2f} s, by hand over SSH {hand:.2f} s, "
              f"ratio {launch / hand:.2f}", flush=True)
    print()
    print("| round | launch task to all ranks past rendezvous (s) | by hand over SSH (s) | ratio |")
    print("|---|---|---|---|")
    for i, (launch, hand, _, _) in enumerate(rows, 1):
        print(f"| {i} | {launch:.2f} | {hand:.2f} | {launch / hand:.2f} |")
    if len(rows) > 1:
        print(f"| median | {statistics.median(r[0] for r in rows):.2f} | {statistics.median(r[1] for r in rows):.2f} "
              f"| {statistics.median(r[0] / r[1] for r in rows):.2f} |")
    dead, status_s = rows[-1][2], rows[-1][3]
    print(f"\ntime from kill -9 of node rank 1's rank to the status play naming it: {dead:.1f} s "
          f"(one status play: {status_s:.1f} s)")
    print(f"reset.yml on {len(c.nodes)} nodes from that crashed state: {reset_s:.1f} s")
    play(c, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
    return 0


if __name__ == "__main__":
    sys.exit(main())
