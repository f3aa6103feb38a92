#!/usr/bin/env python3
"""reset.yml after a crash on a 3-node simulated cluster (prints figures; asserts nothing).

A default simulated cluster (every role on) runs site.yml with a long job; then, --repeats times: the job is
(re)launched (`site.yml`, converged but for the launch), one rank of the last node is killed with SIGKILL (a process carrying the
job's launch token whose parent carries it too: a child of the torchrun agent), and
`ansible-playbook reset.yml -e reset_confirm=true` is timed from its start to its end. Each run's ten slowest tasks
(the profile_tasks callback of ansible.cfg) are kept in the raw output.

    .venv/bin/python tests/bench/reset.py [--repeats 5] [--name br] [--reuse] [--write]
    .venv/bin/python tests/bench/run.py --only reset [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from helpers import SimCluster, parse_recap, sim_down, sim_up  # noqa: E402

RAW = REPO / "docs/benchmarks-reset.json"
TITLE = "## reset.yml after a crash"
STATE = "/var/lib/trainyard/train/launch.json"
# A job of its own that trains for hours: every relaunch sees the same command.
JOB = json.dumps({"train_args_options": {"--steps": 1000000, "--save-every": 1000, "--sleep": 0.2,
                                         "--output-root": "{{ train_args_output_dir }}"},
                  "launch_resume_from": ""})
# Ranks and their parents: "pid ppid" of every process that carries the launch token.
TOKEN_PROCS = ("import os, sys\ntok = ('TRAINYARD_LAUNCH_ID=' + sys.argv[1]).encode()\n"
               "for p in os.listdir('/proc'):\n if p.isdigit():\n  try:\n"
               "   e = open('/proc/%s/environ' % p, 'rb').read().split(b'\\0')\n"
               "   st = open('/proc/%s/stat' % p).read()\n  except OSError:\n   continue\n"
               "  if tok in e:\n   print(p, st[st.rfind(')') + 2:].split()[1])\n")
PROFILE_ALL = {"PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all"}  # every task in the recap, not ansible.cfg's first 15
PROFILE_LINE = re.compile(r"^(.+?) -+ (\d+\.\d+)s$")


def log(msg: str) -> None:
    print(f"[bench_reset] {msg}", file=sys.stderr, flush=True)


def token_procs(c: SimCluster, node: str) -> dict[int, int]:
    """{pid: ppid} of the processes of the node's current launch (empty when no launch state)."""
    r = c.exec(node, ["cat", STATE], check=False)
    if r.returncode != 0:
        return {}
    token = json.loads(r.stdout)["token"]
    out = c.exec(node, ["python3", "-c", TOKEN_PROCS, token]).stdout.split()
    return {int(p): int(pp) for p, pp in zip(out[::2], out[1::2])}


def launch(c: SimCluster, *args: str) -> None:
    r = c.playbook("site.yml", "-e", JOB, *args)
    if r.returncode != 0:
        raise RuntimeError(f"site.yml {' '.join(args)} failed:\n{r.stdout[-3000:]}")


