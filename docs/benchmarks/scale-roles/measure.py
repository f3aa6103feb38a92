#!/usr/bin/env python3
"""Cost per node of one site.yml run on a simulated cluster: tasks and module calls per host, controller and
node CPU (cgroup accounting of the node containers; the controller's from the rusage of ansible-playbook and
every process it waited for).

    .venv/bin/python docs/benchmarks/scale-roles/measure.py --name sc2 --label after [--vvv] [-- extra args]

Writes <label>-<name>.log (the playbook output) and <label>-<name>.json beside this file and prints the JSON.
Node CPU is the nodes' cgroups' CPU during the run less their idle rate (the training job keeps running)
measured over 10 s just before it. With --vvv the run counts module calls per host (one `SSH: EXEC` per module
call with pipelining); its CPU figures are then not comparable (-vvv costs controller CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
LONG_JOB = json.dumps({"train_args_options": {"--steps": 100000, "--save-every": 50, "--sleep": 0.2,
                                              "--output-root": "{{ train_args_output_dir }}"}})
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.M)


def node_cgroups(name: str) -> dict[str, Path]:
    meta = json.loads((REPO / ".sim" / name / "cluster.json").read_text())
    out = {}
    for node in meta["nodes"]:
        cid = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", node], capture_output=True, text=True,
                             check=True).stdout.strip()
        for base in ("/sys/fs/cgroup/cpuacct/docker", "/sys/fs/cgroup/cpu,cpuacct/docker"):
            p = Path(base) / cid / "cpuacct.usage"
            if p.exists():
                out[node] = p
                break
    return out


def cpu(cg: dict[str, Path]) -> float:
    return sum(int(p.read_text()) for p in cg.values()) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--playbook", default="site.yml")
    ap.add_argument("--vvv", action="store_true")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    meta = json.loads((REPO / ".sim" / a.name / "cluster.json").read_text())
    cg = node_cgroups(a.name)
    idle0, t0 = cpu(cg), time.monotonic()
    time.sleep(10)
    idle_rate = (cpu(cg) - idle0) / (time.monotonic() - t0)
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", meta["inventory"], a.playbook, "-e", LONG_JOB, *a.extra]
    if a.vvv:
        argv.append("-vvv")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    log = HERE / f"{a.label}-{a.name}.log"
    c0, w0 = cpu(cg), time.monotonic()
    with log.open("w") as fh:
        p = subprocess.Popen(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - w0
    nodes_cpu = cpu(cg) - c0 - idle_rate * wall
    out = log.read_text()
    recap = {m.group(1): dict(zip(("ok", "changed", "unreachable", "failed", "skipped"), map(int, m.groups()[1:])))
             for m in RECAP.finditer(out)}
    hosts = [h for h in recap if h in meta["nodes"]]
    n = len(hosts) or 1
    res = {
        "command": " ".join(argv[:1] + [os.path.relpath(x, REPO) if x.startswith("/") else x for x in argv[1:]]),
        "rc": os.waitstatus_to_exitcode(status),
        "nodes": len(hosts),
        "wall_s": round(wall, 1),
        "controller_cpu_s": round(ru.ru_utime + ru.ru_stime, 1),
        "controller_cpu_per_node_s": round((ru.ru_utime + ru.ru_stime) / n, 2),
        "nodes_cpu_s": round(nodes_cpu, 1),
        "nodes_cpu_per_node_s": round(nodes_cpu / n, 2),
        "nodes_idle_cpu_per_s": round(idle_rate, 3),
        "tasks_per_host": {h: recap[h]["ok"] + recap[h]["changed"] + recap[h]["skipped"] + recap[h]["failed"]
                           for h in hosts},
        "changed": {h: recap[h]["changed"] for h in hosts},
        "recap": recap,
    }
    if a.vvv:
        addr = {meta["mgmt"][i]: h for i, h in enumerate(meta["nodes"])}
        calls = {h: 0 for h in meta["nodes"]}
        for m in re.finditer(r"^<([0-9.]+)> SSH: EXEC", out, re.M):
            if m.group(1) in addr:
                calls[addr[m.group(1)]] += 1
        res["module_calls_per_host"] = calls
    (HERE / f"{a.label}-{a.name}.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "recap"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
