#!/usr/bin/env python3
"""Ansible's linear strategy against the opt-in mitogen_linear (strategy_plugins/), side by side (prints figures;
asserts nothing).

One default simulated cluster of 3 nodes (every role on) runs site.yml with a long job; then, --repeats times, for
each strategy (the order alternates run by run, so a drift in the machine's load falls on both alike):
  converged  `ansible-playbook site.yml` on the converged cluster (changed 0): wall and controller CPU
             (ansible-playbook and every process it started, SSH clients included: RUSAGE_CHILDREN)
  reset      one rank killed with SIGKILL, 2 s, `ansible-playbook reset.yml -e reset_confirm=true`: wall and CPU
then the job is launched again with the default strategy. Every run's changed counts and rc are kept.

    .venv/bin/python tests/bench/mitogen_strategy.py [--repeats 3] [--name bm] [--write]
    .venv/bin/python tests/bench/run.py --only mitogen [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import SimCluster, parse_recap, sim_down, sim_up  # noqa: E402
from reset import JOB, crash, launch, load, token_procs  # noqa: E402

RAW = REPO / "docs/benchmarks-mitogen.json"
TITLE = "## Mitogen (opt-in strategy)"
STRATEGIES = ("linear", "mitogen_linear")


def log(msg: str) -> None:
    print(f"[bench_mitogen] {msg}", file=sys.stderr, flush=True)


def timed(c: SimCluster, strategy: str, playbook: str, *args: str) -> dict:
    """Wall and controller CPU of one ansible-playbook run under the strategy."""
    before, t0, load_1m = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic(), load()
    r = c.playbook(playbook, *args, env={"ANSIBLE_STRATEGY": strategy})
    wall, after = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    recap = parse_recap(r.stdout)
    if r.returncode != 0:
        log(r.stdout[-3000:])
    return {"wall_s": round(wall, 2), "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            "rc": r.returncode, "load_1m": round(load_1m, 2), "changed": {h: v["changed"] for h, v in recap.items()}}


def bench_mitogen(repeats: int, name: str) -> dict:
    log(f"bring-up {name}")
    c = sim_up(name, nodes=3)
    runs = []
    try:
        launch(c)
        for i in range(repeats):
            for strategy in (STRATEGIES if i % 2 == 0 else STRATEGIES[::-1]):
                run = {"repeat": i + 1, "strategy": strategy, "converged": timed(c, strategy, "site.yml", "-e", JOB)}
                crash(c)
                time.sleep(2)
                run["reset"] = timed(c, strategy, "reset.yml", "-e", "reset_confirm=true")
                run["reset"]["job_processes_left"] = {n: len(token_procs(c, n)) for n in c.nodes}
                runs.append(run)
                log(f"run {i + 1} {strategy}: converged {run['converged']['wall_s']} s ({run['converged']['cpu_s']} "
                    f"CPU-s), reset {run['reset']['wall_s']} s ({run['reset']['cpu_s']} CPU-s), load "
                    f"{run['converged']['load_1m']}")
                launch(c)
    finally:
        sim_down(name)
    return summarise(runs)


def summarise(runs: list[dict]) -> dict:
    out = {"nodes": 3, "runs": runs, "strategies": {}}
    for s in STRATEGIES:
        mine = [r for r in runs if r["strategy"] == s]
        out["strategies"][s] = {
            f"{kind}_{k}": round(statistics.median(r[kind][k] for r in mine), 2) if mine else None
            for kind in ("converged", "reset") for k in ("wall_s", "cpu_s")}
        out["strategies"][s]["all_ok"] = all(
            r["converged"]["rc"] == 0 and not any(r["converged"]["changed"].values()) and r["reset"]["rc"] == 0
            and not any(r["reset"]["job_processes_left"].values()) for r in mine)
        out["strategies"][s]["repeats"] = len(mine)
    lin, mit = out["strategies"]["linear"], out["strategies"]["mitogen_linear"]
    out["ratio"] = {k: round(lin[k] / mit[k], 2) for k in lin if k.endswith("_s") and lin[k] and mit[k]}
    return out


def section(results: dict) -> str:
    from scale import table  # tests/bench/scale.py: the tables of every section
    rows = [dict(strategy=s, **v) for s, v in results["strategies"].items()]
    rows.append(dict(strategy="linear / mitogen_linear", **results["ratio"]))
    return (f"{TITLE}\n\n3 default simulated nodes (every role on), side by side in one run, the order alternating run "
            "by run (tests/bench/mitogen_strategy.py): converged `site.yml` and `reset.yml` after one rank killed with SIGKILL. "
            "Controller CPU is ansible-playbook and every process it started. Raw output: "
            "`docs/benchmarks-mitogen.json`.\n\n"
            f"Command: `{results.get('command', '')}`\n\n" + table(rows, [
                ("strategy", "strategy", ""), ("runs", "repeats", "d"),
                ("converged s", "converged_wall_s", ".2f"), ("converged CPU-s", "converged_cpu_s", ".2f"),
                ("reset s", "reset_wall_s", ".2f"), ("reset CPU-s", "reset_cpu_s", ".2f"), ("all ok", "all_ok", "")]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default=os.environ.get("TY_SIM_NAME", "bm"))
    ap.add_argument("--write", action="store_true", help=f"write the result to {RAW.relative_to(REPO)}")
    args = ap.parse_args()
    results = bench_mitogen(args.repeats, args.name)
    results["command"] = f".venv/bin/python tests/bench/mitogen_strategy.py --repeats {args.repeats}"
    if args.write:
        RAW.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}))
    print(section(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
