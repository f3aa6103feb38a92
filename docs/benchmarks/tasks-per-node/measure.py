#!/usr/bin/env python3
"""Tasks and module calls per node of a converged site.yml on light simulated nodes, with the scale harness's
own measurement (tests/bench/scale.py measured_run: recap tasks, ssh executions through a counting wrapper,
controller CPU from a cpuacct cgroup).

    .venv/bin/python tests/sim/simcluster.py up --name df2 --nodes 2 --kind light
    .venv/bin/python docs/benchmarks/tasks-per-node/measure.py --cluster .sim/df2/cluster.json --label after

Runs site.yml (--skip-tags launch, as the scale bench) once to converge and once more measured, from the tree
this file lives in, and writes <label>.json beside this file (the converged run's figures and its output tail
when it failed) and <label>.log (the converged run's ansible-playbook output).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path[:0] = [str(REPO / "tests/integration"), str(REPO / "tests/bench")]

import scale  # noqa: E402  (tests/bench is not a package: the harness is imported the way run.py imports it)
from conftest import BIN  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", required=True, help="the cluster.json of a light simulated cluster")
    ap.add_argument("--label", required=True)
    a = ap.parse_args()
    meta = json.loads(Path(a.cluster).read_text())
    inv, nodes = Path(meta["inventory"]), meta["nodes"]
    group = scale.CpuGroup(f"trainyard-df-{a.label}")
    try:
        first = scale.measured_run(BIN, inv, nodes, group, label="first")
        rerun = scale.measured_run(BIN, inv, nodes, group, label="converged", keep_output=True)
    finally:
        group.close()
    out = {"commit": scale.subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                          text=True).stdout.strip(),
           "first": {k: v for k, v in first.items() if k != "profile"},
           "converged": {k: v for k, v in rerun.items() if k not in ("profile", "output")},
           "converged_tasks": [name for name, _ in rerun["profile"]]}
    (HERE / f"{a.label}.log").write_text(rerun["output"])
    (HERE / f"{a.label}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["converged"], indent=1))
    return 0 if rerun["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
