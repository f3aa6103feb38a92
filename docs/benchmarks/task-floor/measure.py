#!/usr/bin/env python3
"""Where a converged site.yml's controller CPU per node goes: Ansible's own cost per task and host, and the cost of
templating a task's arguments (issue 35, docs/benchmarks.md "The controller's cost per node, taken apart").

    .venv/bin/python tests/sim/simcluster.py up --name tf --nodes 4
    .venv/bin/ansible-playbook -i inventory/sim-tf site.yml -e '<the bench long job>'     # converge once
    .venv/bin/python docs/benchmarks/task-floor/measure.py floor --cluster tf --rounds 3 --out docs/benchmarks/task-floor/floor.json
    .venv/bin/python docs/benchmarks/task-floor/measure.py profile --cluster tf --out docs/benchmarks/task-floor/profile.json

floor: playbooks of --tasks identical tasks on every node of the cluster, with this project's ansible.cfg: meta noop
(no worker: the run's fixed cost), a task skipped by `when: false`, an `assert` (a worker, no node call), a
`ping` (a worker and one pipelined module run over SSH), and the same skipped task and ping after
`import_role: trainyard_defaults` (every role's defaults in the variables, as in site.yml). Controller CPU of each
run from a cpuacct cgroup (tests/bench/scale.py CpuGroup: ansible-playbook, its workers, SSH); per task and host =
(run - noop run) / (tasks x nodes); rounds alternate the order.

profile: one converged site.yml on the user's path (userpath.KINDS["user"]: the long job), every forked worker under
cProfile in CPU time (tests/bench/callbacks/worker_profile.py). Per task: workers, CPU ms per worker, template renders per
worker (Jinja renders through Ansible's templar: one per templated argument or variable read, nested variables
rendered again at every read), ms per worker in Ansible's per-render context set-up (which wraps every variable in
scope, about 500 at a site.yml task) and in the task's argument templating. cProfile adds its own cost to every
Python call, and far more to many small calls (templating) than to system calls (a fork, an SSH round trip): read
the counts, not the shares or the milliseconds (cost says what the workers really cost).

cost: one converged site.yml on the user's path with no profiler: the controller's CPU from a cpuacct cgroup,
ansible-playbook's own CPU, and each forked worker's own CPU from its fork on and the CPU of the ssh clients it waited
for, with the modules it ran (tests/bench/callbacks/task_cost.py). Per node: the nodes after the first (the head runs
the run-once tasks), and per task the mean over those nodes. --rounds runs repeat it (medians).

    .venv/bin/python docs/benchmarks/task-floor/measure.py cost --cluster tf --rounds 3 --out docs/benchmarks/task-floor/cost.json
"""

from __future__ import annotations

import argparse
import collections
import glob
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests/bench")]

import scale  # noqa: E402
import userpath  # noqa: E402
from helpers import BIN, ansible_env  # noqa: E402

KINDS = {
    "noop": ("", "      ansible.builtin.meta: noop\n"),
    "skip": ("", "      ansible.builtin.ping:\n      when: false\n"),
    "assert": ("", "      ansible.builtin.assert: {that: [true], quiet: true}\n"),
    "ping": ("", "      ansible.builtin.ping:\n"),
    "skip+defaults": ("defaults", "      ansible.builtin.ping:\n      when: false\n"),
    "ping+defaults": ("defaults", "      ansible.builtin.ping:\n"),
}
DEFAULTS = "    - name: Every role's defaults\n      ansible.builtin.import_role: {name: trainyard_defaults}\n"


def playbook(tmp: Path, kind: str, tasks: int) -> Path:
    pre, body = KINDS[kind]
    text = "- hosts: trainers\n  gather_facts: false\n  tasks:\n" + (DEFAULTS if pre else "")
    text += "".join(f"    - name: t{i}\n{body}" for i in range(tasks))
    path = tmp / f"{kind.replace('+', '_')}.yml"
    path.write_text(text)
    return path


def run(inv: Path, book: Path, group: scale.CpuGroup, env_extra: dict | None = None) -> float:
    env = ansible_env({"ANSIBLE_ROLES_PATH": str(REPO / "roles"), **(env_extra or {})})
    before = group.usage_s()
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(book)], cwd=REPO, env=env,
                       preexec_fn=group.enter, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{book.name} failed (rc {p.returncode}):\n{p.stdout[-3000:]}")
    return group.usage_s() - before