def crash(c: SimCluster, timeout: float = 120) -> int:
    """SIGKILL one rank of the last node once every node runs its ranks; the PID killed."""
    node = c.nodes[-1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = {n: token_procs(c, n) for n in c.nodes}
        ranks = {n: [p for p, pp in ps.items() if pp in ps] for n, ps in procs.items()}
        if all(ranks.values()):
            pid = max(ranks[node])
            c.exec(node, ["kill", "-9", str(pid)])
            return pid
        time.sleep(1)
    raise RuntimeError("the job's ranks did not start on every node")


def profile(output: str) -> list[list]:
    """[name, seconds] of every task of a run, from the profile_tasks recap (`name --- 1.23s`)."""
    tasks = []
    for line in output.split("TASKS RECAP", 1)[-1].splitlines():
        m = PROFILE_LINE.match(line.strip())
        if m:
            tasks.append([m.group(1).strip(), float(m.group(2))])
    return tasks


def slowest(tasks: list[list], k: int = 10) -> list[list]:
    return sorted(tasks, key=lambda t: -t[1])[:k]


def load() -> float:
    return os.getloadavg()[0]


def summarise(runs: list[dict]) -> dict:
    walls = [x["wall_s"] for x in runs]
    return {"nodes": 3, "repeats": len(runs), "runs": runs,
            "median_s": round(statistics.median(walls), 2) if walls else None,
            "min_s": min(walls, default=None), "max_s": max(walls, default=None),
            "stdev_s": round(statistics.stdev(walls), 2) if len(walls) > 1 else 0.0,
            "all_ok": all(x["rc"] == 0 and not any(x["job_processes_left"].values()) for x in runs)}


def bench_reset(repeats: int, name: str, reuse: bool = False, settle_s: float = 2.0, converged: bool = False,
                after_run: Callable[[dict], None] = lambda res: None) -> dict:
    if reuse and (REPO / ".sim" / name / "cluster.json").exists():
        c = SimCluster(name)
    else:
        log(f"bring-up {name}")
        c = sim_up(name, nodes=3)
    runs = []
    try:
        if not converged:
            log("site.yml")
            launch(c)
        for i in range(repeats):
            if i or converged:
                launch(c)
            pid = crash(c)
            time.sleep(settle_s)
            before = load()
            t0 = time.monotonic()
            r = c.playbook("reset.yml", "-e", "reset_confirm=true", env=PROFILE_ALL)
            wall = time.monotonic() - t0
            tasks = profile(r.stdout)
            recap = parse_recap(r.stdout)
            left = {n: len(token_procs(c, n)) for n in c.nodes}
            runs.append({"wall_s": round(wall, 2), "rc": r.returncode, "killed_pid": pid, "load_1m": round(before, 2),
                         "changed": {h: v["changed"] for h, v in recap.items()},
                         "job_processes_left": left, "tasks": len(tasks),
                         "tasks_s": round(sum(t for _, t in tasks), 2), "slowest_tasks": slowest(tasks),
                         "every_task": tasks})
            log(f"run {i + 1}: {wall:.2f} s rc={r.returncode} load {before:.2f} left {left}; slowest "
                + ", ".join(f"{t} {s:.1f}s" for t, s in runs[-1]["slowest_tasks"][:5])
                + f"; {len(tasks)} tasks, {runs[-1]['tasks_s']:.1f} s in tasks")
            if r.returncode != 0:
                log(r.stdout[-3000:])
            after_run(summarise(runs))
    finally:
        if not reuse:
            sim_down(name)
    return summarise(runs)


def section(results: dict) -> str:
    """The docs/benchmarks.md table of one or more measured trees (results: {label: bench_reset()})."""
    from scale import table  # tests/bench/scale.py: the tables of every section
    rows = [dict(tree=label, **{k: v for k, v in r.items() if k != "runs"},
                 load=statistics.median([x["load_1m"] for x in r["runs"]]) if r["runs"] else None)
            for label, r in results.get("trees", {}).items()]
    return (f"{TITLE}\n\n3 default simulated nodes (every role on): site.yml with a long job, then per run a fresh launch, "
            "one rank killed with SIGKILL, 2 s, and `ansible-playbook reset.yml -e reset_confirm=true` timed from start "
            "to end (tests/bench/reset.py). Raw output with each run's slowest tasks: `docs/benchmarks-reset.json`.\n\n"
            f"Command: `{results.get('command', '')}`\n\n" + table(rows, [
                ("tree", "tree", ""), ("runs", "repeats", "d"), ("median s", "median_s", ".2f"), ("min s", "min_s", ".2f"),
                ("max s", "max_s", ".2f"), ("stdev s", "stdev_s", ".2f"), ("all clean", "all_ok", ""),
                ("load 1m", "load", ".1f")]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default=os.environ.get("TY_SIM_NAME", "br"))
    ap.add_argument("--reuse", action="store_true", help="use the running cluster --name and leave it up")
    ap.add_argument("--converged", action="store_true", help="with --reuse: the cluster ran site.yml already")
    ap.add_argument("--label", default="this tree", help="the row's name in the table (e.g. 'main 7f9392b')")
    ap.add_argument("--write", action="store_true", help=f"add the result to {RAW.relative_to(REPO)} under --label")
    ap.add_argument("--append", action="store_true",
                    help="add the runs to those already kept under --label (alternate two trees run by run)")
    args = ap.parse_args()
    results = json.loads(RAW.read_text()) if (args.write and RAW.exists()) else {}
    results["command"] = f".venv/bin/python tests/bench/reset.py --repeats {args.repeats}"

    earlier = results.get("trees", {}).get(args.label, {}).get("runs", []) if args.append else []

    def keep(res: dict) -> None:  # after every run: a run cut short keeps what it measured
        res = summarise(earlier + res["runs"])
        results.setdefault("trees", {})[args.label] = res
        if args.write:
            RAW.write_text(json.dumps(results, indent=1) + "\n")

    res = bench_reset(args.repeats, args.name, args.reuse, converged=args.converged and args.reuse, after_run=keep)
    keep(res)
    res = results["trees"][args.label]
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}))
    print(section(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
