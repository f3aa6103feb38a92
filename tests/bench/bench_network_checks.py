#!/usr/bin/env python3
"""Controller CPU of the network role's per-node check task (network_checks) at N local hosts (prints JSON).

The task, and the network_plan task before it, are read from the tree's own roles/network/tasks/main.yml, so the
same bench measures any checkout (--tree): before and after a change to how the task gets its inputs. Every host is
a local connection with made-up net_facts results (an interface, a data address, MTU 9000: the plan has its peers)
and the pings and the rendezvous check switched off (network_path_check, network_port_check false): the task then
contacts nothing and what it costs is the controller's own work (templating its arguments, the records). CPU per
task from a cpuacct cgroup the run is in (tests/bench/callbacks/cpu_per_task.py), median of --repeats runs.

    .venv/bin/python tests/bench/bench_network_checks.py [--hosts 64] [--repeats 3] [--tree PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))
from scale import CpuGroup  # noqa: E402

ACTIONS = ("network_plan", "network_checks")


def role_tasks(tree: Path) -> list[dict]:
    """The network_plan and network_checks tasks of the tree's network role, as written there."""
    main = yaml.safe_load((tree / "roles/network/tasks/main.yml").read_text())
    found = [t for block in main for t in block.get("block", [block]) if any(a in t for a in ACTIONS)]
    assert [next(a for a in ACTIONS if a in t) for t in found] == list(ACTIONS), found
    return found


def playbook(tree: Path, n: int) -> list[dict]:
    hosts = ["h%02d" % i for i in range(n)]
    role_vars = yaml.safe_load((tree / "roles/network/vars/main.yml").read_text())
    facts = {"selected": {"iface": "eth1", "address": "{{ data_address }}", "mtu": 9000},
             "interfaces": {"eth1": {"nets": ["{{ data_address }}/16"]}}, "route": {"ok": True, "dev": "eth1"},
             "config": {"method": "none"}, "bridges": [], "changed": False}
    model = {"head": hosts[0], "master_addr": "10.77.0.0", "master_port": 39500, "hosts_by_rank": hosts,
             "data_address": "{{ data_address }}"}
    return [{"name": "network_checks at %d hosts" % n, "hosts": "all", "gather_facts": False,
             "vars": dict(role_vars, cluster_model=model, network_path_check=False, network_port_check=False,
                          cluster_data_iface=""),
             "tasks": [{"name": "Every role's defaults", "ansible.builtin.import_role": {"name": "trainyard_defaults"}},
                       {"name": "net_facts results", "ansible.builtin.set_fact": {"__network_facts": facts}},
                       *role_tasks(tree)]}]


def run_once(tree: Path, n: int, tmp: Path, i: int) -> dict:
    (tmp / "pb.yml").write_text(yaml.safe_dump(playbook(tree, n), sort_keys=False))
    inv = {"all": {"hosts": {"h%02d" % k: {"data_address": "10.77.%d.%d" % (k // 250, k % 250 + 1)}
                             for k in range(n)},
                   "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}
    (tmp / "inv.yml").write_text(yaml.safe_dump(inv))
    cpu_file = tmp / f"cpu{i}.json"
    group = CpuGroup(f"bench-netchecks-{os.getpid()}-{i}")
    env = dict(os.environ, ANSIBLE_CONFIG=str(tree / "ansible.cfg"),
               ANSIBLE_CALLBACK_PLUGINS=f"{tree / 'callback_plugins'}:{REPO / 'tests/bench/callbacks'}",
               ANSIBLE_CALLBACKS_ENABLED="cpu_per_task", TRAINYARD_BENCH_CGROUP=str(group.path),
               TRAINYARD_BENCH_TASK_CPU=str(cpu_file))
    try:
        r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp / "inv.yml"),
                            str(tmp / "pb.yml")], cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, preexec_fn=group.enter, timeout=1800)
    finally:
        group.close()
    if r.returncode != 0:
        raise SystemExit(r.stdout[-4000:])
    return {task: cpu for task, cpu, _ in json.loads(cpu_file.read_text())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tree", type=Path, default=REPO)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            rows.append(run_once(a.tree.resolve(), a.hosts, Path(tmp), i))
    names = [t["name"] for t in role_tasks(a.tree)]
    out = {"tree": str(a.tree), "hosts": a.hosts, "repeats": a.repeats,
           "controller_cpu_s": {name: {"median": statistics.median(r[name] for r in rows),
                                       "runs": [r[name] for r in rows]} for name in names}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