def floor(a, inv: Path, nodes: list[str]) -> dict:
    group = scale.CpuGroup(f"tf-{os.getpid()}")
    cpu: dict = collections.defaultdict(list)
    try:
        with tempfile.TemporaryDirectory(prefix="tf-") as tmp:
            books = {k: playbook(Path(tmp), k, a.tasks) for k in KINDS}
            for rnd in range(a.rounds):
                for k in (list(KINDS) if rnd % 2 == 0 else list(reversed(KINDS))):
                    cpu[k].append(round(run(inv, books[k], group), 3))
    finally:
        group.close()
    med = {k: statistics.median(v) for k, v in cpu.items()}
    per = {k: round(1000 * (med[k] - med["noop"]) / (a.tasks * len(nodes)), 1) for k in KINDS if k != "noop"}
    return {"nodes": len(nodes), "tasks": a.tasks, "rounds": a.rounds, "cpu_s": cpu, "median_s": med,
            "ms_per_task_and_host": per}


def profile(a, inv: Path, nodes: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix="tf-prof-"))
    env = ansible_env({"ANSIBLE_CALLBACK_PLUGINS": f"{REPO / 'callback_plugins'}:{REPO / 'tests/bench/callbacks'}",
                       "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks,worker_profile",
                       "TRAINYARD_BENCH_WORKER_PROFILE": str(out)})
    argv = [str(BIN / "ansible-playbook"), "-i", str(inv), "site.yml", *userpath.KINDS["user"][1]]
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    recap = [ln for ln in p.stdout.splitlines() if " : ok=" in ln]
    if p.returncode:
        sys.exit(f"site.yml failed (rc {p.returncode}):\n{p.stdout[-3000:]}")
    per: dict = collections.defaultdict(lambda: {"workers": 0, "cpu_ms": 0.0, "renders": 0, "context_ms": 0.0,
                                                 "args_ms": 0.0})
    for f in glob.glob(str(out / "*.prof")):
        task = Path(f[:-5] + ".task")
        st = pstats.Stats(f, stream=io.StringIO())
        row = per[task.read_text() if task.exists() else "?"]
        row["workers"] += 1
        row["cpu_ms"] += 1000 * st.total_tt
        for (fn, _, name), (_, ncalls, _, cum, _) in st.stats.items():
            if fn.endswith("_jinja_bits.py") and name == "__call__":
                row["renders"] += ncalls
            elif fn.endswith("_jinja_bits.py") and name == "_new_context":
                row["context_ms"] += 1000 * cum
            elif fn.endswith("playbook/task.py") and name == "_post_validate_args":
                row["args_ms"] += 1000 * cum
    rows = [{"task": t, "workers": r["workers"], "cpu_ms_per_worker": round(r["cpu_ms"] / r["workers"], 1),
             "renders_per_worker": round(r["renders"] / r["workers"], 1),
             "context_ms_per_worker": round(r["context_ms"] / r["workers"], 1),
             "args_ms_per_worker": round(r["args_ms"] / r["workers"], 1)} for t, r in per.items()]
    rows.sort(key=lambda r: -r["cpu_ms_per_worker"] * r["workers"])
    node_rows = [r for r in rows if r["workers"] == len(nodes)]  # a task every node runs (not once per run)
    total = sum(r["cpu_ms_per_worker"] * r["workers"] for r in rows)
    return {"nodes": len(nodes), "recap": recap, "workers": sum(r["workers"] for r in rows),
            "profiled_cpu_s": round(total / 1000, 2),
            "per_node_tasks": {"tasks": len(node_rows),
                               "renders": round(sum(r["renders_per_worker"] for r in node_rows)),
                               "cpu_ms": round(sum(r["cpu_ms_per_worker"] for r in node_rows)),
                               "context_ms": round(sum(r["context_ms_per_worker"] for r in node_rows)),
                               "args_ms": round(sum(r["args_ms_per_worker"] for r in node_rows))},
            "tasks": rows}


