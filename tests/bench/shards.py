"""The sharded-run section of `make bench` (tests/bench/run.py --only shards): converged site.yml on light nodes in one
ansible-playbook process against the same run split over K child processes (docs/sharding.md), side by side.

    .venv/bin/python tests/bench/run.py --only shards --shard-sizes 16,32 --shard-counts 1,2 --repeats 2

Per size (light simulated nodes, tests/bench/scale.py's harness and its measured_run): one converging run, then
--repeats rounds, each round one converged re-run per K in turn (K = 1 is cluster_shard_nodes 0, one process; K > 1
is cluster_shard_nodes = ceil(n / K) with cluster_shard_max K). Each run: wall time, controller CPU (every process
of the run: the parent, its children and all their workers, from the run's cpuacct cgroup), the parent's main
process CPU and each child's main process CPU (sampled each second from /proc), changed (0 in every child) and the
report's check ids and statuses (the same for every K).

The projection (section()) takes what a sharded run puts on one core: the parent's main process (validate, the lock,
the split: per node, from the K > 1 runs) plus one child's main process (its n / K nodes), and what spreads over the
cores (every worker), each fitted per node over the measured sizes, for a 16-core controller at 256 and 1,024 nodes.
Raw output: docs/benchmarks-shards.json. Figures are never asserted.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import time
from pathlib import Path

import scale

REPO = scale.REPO
RAW = REPO / "docs/benchmarks-shards.json"


def log(msg: str) -> None:
    scale.log(msg)


def report_statuses() -> dict:
    data = json.loads((REPO / "runs/latest/report.json").read_text())
    return {f"{x['host']} {x['check']}": x["status"] for x in data["records"]}


def shard_args(n: int, k: int) -> list[str]:
    per = 0 if k <= 1 else math.ceil(n / k)
    return [*scale.SKIP, "-e", f"cluster_shard_nodes={per}", "-e", f"cluster_shard_max={max(1, k)}"]


def bench_shards(sizes: list[int], counts: list[int], repeats: int) -> dict:
    from helpers import BIN, SIM
    results: dict = {"sizes": [], "counts": counts, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "cores": os.cpu_count(),
                     "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                              text=True).stdout.strip()}
    group = scale.CpuGroup(f"trainyard-bench-shards-{os.getpid()}")
    try:
        for n in sizes:
            name = f"hs{n}"
            subprocess.run([*SIM, "up", "--name", name, "--nodes", str(n), "--kind", "light"], cwd=REPO, check=True)
            meta = json.loads((REPO / ".sim" / name / "cluster.json").read_text())
            inv = Path(meta["inventory"])
            try:
                scale.measured_run(BIN, inv, meta["nodes"], group, label="first", args=shard_args(n, 1))
                entry: dict = {"nodes": n, "runs": []}
                results["sizes"].append(entry)
                for rnd in range(max(1, repeats)):
                    for k in counts:
                        row = scale.measured_run(BIN, inv, meta["nodes"], group, label=f"K={k} round {rnd + 1}",
                                                 args=shard_args(n, k))
                        row.pop("profile", None)
                        row.pop("task_cpu", None)
                        row.pop("ssh_tasks", None)
                        row["k"], row["round"] = k, rnd + 1
                        row["statuses"] = report_statuses()
                        entry["runs"].append(row)
                        log(f"  K={k}: shard main processes {row['shard_main_cpu_s']} CPU-s")
                        RAW.write_text(json.dumps(results, indent=1) + "\n")
            finally:
                subprocess.run([*SIM, "down", "--name", name], cwd=REPO, check=False)
    finally:
        group.close()
    return results


def _median(rows: list[dict], key) -> float:
    return statistics.median(key(r) for r in rows)


def summary(results: dict) -> list[dict]:
    """Per size and K: medians over the rounds, and whether every run had changed 0 and the K = 1 report."""
    out = []
    for entry in results["sizes"]:
        n = entry["nodes"]
        base = next((r["statuses"] for r in entry["runs"] if r["k"] == 1), None)
        for k in results["counts"]:
            rows = [r for r in entry["runs"] if r["k"] == k]
            if not rows:
                continue
            out.append({
                "nodes": n, "k": k, "runs": len(rows),
                "wall_s": _median(rows, lambda r: r["wall_s"]),
                "controller_cpu_s": _median(rows, lambda r: r["controller_cpu_s"]),
                "parent_main_cpu_s": _median(rows, lambda r: r["controller_main_cpu_s"]),
                "child_main_max_cpu_s": _median(rows, lambda r: max(r["shard_main_cpu_s"] or [0.0])),
                "child_main_sum_cpu_s": _median(rows, lambda r: sum(r["shard_main_cpu_s"] or [0.0])),
                "changed": max(r["changed"] or 0 for r in rows), "rc": max(r["rc"] for r in rows),
                "same_report": all(r["statuses"] == base for r in rows) if base is not None else None,
                "walls": [r["wall_s"] for r in rows],
            })
    return out


def projection(rows: list[dict], cores: int = 16) -> dict:
    """Per-node costs fitted over the measured sizes and a 16-core projection of a sharded run:
    critical path = parent's main process + the busiest child's main process + the workers spread over the cores."""
    one = [r for r in rows if r["k"] == 1]
    split = [r for r in rows if r["k"] > 1]
    if not one or not split:
        return {}
    main_per_node = statistics.median(r["parent_main_cpu_s"] / r["nodes"] for r in one)
    parent_per_node = statistics.median(r["parent_main_cpu_s"] / r["nodes"] for r in split)
    child_per_node = statistics.median(r["child_main_max_cpu_s"] / (r["nodes"] / r["k"]) for r in split)
    workers_per_node = statistics.median((r["controller_cpu_s"] - r["parent_main_cpu_s"] - r["child_main_sum_cpu_s"])
                                         / r["nodes"] for r in split)
    out = {"one_process_main_cpu_per_node_s": round(main_per_node, 4),
           "parent_main_cpu_per_node_s": round(parent_per_node, 4),
           "child_main_cpu_per_node_s": round(child_per_node, 4),
           "workers_cpu_per_node_s": round(workers_per_node, 4), "cores": cores, "points": []}
    for n, k in ((256, 1), (256, 4), (256, 8), (1024, 1), (1024, 8), (1024, 16)):
        if k == 1:
            t = main_per_node * n + workers_per_node * n / cores
        else:
            t = parent_per_node * n + child_per_node * n / k + workers_per_node * n / cores
        out["points"].append({"nodes": n, "k": k, "projected_s": round(t, 1)})
    return out


def section(results: dict, machine: str) -> str:
    rows = summary(results)
    lines = ["## Sharded runs: one process against K (docs/sharding.md)", "",
             f"Command: `{results.get('command', '')}` at {results.get('commit', '?')}, {results.get('date', '?')}; "
             f"{machine}. Light simulated nodes, converged site.yml --skip-tags launch, each K in turn per round "
             "(medians). Raw: `docs/benchmarks-shards.json`.", "",
             "| nodes | K | wall s | controller CPU-s | parent main CPU-s | busiest child main CPU-s | children main "
             "CPU-s | changed | same report as K=1 | walls |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['nodes']} | {r['k']} | {r['wall_s']:.1f} | {r['controller_cpu_s']:.1f} | "
                     f"{r['parent_main_cpu_s']:.1f} | {r['child_main_max_cpu_s']:.1f} | {r['child_main_sum_cpu_s']:.1f} "
                     f"| {r['changed']} | {r['same_report']} | {', '.join(f'{w:.1f}' for w in r['walls'])} |")
    p = projection(rows)
    if p:
        lines += ["", f"Per node, fitted over these sizes: one process's main process "
                      f"{p['one_process_main_cpu_per_node_s']} CPU-s; sharded: the parent's main process "
                      f"{p['parent_main_cpu_per_node_s']}, a child's main process {p['child_main_cpu_per_node_s']} per "
                      f"node of its shard, every worker {p['workers_cpu_per_node_s']} (spread over the cores).", "",
                  f"Projected for a {p['cores']}-core controller (parent + busiest child on one core each, the "
                  "workers over the cores; the light harness's roles):", "",
                  "| nodes | K | projected s |", "|---|---|---|"]
        lines += [f"| {x['nodes']} | {x['k']} | {x['projected_s']} |" for x in p["points"]]
    return "\n".join(lines) + "\n"
