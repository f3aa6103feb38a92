#!/usr/bin/env python3
"""A setting of the controller off against on, side by side: converged site.yml on the user's path (every role on,
the bench's long job), on one running simulated cluster, alternating which goes first round by round.

    .venv/bin/python tests/sim/simcluster.py up --name p8 --nodes 8
    .venv/bin/python docs/benchmarks/compiled-templates/ab.py --cluster p8 --off TRAINYARD_COMPILED_TEMPLATES=false \\
        --rounds 4 --out docs/benchmarks/compiled-templates/p8.jsonl

--off may be given more than once (every setting off together); --light runs the light harness's site.yml (a cluster
of --kind light nodes, --skip-tags launch) instead of the user's path.

Each run is tests/bench/scale.py's measured_run (the controller's CPU from its cgroup: ansible-playbook, its
workers, SSH; the main process alone; the CPU of every task), one JSON line a run in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests/bench")]

import scale  # noqa: E402
import userpath  # noqa: E402
from helpers import BIN  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--off", required=True, action="append", help="VAR=value: the environment of the 'off' runs")
    ap.add_argument("--light", action="store_true", help="the light harness's site.yml (light nodes)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    off_env = dict(kv.split("=", 1) for kv in a.off)
    meta = json.loads((REPO / ".sim" / a.cluster / "cluster.json").read_text())
    inv, nodes = REPO / meta["inventory"], meta["nodes"]
    group = scale.CpuGroup(f"ab-{os.getpid()}")
    rows = []
    try:
        with a.out.open("w") as fh:
            for rnd in range(a.rounds):
                for kind in (("off", "on") if rnd % 2 == 0 else ("on", "off")):
                    r = scale.measured_run(BIN, inv, nodes, group, label=f"{kind} {rnd + 1}",
                                           args=None if a.light else userpath.KINDS["user"][1],
                                           env_extra=off_env if kind == "off" else None)
                    row = {"round": rnd + 1, "kind": kind, "off": off_env, "light": a.light, "nodes": len(nodes),
                           **{k: r.get(k) for k in ("rc", "wall_s", "changed", "controller_cpu_s",
                                                    "controller_main_cpu_s", "node_cpu_s", "task_cpu")}}
                    rows.append(row)
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
    finally:
        group.close()
    for kind in ("off", "on"):
        cpu = [r["controller_cpu_s"] for r in rows if r["kind"] == kind]
        main_ = [r["controller_main_cpu_s"] for r in rows if r["kind"] == kind]
        print(f"{kind}: controller CPU median {statistics.median(cpu):.2f} s ({min(cpu):.2f}-{max(cpu):.2f}), "
              f"main process median {statistics.median(main_):.2f} s, changed {[r['changed'] for r in rows if r['kind'] == kind]}")


if __name__ == "__main__":
    main()
