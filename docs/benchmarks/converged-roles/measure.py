#!/usr/bin/env python3
"""Converged site.yml with every role on (default simulated nodes), two trees side by side: tasks per node and the
controller CPU, alternating run by run, at two cluster sizes for the slope (CPU per added node) and the fixed cost.

    .venv/bin/python tests/sim/simcluster.py up --name s5t2 --nodes 2
    .venv/bin/python tests/sim/simcluster.py up --name s5t --nodes 3
    git archive --prefix=base/ <base commit> | tar -x -C /tmp/s5t          # the tree to compare with
    .venv/bin/python docs/benchmarks/converged-roles/measure.py --tree base=/tmp/s5t/base --tree this=. \\
        --cluster s5t2 --cluster s5t --rounds 3 --label run1

Each run is `ansible-playbook -i inventory/sim-<cluster> site.yml -e <long job>` from the tree's directory with that
tree's ansible.cfg (the long job keeps the training job running, as the scale bench does: the NCCL check then records
that it waits, every run the same); every tree converges each cluster once first (not measured). Controller CPU:
user + system of ansible-playbook and every process it waited for (its workers, the SSH clients), from wait4().
Tasks per node: ok + changed (run) and skipped of each node's PLAY RECAP line. Writes <label>.jsonl (one line a run)
and <label>-<tree>-<cluster>-<round>.log (the playbook output) beside this file, and prints medians and spreads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
LONG_JOB = json.dumps({"train_args_options": {"--steps": 100000, "--save-every": 50, "--sleep": 0.2,
                                              "--output-root": "{{ train_args_output_dir }}"}})
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.M)
CHECKS = re.compile(r'"node\s+rank\s+([^"]+)"')


LIGHT = False  # --light: the light harness's run (light nodes, --skip-tags launch, no long job)
EXTRA: list[str] = []  # --extra-vars: passed to every run as -e


def run(tree: Path, cluster: str, log: Path) -> dict:
    meta = json.loads((REPO / ".sim" / cluster / "cluster.json").read_text())
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(REPO / meta["inventory"]), "site.yml",
            *(["--skip-tags", "launch"] if LIGHT else ["-e", LONG_JOB]), *(x for e in EXTRA for x in ("-e", e))]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_CONFIG=str(tree / "ansible.cfg"))
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    with log.open("w") as fh:
        p = subprocess.Popen(argv, cwd=tree, env=env, stdout=fh, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    out = log.read_text()
    recap = {m.group(1): [int(x) for x in m.groups()[1:]] for m in RECAP.finditer(out)}
    nodes = [h for h in recap if h in meta["nodes"]]
    checks = CHECKS.search(out)
    return {"cluster": cluster, "nodes": len(nodes), "rc": os.waitstatus_to_exitcode(status), "wall_s": round(wall, 2),
            "controller_cpu_s": round(ru.ru_utime + ru.ru_stime, 2), "load1_before": round(load0, 2),
            "load1_after": round(os.getloadavg()[0], 2),
            "changed": sum(recap[h][1] for h in nodes),
            "run_per_node": {h: recap[h][0] for h in nodes},  # ok counts changed too
            "skipped_per_node": {h: recap[h][4] for h in nodes},
            "localhost": recap.get("localhost"),
            "check_ids": checks.group(1).split() if checks else None}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", required=True, help="name=path of a tree to run site.yml from")
    ap.add_argument("--cluster", action="append", required=True, help="a simulated cluster's name (.sim/<name>)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", type=Path, default=HERE, help="where the logs and summaries go (default: beside this file)")
    ap.add_argument("--no-converge", action="store_true", help="the clusters are converged by these trees already")
    ap.add_argument("--light", action="store_true",
                    help="light nodes (simcluster.py up --kind light): site.yml --skip-tags launch, as the scale bench")
    ap.add_argument("--extra-vars", action="append", default=[], help="-e for every run (e.g. cluster_lock_stale_s=40)")
    a = ap.parse_args()
    global LIGHT
    LIGHT = a.light
    EXTRA[:] = a.extra_vars
    trees = [(n, Path(p).resolve()) for n, p in (t.split("=", 1) for t in a.tree)]
    if not a.no_converge:
        for cluster in a.cluster:
            for name, tree in trees:
                run(tree, cluster, a.out / f"{a.label}-{name}-{cluster}-converge.log")
    rows = []
    with (a.out / f"{a.label}.jsonl").open("w") as fh:
        for rnd in range(1, a.rounds + 1):
            for cluster in a.cluster:
                order = trees if rnd % 2 else list(reversed(trees))  # alternate which tree goes first
                for name, tree in order:
                    row = dict(run(tree, cluster, a.out / f"{a.label}-{name}-{cluster}-{rnd}.log"), tree=name,
                               round=rnd)
                    rows.append(row)
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    print(json.dumps({k: v for k, v in row.items() if k != "check_ids"}), flush=True)
    summary = {}
    for name, _ in trees:
        per = {}
        for cluster in a.cluster:
            rs = [r for r in rows if r["tree"] == name and r["cluster"] == cluster]
            cpu = [r["controller_cpu_s"] for r in rs]
            per[cluster] = {"nodes": rs[0]["nodes"], "runs": len(rs), "cpu_median_s": statistics.median(cpu),
                            "cpu_min_s": min(cpu), "cpu_max_s": max(cpu),
                            "run_per_node": rs[0]["run_per_node"], "skipped_per_node": rs[0]["skipped_per_node"],
                            "changed": sorted({r["changed"] for r in rs}), "rc": sorted({r["rc"] for r in rs})}
        sizes = sorted(per.values(), key=lambda v: v["nodes"])
        if len(sizes) >= 2 and sizes[-1]["nodes"] > sizes[0]["nodes"]:
            slope = (sizes[-1]["cpu_median_s"] - sizes[0]["cpu_median_s"]) / (sizes[-1]["nodes"] - sizes[0]["nodes"])
            per["slope_cpu_per_node_s"] = round(slope, 2)
            per["fixed_cpu_s"] = round(sizes[0]["cpu_median_s"] - slope * sizes[0]["nodes"], 2)
        summary[name] = per
    (a.out / f"{a.label}-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
