#!/usr/bin/env python3
"""Benchmark: wall time of a converged run of the container role (nothing to pull, nothing to recreate).

    .venv/bin/python tests/bench/container_rerun.py --name <sim cluster> [--runs 3]

Prints the wall time of each run, the median, and the slowest tasks of the last run (profile_tasks).
The first run converges (and may pull); it is reported apart and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = "tests/integration/playbooks/container.yml"


def run(inventory: str, extra: list[str]) -> tuple[float, str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PROFILE_TASKS_SORT_ORDER="descending", PROFILE_TASKS_TASK_OUTPUT_LIMIT="8")
    env["PATH"] = f"{REPO / '.venv/bin'}:{env.get('PATH', '')}"
    t0 = time.monotonic()
    r = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), "-i", inventory, PLAYBOOK, *extra], cwd=REPO,
                       env=env, capture_output=True, text=True)
    took = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"playbook failed:\n{r.stdout[-3000:]}{r.stderr[-2000:]}")
    return took, r.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="simulated cluster name (tests/sim/simcluster.py up --name)")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    meta = json.loads((REPO / ".sim" / args.name / "cluster.json").read_text())
    inventory = meta["inventory"]
    extra = []
    if "container_ulimits" not in (Path(inventory) / "group_vars" / "all.yml").read_text():
        extra = ["-e", json.dumps({"container_ulimits": {"memlock": 8388608, "stack": 67108864}})]
    first, _ = run(inventory, extra)
    times, out = [], ""
    for _ in range(args.runs):
        took, out = run(inventory, extra)
        times.append(took)
    nodes = len(meta["nodes"])
    print(f"container role, {nodes} nodes, load average {os.getloadavg()[0]:.1f}")
    print(f"  first run (converge):      {first:6.1f} s")
    for i, t in enumerate(times, 1):
        print(f"  converged run {i}:          {t:6.1f} s")
    print(f"  converged median:          {statistics.median(times):6.1f} s")
    print("  slowest tasks of the last converged run:")
    lines = out.split("TASKS RECAP", 1)[-1].splitlines()
    for line in [x for x in lines if " --- " in x or x.rstrip().endswith("s") and "-----" in x][:8]:
        print("   ", line.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
