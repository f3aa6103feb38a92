#!/usr/bin/env python3
"""Container role figures (prints them; asserts nothing):

  first      the converging run on fresh nodes: every node pulls the training image from the local registry
  converged  re-runs with nothing to pull or recreate (changed=0), the role's default
  pull       re-runs with container_pull_always=true, to show what skipping the pull of a present image saves
and the slowest tasks of the last converged run (profile_tasks).

    python3 tests/bench/bench_container.py [--name <existing sim cluster>] [--nodes 3] [--repeats 3]

Without --name it brings up its own cluster (bench-ctr) and removes it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from helpers import SimCluster, parse_recap, run_playbook, sim_down, sim_up  # noqa: E402

PLAYBOOK = "tests/integration/playbooks/container.yml"
# The simulated nodes' engines cannot raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE): use their own hard limit.
SIM_ULIMITS = {"memlock": 8388608, "stack": 67108864}


def timed(cluster: SimCluster, *extra: str) -> tuple[float, str]:
    args = list(extra)
    if "container_ulimits" not in (cluster.inventory / "group_vars" / "all.yml").read_text():
        args += ["-e", json.dumps({"container_ulimits": SIM_ULIMITS})]
    env = {"PROFILE_TASKS_SORT_ORDER": "descending", "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "6"}
    t0 = time.monotonic()
    r = run_playbook(cluster.inventory, PLAYBOOK, *args, env=env)
    took = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"playbook failed:\n{r.stdout[-3000:]}")
    return took, r.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", help="use this running simulated cluster instead of bringing one up")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    own = args.name is None
    name = args.name or "bench-ctr"
    cluster = sim_up(name, args.nodes) if own else SimCluster(name)
    try:
        first, _ = timed(cluster)
        converged, out = [], ""
        for _ in range(args.repeats):
            took, out = timed(cluster)
            changed = sum(v["changed"] for h, v in parse_recap(out).items() if h != "localhost")
            converged.append(took)
        slow = [line.strip() for line in out.split("TASKS RECAP", 1)[-1].splitlines() if " ---" in line][:6]
        pulled = [timed(cluster, "-e", "container_pull_always=true")[0] for _ in range(args.repeats)]
    finally:
        if own:
            sim_down(name)
    print(f"container role on {len(cluster.nodes)} simulated nodes (load average {os.getloadavg()[0]:.1f})")
    print("| run | seconds |\n|---|---|")
    print(f"| first (pull + create) | {first:.1f} |")
    print(f"| converged re-run, median of {args.repeats} (changed={changed}) | {statistics.median(converged):.1f} |")
    print(f"| re-run with container_pull_always=true, median of {args.repeats} | {statistics.median(pulled):.1f} |")
    print("\nslowest tasks of the last converged run:")
    for line in slow:
        print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
