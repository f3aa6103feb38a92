"""The sharded-run section of `make bench` (tests/bench/run.py --only shards): converged site.yml on light nodes in one
ansible-playbook process against the same run split over K child processes (docs/sharding.md), side by side.

    .venv/bin/python tests/bench/run.py --only shards --shard-sizes 16,32 --shard-counts 1,2 --repeats 2

Per size (light simulated nodes, tests/bench/scale.py's harness and its measured_run): one converging run, then
--repeats rounds, each round one converged re-run per K in turn (K = 1 is cluster_shard_nodes 0, one process; K > 1
is cluster_shard_nodes = ceil(n / K) with cluster_shard_max K). Each run: wall time, controller CPU (every process
of the run: the parent, its children and all their workers, from the run's cpuacct cgroup), the parent's main
process CPU and each child's main process CPU (sampled each second from /proc), changed (0 in every child) and the
report's check ids and statuses (the same for every K).

The projection (projection()) takes what a sharded run puts on one core: the parent's main process (validate, the
lock, the split) plus the busiest child's main process (its n / K nodes), and what spreads over the cores (every
worker), each a line fitted over the measured sizes, for a 16-core controller at 256 and 1,024 nodes.
Raw output: docs/benchmarks-shards.json. Figures are never asserted.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import scale

REPO = scale.REPO
RAW = REPO / "docs/benchmarks-shards.json"
RAW_USER = REPO / "docs/benchmarks-shards-user.json"


def log(msg: str) -> None:
    scale.log(msg)


def raw_path(kind: str) -> Path:
    """The raw output of a kind of run: the light harness's, or the user path's."""
    return RAW_USER if kind == "user" else RAW


def report_statuses() -> dict:
    data = json.loads((REPO / "runs/latest/report.json").read_text())
    return {f"{x['host']} {x['check']}": x["status"] for x in data["records"]}


def shard_args(n: int, k: int, kind: str = "light") -> list[str]:
    """The light harness's arguments (--skip-tags launch), or the user path's (every role, the launch of a long job:
    tests/bench/userpath.py), with the shard settings for K."""
    import userpath
    per = 0 if k <= 1 else math.ceil(n / k)
    base = list(scale.SKIP) if kind == "light" else list(userpath.KINDS["user"][1])
    return [*base, "-e", f"cluster_shard_nodes={per}", "-e", f"cluster_shard_max={max(1, k)}"]


def bench_shards(sizes: list[int], counts: list[int], repeats: int, kind: str = "light") -> dict:
    """kind light: light simulated nodes; user: default simulated nodes, every role on (the user's path)."""
    from helpers import BIN, SIM
    results: dict = {"sizes": [], "counts": counts, "kind": kind, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "cores": os.cpu_count(),
                     "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                              text=True).stdout.strip()}
    group = scale.CpuGroup(f"trainyard-bench-shards-{os.getpid()}")
    try:
        for n in sizes:
            name = f"hs{kind[0]}{n}"
            subprocess.run([*SIM, "up", "--name", name, "--nodes", str(n), "--kind", "light" if kind == "light" else "node"],
                           cwd=REPO, check=True)
            meta = json.loads((REPO / ".sim" / name / "cluster.json").read_text())
            inv = Path(meta["inventory"])
            try:
                scale.measured_run(BIN, inv, meta["nodes"], group, label="first", args=shard_args(n, 1, kind))
                entry: dict = {"nodes": n, "runs": []}
                results["sizes"].append(entry)
                for rnd in range(max(1, repeats)):
                    for k in counts:
                        row = scale.measured_run(BIN, inv, meta["nodes"], group, label=f"K={k} round {rnd + 1}",
                                                 args=shard_args(n, k, kind))
                        row.pop("profile", None)
                        row.pop("task_cpu", None)
                        row.pop("ssh_tasks", None)
                        row["k"], row["round"] = k, rnd + 1
                        row["statuses"] = report_statuses()
                        entry["runs"].append(row)
                        log(f"  K={k}: shard main processes {row['shard_main_cpu_s']} CPU-s")
                        raw_path(kind).write_text(json.dumps(results, indent=1) + "\n")  # a cut run keeps these
            finally:
                subprocess.run([*SIM, "down", "--name", name], cwd=REPO, check=False)
    finally:
        group.close()
    return results


def _by_node(statuses: dict) -> dict:
    """Statuses keyed by node index and check: the same cluster size brought up under another name compares equal."""
    return {re.sub(r"^\S*-node(\d+) ", r"node\1 ", k): v for k, v in statuses.items()}


def _median(rows: list[dict], key) -> float:
    return statistics.median(key(r) for r in rows)


def summary(results: dict) -> list[dict]:
    """Per size and K: medians over the rounds, and whether every run had changed 0 and the K = 1 report."""
    out = []
    for entry in results["sizes"]:
        n = entry["nodes"]
        base = next((_by_node(r["statuses"]) for r in entry["runs"] if r["k"] == 1), None)
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
                "same_report": all(_by_node(r["statuses"]) == base for r in rows) if base is not None else None,
                "walls": [r["wall_s"] for r in rows],
            })
    return out


