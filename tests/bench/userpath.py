"""The user-path section of `make bench` (tests/bench/run.py --only userpath): converged site.yml, every role on.

    .venv/bin/python tests/bench/run.py --only userpath --sizes 2,4,8 --repeats 2

The path users run: default simulated nodes (`simcluster.py up`: each node with its own docker engine, so the
container role, nccl_check, the janitor and the launch all run), the default site.yml with a long job
(`-e` LONG_JOB: the job keeps training, so every converged re-run finds it running and records the same checks).
At each size the light harness (`--kind light`, the roles it cannot run there off, `--skip-tags launch`) runs
beside it, measured the same way (scale.measured_run: controller CPU from the run's own cpuacct cgroup, its main
process apart, the nodes' CPU from their containers' cgroups, tasks run and skipped per host from the recap).

What the roles the light harness cannot run cost per node comes from the difference of the two at the same sizes:
  roles(n) = user(n) - light(n), fitted as a + b·n for the main process, the workers and the nodes apart.
The light harness's own measured points at 16-64 nodes (the scale section's raw file, docs/benchmarks-scale.json,
or this run's when --only has scale too) plus roles(n) give the user path there; scale.model() fitted on those
points projects it to 256 and 1,024 nodes on a 16-core controller. Every row says whether it is measured or
estimated that way.
Raw results: docs/benchmarks-userpath.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import scale

REPO = Path(__file__).resolve().parents[2]
RAW = REPO / "docs/benchmarks-userpath.json"
# The benchmarks' long job (docs/benchmarks/scale-roles/measure.py): trains far past any run, saves every 50 steps.
LONG_JOB = json.dumps({"train_args_options": {"--steps": 100000, "--save-every": 50, "--sleep": 0.2,
                                              "--output-root": "{{ train_args_output_dir }}"}})
KINDS = {"user": ("node", ["-e", LONG_JOB]), "light": ("light", None)}  # simcluster kinds
COSTS = ("controller_cpu_s", "controller_main_cpu_s", "node_cpu_s", "controller_once_cpu_s")


def bench_userpath(sizes: list[int], repeats: int) -> dict:
    from helpers import BIN, SIM
    results: dict = {"sizes": [], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repeats": repeats,
                     "long_job": LONG_JOB,
                     "commit": os.environ.get("TRAINYARD_BENCH_COMMIT") or subprocess.run(
                         ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                         text=True).stdout.strip()}
    group = scale.CpuGroup(f"trainyard-userpath-{os.getpid()}")
    try:
        for n in sorted(sizes):
            entry: dict = {"nodes": n}
            results["sizes"].append(entry)
            for label, (kind, args) in KINDS.items():
                name = f"up{label[0]}{n}"
                subprocess.run([*SIM, "up", "--name", name, "--nodes", str(n), "--kind", kind], cwd=REPO, check=True)
                try:
                    meta = json.loads((REPO / ".sim" / name / "cluster.json").read_text())
                    inv, nodes = Path(meta["inventory"]), meta["nodes"]
                    first = scale.measured_run(BIN, inv, nodes, group, label=f"{label} first", args=args)
                    runs = [scale.measured_run(BIN, inv, nodes, group, label=f"{label} re-run {i + 1}", args=args)
                            for i in range(max(1, repeats))]
                    entry[label] = {"first": _slim(first), "reruns": [_slim(r) for r in runs],
                                    "median": _median(runs)}
                finally:
                    subprocess.run([*SIM, "down", "--name", name], cwd=REPO, check=False)
                RAW.write_text(json.dumps(results, indent=1) + "\n")  # a run cut short keeps what it measured
    finally:
        group.close()
    return results


def _slim(run: dict) -> dict:
    """A measured run without the per-task wall profile and SSH attribution (its per-task CPU kept)."""
    return {k: v for k, v in run.items() if k not in ("profile", "ssh_tasks", "cross_node_tasks")}


def _median(runs: list[dict]) -> dict:
    """The median of each cost over the converged re-runs (their spread beside it); counts from the first re-run."""
    ok = [r for r in runs if r["rc"] == 0 and r["changed"] == 0] or runs
    out = {k: ok[0][k] for k in ("nodes", "rc", "changed", "tasks_by_host", "head", "ssh_execs_per_node",
                                  "cores", "tasks_per_node", "tasks_run_per_node")}
    for k in (*COSTS, "wall_s", "others_cpu_s"):
        vals = [r[k] if r.get(k) is not None else scale.once_cpu_s(r) if k == "controller_once_cpu_s" else None
                for r in ok]
        if any(v is None for v in vals):  # a run measured before the once tasks' CPU was kept, without task_cpu
            continue
        out[k] = round(statistics.median(vals), 2)
        out[k + "_range"] = [min(vals), max(vals)]
    out["runs_used"] = len(ok)
    out["all_clean"] = all(r["rc"] == 0 and r["changed"] == 0 for r in runs)
    return out


def head_worker(point: dict) -> dict:
    """Tasks run and skipped on the head and on a worker (the first worker by name)."""
    by = point["tasks_by_host"]
    head = point["head"]
    worker = min((h for h in by if h != head), default=None)
    return {"head_run": by[head]["run"], "head_skipped": by[head]["skipped"],
            "worker_run": by[worker]["run"] if worker else None,
            "worker_skipped": by[worker]["skipped"] if worker else None}


def roles_cost(results: dict) -> dict:
    """What the roles the light harness cannot run add, per cost: a + b·n fitted on user(n) - light(n) (b·n alone
    where the fitted a is negative: the roles add work, they cannot save a run its fixed cost)."""
    pts = [e for e in results["sizes"] if "user" in e and "light" in e]
    ns = [e["nodes"] for e in pts]
    out = {"fitted_on": ns}
    for k in COSTS:
        if any(k not in e[label]["median"] for e in pts for label in ("user", "light")):
            continue
        diffs = [e["user"]["median"][k] - e["light"]["median"][k] for e in pts]
        a, b = scale.fit_line(ns, diffs) if len(pts) >= 2 else (0.0, diffs[0] / ns[0] if pts else 0.0)
        if a < 0:  # the roles cannot save a run anything: a negative fixed part is noise, fit the cost per node alone
            a, b = 0.0, sum(x * y for x, y in zip(ns, diffs)) / sum(x * x for x in ns)
        out[k] = {"per_node": round(b, 3), "fixed": round(a, 2), "diffs": [round(d, 2) for d in diffs]}
    return out


def fit_user(results: dict) -> dict:
    """Slope (CPU-s per added node) and intercept (per run) of the user path's controller CPU, least squares."""
    pts = [e for e in results["sizes"] if "user" in e]
    ns = [e["nodes"] for e in pts]
    ys = [e["user"]["median"]["controller_cpu_s"] for e in pts]
    if len(pts) < 2:
        return {}
    intercept, slope = scale.fit_line(ns, ys)
    return {"slope_s_per_node": round(slope, 2), "intercept_s": round(intercept, 2), "fitted_on": ns}


