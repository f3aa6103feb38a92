"""A local "cluster" for the render roles: N inventory hosts on the controller (connection local), each with its own
cluster_state_dir, carrying the cluster_model fact the validate play would set. Runs the real roles with the real
ansible-playbook (tests/integration/playbooks/render.yml) and reads back files, records and facts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import BIN, REPO

PLAYBOOK = REPO / "tests/integration/playbooks/render.yml"


class LocalCluster:
    def __init__(self, root: Path, nodes: int = 3, nproc: int = 8, hostvars: dict | None = None, **groupvars):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.hosts = [f"node{i + 1}" for i in range(nodes)]
        hosts = {}
        for rank, h in enumerate(self.hosts):
            hosts[h] = {
                "cluster_state_dir": str(root / h / "state"),
                "cluster_model": {"node_rank": rank, "nnodes": nodes, "nproc_per_node": nproc,
                                  "world_size": nodes * nproc, "head": self.hosts[0], "master_addr": "172.29.5.11",
                                  "master_port": 39500, "hosts_by_rank": self.hosts,
                                  "data_address": f"172.29.5.{11 + rank}"},
                **((hostvars or {}).get(h, {})),
            }
        allvars = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                   "cluster_job_name": "train", "cluster_data_iface": "eth1", "cluster_code_dir": str(root / "code"),
                   "cluster_output_root": str(root / "outputs"), "cluster_shared_root": str(root / "shared"),
                   "deepspeed_config_validate_cache": str(root / "dscache")}
        allvars.update(groupvars)
        self.inventory = root / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {"children": {"trainers": {"hosts": hosts}},
                                                          "vars": allvars}}))

    def run(self, *args: str, extra: dict | None = None, roles=None, entry: str = "main", check: bool = False):
        report = self.root / "report.json"
        if report.exists():
            report.unlink()
        evars = {"render_report": str(report), "render_entry": entry}
        if roles:
            evars["render_roles"] = list(roles)
        evars.update(extra or {})
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_CACHE_PLUGIN_CONNECTION=str(self.root / "facts"),
                   PATH=f"{BIN}:{os.environ.get('PATH', '')}")
        argv = [str(BIN / "ansible-playbook"), "-i", str(self.inventory), str(PLAYBOOK),
                "-e", json.dumps(evars), *(["--check"] if check else []), *args]
        proc = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=600)
        proc.report = json.loads(report.read_text()) if report.exists() else {}
        return proc

    def path(self, host: str, name: str) -> Path:
        return self.root / host / "state" / "train" / "job-ro" / name  # the job's read-only directory

    def env(self, host: str) -> dict[str, str]:
        out = {}
        for line in self.path(host, "nccl.env").read_text().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.partition("=")
                out[k] = v
        return out

    def ds(self, host: str) -> dict:
        return json.loads(self.path(host, "ds_config.json").read_text())

    @staticmethod
    def records(proc, check: str) -> dict[str, dict]:
        """{host: record} of one check from the report."""
        out = {}
        for host, data in proc.report.items():
            for r in data.get("preflight_results") or []:
                if r["check"] == check:
                    out[host] = r
        return out


def recap_changed(output: str) -> dict[str, int]:
    import re
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", output, re.M)}
