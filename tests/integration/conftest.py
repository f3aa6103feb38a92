"""Fixtures for integration tests on the simulated cluster (tests/sim/simcluster.py).

`cluster` is one 3-node cluster shared by the whole session (name from TY_SIM_NAME, default "it"); tests
that break something on it must put it back (use `try/finally`). `make_cluster(name, nodes, mtu)` brings
up a private cluster for a test that needs its own, and removes it afterwards.
Set TY_SIM_KEEP=1 to leave clusters running after the session (for debugging).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the toolchain beside the Python that runs the tests
SIM = [sys.executable, str(REPO / "tests/sim/simcluster.py")]

_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
                    r"\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)", re.M)


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines → {host: {ok, changed, unreachable, failed, skipped, rescued, ignored}}."""
    keys = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")
    return {m.group(1): dict(zip(keys, map(int, m.groups()[1:]))) for m in _RECAP.finditer(output)}


def ansible_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env.setdefault("ANSIBLE_FORCE_COLOR", "0")
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    env.update(extra or {})
    return env


def run_playbook(inventory: Path | str, playbook: str, *args: str, env: dict[str, str] | None = None,
                 timeout: int = 900) -> subprocess.CompletedProcess:
    """ansible-playbook from the repo root; stdout and stderr together in .stdout."""
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), playbook, *args]
    return subprocess.run(argv, cwd=REPO, env=ansible_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


class SimCluster:
    def __init__(self, name: str):
        self.name = name
        meta = json.loads((REPO / ".sim" / name / "cluster.json").read_text())
        self.meta = meta
        self.nodes: list[str] = meta["nodes"]
        self.inventory = Path(meta["inventory"])
        self.mgmt: dict[str, str] = dict(zip(self.nodes, meta["mgmt"]))
        self.data: dict[str, str] = dict(zip(self.nodes, meta["data"]))
        self.gateway: str = meta["gateway"]
        self.key = Path(meta["key"])

    @property
    def head(self) -> str:
        return self.nodes[0]

    def exec(self, node: str, argv: list[str], check: bool = True, input: str | None = None,
             timeout: int = 120, detach: bool = False) -> subprocess.CompletedProcess:
        cmd = ["docker", "exec", *(["-d"] if detach else []), *(["-i"] if input is not None else []), node, *argv]
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{node}: {' '.join(argv)} failed ({r.returncode}): {r.stdout}{r.stderr}")
        return r

    def ssh(self, node: str, argv: list[str], check: bool = True, timeout: int = 60) -> subprocess.CompletedProcess:
        cmd = ["ssh", "-i", str(self.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", f"root@{self.mgmt[node]}", "--", *argv]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"ssh {node}: {' '.join(argv)} failed ({r.returncode}): {r.stdout}{r.stderr}")
        return r

    def playbook(self, playbook: str, *args: str, env: dict[str, str] | None = None,
                 timeout: int = 900) -> subprocess.CompletedProcess:
        return run_playbook(self.inventory, playbook, *args, env=env, timeout=timeout)

    def set_mtu(self, node: str, mtu: int, iface: str = "eth1") -> None:
        self.exec(node, ["ip", "link", "set", "dev", iface, "mtu", str(mtu)])

    def mtu(self, node: str, iface: str = "eth1") -> int:
        return int(self.exec(node, ["cat", f"/sys/class/net/{iface}/mtu"]).stdout)


def sim_up(name: str, nodes: int = 3, mtu: int = 9000) -> SimCluster:
    subprocess.run([*SIM, "up", "--name", name, "--nodes", str(nodes), "--data-mtu", str(mtu)], check=True,
                   cwd=REPO)
    return SimCluster(name)


def sim_down(name: str) -> None:
    if os.environ.get("TY_SIM_KEEP") != "1":
        subprocess.run([*SIM, "down", "--name", name], check=False, cwd=REPO)


@pytest.fixture(scope="session")
def cluster() -> SimCluster:
    name = os.environ.get("TY_SIM_NAME", "it")
    if os.environ.get("TY_SIM_REUSE") == "1" and (REPO / ".sim" / name / "cluster.json").exists():
        yield SimCluster(name)
        return
    c = sim_up(name)
    try:
        yield c
    finally:
        sim_down(name)


@pytest.fixture
def make_cluster():
    made: list[str] = []

    def _make(name: str, nodes: int = 3, mtu: int = 9000) -> SimCluster:
        made.append(name)
        return sim_up(name, nodes, mtu)

    yield _make
    for name in made:
        sim_down(name)
