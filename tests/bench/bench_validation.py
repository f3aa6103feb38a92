#!/usr/bin/env python3
"""Figures for issue 3: time from `ansible-playbook site.yml` start to the validation failure, and the preflight.

    .venv/bin/python tests/bench/bench_validation.py                       # validation failure, 5 runs
    .venv/bin/python tests/bench/bench_validation.py --preflight inventory/sim-cl [--playbook playbooks/preflight.yml]

Prints a table (min / median / max seconds); asserts nothing. Targets: validation failure < 3 s,
the whole host-basics preflight on a 3-node simulated cluster < 20 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")

MALFORMED = """\
all:
  children:
    trainers:
      hosts:
        node1: {ansible_host: 198.51.100.11, node_rank: 0}
        node2: {ansible_host: 198.51.100.12, node_rank: 0}
        node3: {ansible_host: 198.51.100.13}
  vars:
    cluster_data_mtu: "9000"
    master_port: 29500
"""


def env() -> dict:
    e = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    e["PATH"] = f"{Path(sys.executable).parent}:{e.get('PATH', '')}"
    return e


def timed(argv: list[str], marker: str | None) -> tuple[float, float | None, int]:
    """(wall seconds to exit, seconds until marker first appears in the output, rc)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = None
    for line in p.stdout:
        if marker and seen is None and marker in line:
            seen = time.perf_counter() - t0
    rc = p.wait()
    return time.perf_counter() - t0, seen, rc


def row(name: str, values: list[float]) -> str:
    return f"{name:<44} {min(values):7.2f} {statistics.median(values):7.2f} {max(values):7.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--preflight", metavar="INVENTORY", help="also time the preflight on this (simulated) cluster")
    ap.add_argument("--playbook", default="tests/integration/playbooks/cluster.yml",
                    help="playbook for --preflight (default: validation + host basics + report)")
    a = ap.parse_args()

    print(f"{'figure (seconds)':<44} {'min':>7} {'median':>7} {'max':>7}   runs={a.runs}")
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "hosts.yml"
        inv.write_text(MALFORMED)
        exits, stops = [], []
        for _ in range(a.runs):
            wall, seen, rc = timed([PLAYBOOK, "-i", str(inv), "site.yml"], "Stop if")
            if rc == 0 or seen is None:
                print("the malformed inventory did not stop in validation", file=sys.stderr)
                return 1
            exits.append(wall)
            stops.append(seen)
        print(row("site.yml start -> first 'Stop if' line", stops))
        print(row("site.yml start -> exit (validation failed)", exits))

    if a.preflight:
        walls = []
        for _ in range(a.runs):
            wall, _, rc = timed([PLAYBOOK, "-i", a.preflight, a.playbook], None)
            walls.append(wall)
            if rc != 0:
                print(f"note: {a.playbook} exited {rc} (a check failed or a node is down)")
        print(row(f"preflight {Path(a.playbook).name} on {Path(a.preflight).name}", walls))
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