def estimated_points(light: list[dict], roles: dict) -> list[dict]:
    """The light harness's measured converged points with roles(n) added: the user path, estimated, at their sizes."""
    out = []
    for p in light:
        n = p["nodes"]
        q = dict(p)
        if "controller_once_cpu_s" not in q:
            q["controller_once_cpu_s"] = scale.once_cpu_s(p)
        for k in COSTS:
            if k in roles and q.get(k) is not None:
                q[k] = round(q[k] + roles[k]["fixed"] + roles[k]["per_node"] * n, 2)
            elif k == "controller_once_cpu_s":
                q[k] = None  # the roles' once tasks unknown: the model counts them as parallel
        out.append(q)
    return out


def light_points(scale_results: dict) -> list[dict]:
    return [e["median"] for e in sorted(scale_results.get("sizes", []), key=lambda e: e["nodes"])
            if e.get("median") and e["median"].get("failed") in (0, None)]


def _with_once(results: dict) -> None:
    """Medians kept before the once-per-run tasks' CPU was: computed again from their re-runs' per-task CPU."""
    for e in results.get("sizes", []):
        for label in ("user", "light"):
            if label in e and "controller_once_cpu_s" not in e[label]["median"] and e[label].get("reruns"):
                e[label]["median"] = _median(e[label]["reruns"])