def cost_run(inv: Path, nodes: list[str], group: scale.CpuGroup) -> dict:
    out = Path(tempfile.mkdtemp(prefix="tf-cost-"))
    env = ansible_env({"ANSIBLE_CALLBACK_PLUGINS": f"{REPO / 'callback_plugins'}:{REPO / 'tests/bench/callbacks'}",
                       "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks,task_cost",
                       "TRAINYARD_BENCH_TASK_COST": str(out)})
    argv = [str(BIN / "ansible-playbook"), "-i", str(inv), "site.yml", *userpath.KINDS["user"][1]]
    before = group.usage_s()
    p = subprocess.run(argv, cwd=REPO, env=env, preexec_fn=group.enter, capture_output=True, text=True)
    total = group.usage_s() - before
    if p.returncode:
        sys.exit(f"site.yml failed (rc {p.returncode}):\n{p.stdout[-3000:]}")
    main = json.loads((out / "main.json").read_text())["cpu_s"]
    workers = [json.loads(Path(f).read_text()) for f in glob.glob(str(out / "*.json")) if not f.endswith("main.json")]
    mine = [w for w in workers if w["host"] in nodes[1:]]
    tasks: dict = collections.defaultdict(lambda: {"hosts": 0, "cpu_s": 0.0, "children_cpu_s": 0.0, "modules": 0})
    for w in mine:
        row = tasks[w["task"]]
        row["hosts"] += 1
        for k in ("cpu_s", "children_cpu_s", "modules"):
            row[k] += w[k]
    k = max(1, len(nodes) - 1)
    rows = sorted(({"task": t, "ms": round(1000 * r["cpu_s"] / r["hosts"], 1),
                    "ssh_ms": round(1000 * r["children_cpu_s"] / r["hosts"], 1),
                    "modules": round(r["modules"] / r["hosts"], 2)} for t, r in tasks.items()),
                  key=lambda r: -(r["ms"] + r["ssh_ms"]))
    return {"controller_cpu_s": round(total, 3), "main_cpu_s": round(main, 3),
            "workers_cpu_s": round(sum(w["cpu_s"] for w in workers), 3),
            "workers_children_cpu_s": round(sum(w["children_cpu_s"] for w in workers), 3),
            "workers": len(workers),
            "per_node": {"host_tasks": round(len(mine) / k, 1),
                         "modules": round(sum(w["modules"] for w in mine) / k, 1),
                         "workers_cpu_ms": round(1000 * sum(w["cpu_s"] for w in mine) / k),
                         "ssh_cpu_ms": round(1000 * sum(w["children_cpu_s"] for w in mine) / k)},
            "tasks": rows}


def cost(a, inv: Path, nodes: list[str]) -> dict:
    group = scale.CpuGroup(f"tf-cost-{os.getpid()}")
    try:
        runs = [cost_run(inv, nodes, group) for _ in range(a.rounds)]
    finally:
        group.close()
    keys = ("controller_cpu_s", "main_cpu_s", "workers_cpu_s", "workers_children_cpu_s")
    med = {k: statistics.median(r[k] for r in runs) for k in keys}
    med["rest_cpu_s"] = round(med["controller_cpu_s"] - med["main_cpu_s"] - med["workers_cpu_s"]
                              - med["workers_children_cpu_s"], 3)
    per_node = {k: statistics.median(r["per_node"][k] for r in runs) for k in runs[0]["per_node"]}
    return {"nodes": len(nodes), "rounds": a.rounds, "median": med, "per_node": per_node,
            "runs": [{k: r[k] for k in (*keys, "workers")} for r in runs], "tasks": runs[-1]["tasks"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["floor", "profile", "cost"])
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    meta = json.loads((REPO / ".sim" / a.cluster / "cluster.json").read_text())
    inv, nodes = REPO / meta["inventory"], meta["nodes"]
    res = {"floor": floor, "profile": profile, "cost": cost}[a.what](a, inv, nodes)
    res["command"] = " ".join([".venv/bin/python", str(Path(__file__).relative_to(REPO)), *sys.argv[1:]])
    res["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                   text=True).stdout.strip()
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    if a.what == "floor":
        print(json.dumps(res["ms_per_task_and_host"]))
    elif a.what == "cost":
        print(json.dumps(res["median"]), json.dumps(res["per_node"]))
        for r in res["tasks"]:
            print(f"{r['ms']:6.1f} ms {r['ssh_ms']:5.1f} ssh {r['modules']:4.1f} modules  {r['task'][:90]}")
    else:
        print(json.dumps(res["per_node_tasks"]))
        for r in res["tasks"][:25]:
            print(f"{r['workers']:3d} {r['cpu_ms_per_worker']:7.1f} ms {r['renders_per_worker']:6.0f} renders "
                  f"{r['context_ms_per_worker']:6.1f} ctx {r['args_ms_per_worker']:6.1f} args  {r['task'][:80]}")


if __name__ == "__main__":
    main()