def fit_plane(xs: list[tuple[float, float]], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b·u + c·v over points (u, v) -> (a, b, c) (the normal equations, solved by Cramer's
    rule); with the points on one line in (u, v), c = 0 and fit_line over u."""
    rows = [(1.0, u, v) for u, v in xs]
    m = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    t = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(3)]

    def det(a):
        return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
                + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))

    d = det(m)
    if abs(d) < 1e-9 * max(1.0, abs(m[2][2]) ** 3):
        a, b = scale.fit_line([u for u, _ in xs], ys)
        return a, b, 0.0
    out = []
    for k in range(3):
        mk = [[t[i] if j == k else m[i][j] for j in range(3)] for i in range(3)]
        out.append(det(mk) / d)
    return out[0], out[1], out[2]


def projection(rows: list[dict], cores: int = 16) -> dict:
    """Lines a + b·x fitted over the measured sizes (tests/bench/scale.py's fit_line), then a 16-core projection.

    One process: its main process a + b·n on one core, the workers over the cores. Sharded: the parent's main process
    (validate, the lock, the split) c + d·n, then the busiest child's main process e + f·(n / K) on a core of its own,
    the workers (everything else the run used: every child's workers and the parent's) g + h·n over the cores; the
    children start together. Each fit is checked against the measured points (the largest error is printed)."""
    one = [r for r in rows if r["k"] == 1]
    split = [r for r in rows if r["k"] > 1]
    if len(one) < 2 or len(split) < 2:
        return {}
    fit = scale.fit_line
    main = fit([r["nodes"] for r in one], [r["parent_main_cpu_s"] for r in one])
    one_workers = fit([r["nodes"] for r in one], [r["controller_cpu_s"] - r["parent_main_cpu_s"] for r in one])
    parent = fit([r["nodes"] for r in split], [r["parent_main_cpu_s"] for r in split])
    # A child pays for its shard's nodes and, in its validate play and its cross-node steps, for every node.
    child = fit_plane([(r["nodes"] / r["k"], r["nodes"]) for r in split], [r["child_main_max_cpu_s"] for r in split])
    workers = fit([r["nodes"] for r in split], [r["controller_cpu_s"] - r["parent_main_cpu_s"] - r["child_main_sum_cpu_s"]
                                                for r in split])

    # The scale section's model of the workers: a per-node cost that grows with n (scale.fit_growth), the total
    # n times it: the cautious one at 1,024 nodes.
    growth = scale.fit_growth([r["nodes"] for r in split],
                              [(r["controller_cpu_s"] - r["parent_main_cpu_s"] - r["child_main_sum_cpu_s"]) / r["nodes"]
                               for r in split])

    def at(line, x):
        return line[0] + line[1] * x

    def one_process(n):
        return at(main, n) + at(one_workers, n) / cores

    def at_child(n, k):
        return child[0] + child[1] * n / k + child[2] * n

    def sharded(n, k, grow=False):
        w = n * at(growth, n) if grow else at(workers, n)
        return at(parent, n) + at_child(n, k) + w / cores

    def off(f, rows_, key):
        return max(abs(f(r) - key(r)) for r in rows_)

    out = {"cores": cores,
           "one_process_main": [round(main[0], 2), round(main[1], 4)],
           "one_process_workers": [round(one_workers[0], 2), round(one_workers[1], 4)],
           "parent_main": [round(parent[0], 2), round(parent[1], 4)],
           "child_main": [round(child[0], 2), round(child[1], 4), round(child[2], 4)],
           "workers": [round(workers[0], 2), round(workers[1], 4)],
           "fit_error_cpu_s": round(max(off(lambda r: at(main, r["nodes"]), one, lambda r: r["parent_main_cpu_s"]),
                                        off(lambda r: at_child(r["nodes"], r["k"]), split,
                                            lambda r: r["child_main_max_cpu_s"])), 2),
           "points": []}
    for n, k in ((256, 1), (256, 4), (256, 8), (1024, 1), (1024, 8), (1024, 16)):
        out["points"].append({"nodes": n, "k": k, "projected_s": round(one_process(n) if k == 1 else sharded(n, k), 1),
                              "projected_growing_s": None if k == 1 else round(sharded(n, k, True), 1)})
    out["workers_growing"] = [round(growth[0], 4), round(growth[1], 6)]
    return out


def user_estimate(light_results: dict, userpath_results: dict, cores: int = 16) -> dict:
    """The user path sharded, estimated from firmer parts than its own runs at 4-8 nodes: the light harness's sharded
    fits (its raw file: 16-64 nodes, K varied, so a child's per-shard and per-cluster terms are told apart) plus what
    the roles the light harness cannot run add per node (tests/bench/userpath.py roles_cost, one process, user(n) -
    light(n) at the same sizes): their main-process cost lands in the child that holds the node, the rest with the
    workers over the cores."""
    import userpath
    p = projection(summary(light_results), cores)
    roles = userpath.roles_cost(userpath_results)
    if not p or "controller_cpu_s" not in roles or "controller_main_cpu_s" not in roles:
        return {}
    main_n = roles["controller_main_cpu_s"]["per_node"]
    rest_n = roles["controller_cpu_s"]["per_node"] - main_n
    fixed = roles["controller_cpu_s"]["fixed"]

    def at(n, k):
        s_ = -(-n // k)
        parent = p["parent_main"][0] + p["parent_main"][1] * n
        child = p["child_main"][0] + p["child_main"][1] * s_ + p["child_main"][2] * n + main_n * s_
        workers = p["workers"][0] + p["workers"][1] * n + rest_n * n + fixed
        return parent + child + workers / cores

    return {"light": {k: light_results.get(k) for k in ("commit", "date", "command")},
            "userpath": {k: userpath_results.get(k) for k in ("commit", "date", "command")},
            "roles_main_per_node": main_n, "roles_workers_per_node": round(rest_n, 3), "roles_fixed": fixed,
            "points": [{"nodes": n, "k": k, "estimated_s": round(at(n, k), 1)}
                       for n, k in ((256, 8), (256, 16), (1024, 16), (1024, 32))]}


def estimate_lines(est: dict) -> list[str]:
    if not est:
        return []
    lines = ["", "Estimated instead from the light harness's sharded fits (`docs/benchmarks-shards.json`, "
                 f"{est['light']['commit']}, {est['light']['date']}: 16-64 nodes, K varied) plus what the roles add per "
                 f"node in one process (`docs/benchmarks-userpath.json`, {est['userpath']['commit']}, "
                 f"{est['userpath']['date']}: the main process {est['roles_main_per_node']} CPU-s, in the child that "
                 f"holds the node; the workers {est['roles_workers_per_node']}, over the cores); same projection rules:",
             "", "| nodes | K | estimated s |", "|---|---|---|"]
    lines += [f"| {x['nodes']} | {x['k']} | {x['estimated_s']} |" for x in est["points"]]
    return lines


def section(results: dict, machine: str, estimate: dict | None = None) -> str:
    rows = summary(results)
    user = results.get("kind") == "user"
    what = ("default simulated nodes, every role on, converged site.yml with a long job running (the user's path)"
            if user else "light simulated nodes, converged site.yml --skip-tags launch")
    raw = raw_path("user" if user else "light").relative_to(REPO)
    roles = "every role on" if user else "the light harness's roles"
    lines = [f"## Sharded runs{', every role on' if user else ''}: one process against K (docs/sharding.md)", "",
             f"Command: `{results.get('command', '')}` at {results.get('commit', '?')}, {results.get('date', '?')}; "
             f"{machine}. {what[0].upper() + what[1:]}, each K in turn per round (medians). Raw: `{raw}`.", "",
             "| nodes | K | wall s | controller CPU-s | parent main CPU-s | busiest child main CPU-s | children main "
             "CPU-s | changed | same report as K=1 | walls |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['nodes']} | {r['k']} | {r['wall_s']:.1f} | {r['controller_cpu_s']:.1f} | "
                     f"{r['parent_main_cpu_s']:.1f} | {r['child_main_max_cpu_s']:.1f} | {r['child_main_sum_cpu_s']:.1f} "
                     f"| {r['changed']} | {r['same_report']} | {', '.join(f'{w:.1f}' for w in r['walls'])} |")
    p = projection(rows)
    if p:
        def line(f):
            return f"{f[0]} + {f[1]}·x CPU-s"
        lines += ["", "Fitted over these sizes (x: nodes): one process's main "
                      f"process {line(p['one_process_main'])}, its workers {line(p['one_process_workers'])}; sharded: "
                      f"the parent's main process {line(p['parent_main'])}, the busiest child's main process "
                      f"{p['child_main'][0]} + {p['child_main'][1]}·s + {p['child_main'][2]}·n CPU-s (s the nodes of its "
                      f"shard, n every node), every worker of the run {line(p['workers'])} (largest error of the "
                      f"main-process fits at a measured point: {p['fit_error_cpu_s']} CPU-s).", "",
                  f"Projected for a {p['cores']}-core controller (the main processes on one core each, the parent's "
                  f"then the busiest child's; the workers over the cores; {roles}):", "",
                  "| nodes | K | projected s | projected s, workers' per-node cost growing with n |", "|---|---|---|---|"]
        lines += [f"| {x['nodes']} | {x['k']} | {x['projected_s']} | {x.get('projected_growing_s') or '-'} |"
                  for x in p["points"]]
        lines += ["", f"The last column takes the workers' per-node cost as the scale section's model does, growing "
                      f"with n ({p['workers_growing'][0]} + {p['workers_growing'][1]}·n CPU-s per node), the cautious "
                      "extrapolation; the one before it, the workers' total as a line in n."]
    lines += estimate_lines(estimate or {})
    return "\n".join(lines) + "\n"