def section(results: dict, scale_results: dict, scale_source: str, machine: str) -> str:
    _with_once(results)
    rows = []
    for e in sorted(results["sizes"], key=lambda e: e["nodes"]):
        for label in ("user", "light"):
            if label not in e:
                continue
            m = e[label]["median"]
            hw = head_worker(m)
            lo, hi = m["controller_cpu_s_range"]
            rows.append({"nodes": e["nodes"], "path": "every role on (default nodes)" if label == "user"
                         else "light harness", "runs": m["runs_used"], "clean": m["all_clean"],
                         "wall": m["wall_s"], "ctrl": m["controller_cpu_s"], "spread": f"{lo:.2f}-{hi:.2f}",
                         "main": m["controller_main_cpu_s"], "node": m["node_cpu_s"],
                         "ctrl_n": m["controller_cpu_s"] / e["nodes"],
                         "tasks": f"{hw['head_run']} / {hw['worker_run']}",
                         "skipped": f"{hw['head_skipped']} / {hw['worker_skipped']}"})
    fit = fit_user(results)
    roles = roles_cost(results)
    text = [f"## Scale on the user's path: every role on\n\nMachine: {machine}  \nDate: {results['date']} "
            f"(commit {results['commit']})  \nCommand: `{results.get('command', '')}`  \nRaw: "
            "`docs/benchmarks-userpath.json`\n\n"
            "Measured: converged re-runs of `site.yml` (median of the re-runs, after a first run), on default simulated "
            "nodes (every role on: the container role, nccl_check, the janitor and the launch, with a long job that "
            "keeps training) and on light nodes at the same sizes (the light harness: those roles off, "
            "`--skip-tags launch`). Controller CPU: the run's cgroup (ansible-playbook, its workers, SSH); main: the "
            "ansible-playbook process alone; node: the nodes' containers. Tasks: run (ok + failed) and skipped on "
            "the head / a worker, from the recap.\n\n"
            + scale.table(rows, [("nodes", "nodes", "d"), ("path", "path", ""), ("re-runs", "runs", "d"),
                                 ("changed 0, rc 0", "clean", ""), ("wall s", "wall", ".1f"),
                                 ("controller CPU s", "ctrl", ".2f"), ("min-max", "spread", ""),
                                 ("main process s", "main", ".2f"), ("node CPU s", "node", ".2f"),
                                 ("controller CPU s/node", "ctrl_n", ".2f"),
                                 ("tasks run head / worker", "tasks", ""),
                                 ("skipped head / worker", "skipped", "")])]
    if fit:
        text.append(f"Every role on, controller CPU fitted on {fit['fitted_on']} nodes: **{fit['slope_s_per_node']:.2f} "
                    f"CPU-s per added node** and **{fit['intercept_s']:.2f} s per run** (least squares over the "
                    "medians).\n")
    light = light_points(scale_results)
    if light and roles.get("fitted_on"):
        est = estimated_points(light, roles)
        r = roles
        text.append(
            f"### The user path at light-harness sizes (estimated: light measured + the roles' measured cost)\n\n"
            f"The roles the light harness cannot run (container, nccl_check, janitor, launch, and the checks they "
            f"feed), from user(n) - light(n) at {r['fitted_on']} nodes: controller "
            f"{r['controller_cpu_s']['per_node']:.3f} CPU-s per node + {r['controller_cpu_s']['fixed']:.2f} per run "
            f"(of it the main process {r['controller_main_cpu_s']['per_node']:.3f} + "
            f"{r['controller_main_cpu_s']['fixed']:.2f}), nodes {r['node_cpu_s']['per_node']:.3f} per node + "
            f"{r['node_cpu_s']['fixed']:.2f}. Light points: {scale_source}. These rows are **estimates**, not "
            "runs of the user path at these sizes.\n\n"
            + scale.table([{"nodes": p["nodes"], "light": lp["controller_cpu_s"], "est": p["controller_cpu_s"],
                            "est_n": p["controller_cpu_s"] / p["nodes"], "main": p["controller_main_cpu_s"],
                            "node": p["node_cpu_s"]} for p, lp in zip(est, light)],
                          [("nodes", "nodes", "d"), ("light measured controller CPU s", "light", ".1f"),
                           ("user path estimated controller CPU s", "est", ".1f"),
                           ("estimated s/node", "est_n", ".2f"), ("of it main process s", "main", ".1f"),
                           ("node CPU s", "node", ".1f")]))
        m = scale.model(est)
        text.append("### Projection of the user path: a 16-core controller, nodes in parallel (forks 64, 1 ms per "
                    "remote execution; scale.model() fitted on the estimated points above)\n\n"
                    + scale.ONCE_TXT.format(**m["fit"]) + "\n\n"
                    + scale.table(m["projection"], scale.PROJECTION_COLUMNS))
    return "\n".join(text)


def run(sizes: list[int], repeats: int, command: str, scale_results: dict | None, machine: str) -> str:
    results = bench_userpath(sizes, repeats)
    results["command"] = command
    RAW.write_text(json.dumps(results, indent=1) + "\n")
    if scale_results is None:
        scale_results = json.loads(scale.RAW.read_text()) if scale.RAW.exists() else {}
        source = (f"`docs/benchmarks-scale.json` (commit {scale_results.get('commit', '?')}, "
                  f"{scale_results.get('date', '?')})")
    else:
        source = "this run's scale section"
    results["scale_source"] = source
    RAW.write_text(json.dumps(results, indent=1) + "\n")
    return section(results, scale_results, source, machine)
