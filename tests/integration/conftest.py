"""Fixtures for integration tests on the simulated cluster (tests/sim/simcluster.py).

`cluster` is one 3-node cluster shared by the whole session (name from TY_SIM_NAME, default "it"); tests
that break something on it must put it back (use `try/finally`). `make_cluster(name, nodes, mtu)` brings
up a private cluster for a test that needs its own, and removes it afterwards.
Set TY_SIM_KEEP=1 to leave clusters running after the session (for debugging).
Under pytest-xdist (`make integration` runs two workers) each worker after the first has clusters of its own: its
number is appended to TY_SIM_NAME ("it1") and to TY_SIM_PREFIX ("w1"), before any test reads them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the toolchain beside the Python that runs the tests
SIM = [sys.executable, str(REPO / "tests/sim/simcluster.py")]

_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
if _WORKER:
    os.environ["TY_SIM_NAME"] = os.environ.get("TY_SIM_NAME", "it") + str(_WORKER)
    os.environ["TY_SIM_PREFIX"] = os.environ.get("TY_SIM_PREFIX", "") + "w%d" % _WORKER

_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
                    r"\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)", re.M)


def wait_until(pred, timeout, step=1.0):
    """pred()'s first true value within timeout seconds (polled every step s), else its last answer."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def run_dir_of(output: str) -> Path:
    """This run's report directory, as the report play prints it (runs/latest may be another run's by now: another
    test, or another pytest-xdist worker)."""
    found = re.findall(r"Report: (\S+)/report\.json", output)
    assert found, output[-3000:]
    return Path(found[-1])


def report_of(output: str) -> dict:
    return json.loads((run_dir_of(output) / "report.json").read_text())


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
    r = subprocess.run(argv, cwd=REPO, env=ansible_env(env), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if r.returncode != 0:
        r.stdout += failed_tasks(r.stdout)
    return r


def failed_tasks(output: str, width: int = 1500) -> str:
    """The failed tasks of a run, each under its task header, repeated at the end of its output.

    A failing test shows the tail of a run's output; the task that failed may be thousands of lines above it.
    """
    lines, task, out = output.splitlines(), "", []
    for line in lines:
        if line.startswith("TASK ["):
            task = line.rstrip("* ")
        elif line.startswith(("fatal: [", "failed: [")) or (line.startswith("ERROR!") and not out):
            out += [task, line[:width]]
    return "\n#### failed tasks of this run (repeated from above)\n" + "\n".join(out) + "\n" if out else ""


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

    def start(self, node: str, timeout: float = 120) -> None:
        """Start a stopped node again and wait for SSH and its own engine, with its interfaces named as at bring-up.

        Docker 20.10 attaches a restarted container's networks in no fixed order, so the data network may come back
        as eth0; the node's names are swapped back (eth0 management, eth1 data) and the default route restored, so
        a test after a restart sees the cluster the sim brought up.
        """
        subprocess.run(["docker", "start", node], check=True, capture_output=True, timeout=timeout)
        addrs = self.exec(node, ["ip", "-o", "-4", "addr", "show"]).stdout
        data_iface = next((ln.split()[1] for ln in addrs.splitlines() if f" {self.data[node]}/" in ln), "eth1")
        if data_iface == "eth0":
            route = self.exec(node, ["ip", "route", "show", "default"]).stdout.split()
            script = ("ip link set eth0 down && ip link set eth1 down && ip link set eth0 name tyswap && "
                      "ip link set eth1 name eth0 && ip link set tyswap name eth1 && ip link set eth0 up && "
                      "ip link set eth1 up")
            if len(route) >= 3 and route[1] == "via":
                script += f" && ip route replace default via {route[2]}"
            self.exec(node, ["sh", "-c", script])
        self._wait(node, lambda: self.ssh(node, ["true"], check=False, timeout=30).returncode == 0, timeout, "SSH")
        if self.meta.get("kind", "node") != "node":
            return
        engine = lambda: self.exec(node, ["docker", "info"], check=False).returncode == 0  # noqa: E731
        if not self._wait(node, engine, 60, None):
            # The node's engine may miss its start under load (containerd timeout): node-init starts it again (its
            # sshd exits at once, the port being taken).
            self.exec(node, ["sh", "-c", "rm -f /var/run/docker.pid; exec /usr/local/sbin/node-init"], detach=True)
            self._wait(node, engine, 180, "its docker engine")

    @staticmethod
    def _wait(node: str, ready, timeout: float, what: str | None) -> bool:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                if what:
                    raise AssertionError(f"{node}: no {what} {timeout:.0f} s after docker start")
                return False
            time.sleep(0.5)
        return True

    def set_mtu(self, node: str, mtu: int, iface: str = "eth1") -> None:
        self.exec(node, ["ip", "link", "set", "dev", iface, "mtu", str(mtu)])

    def mtu(self, node: str, iface: str = "eth1") -> int:
        return int(self.exec(node, ["cat", f"/sys/class/net/{iface}/mtu"]).stdout)


def sim_up(name: str, nodes: int = 3, mtu: int = 9000, slurm: bool = False) -> SimCluster:
    subprocess.run([*SIM, "up", "--name", name, "--nodes", str(nodes), "--data-mtu", str(mtu),
                    *(["--slurm"] if slurm else [])], check=True, cwd=REPO)
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

    def _make(name: str, nodes: int = 3, mtu: int = 9000, slurm: bool = False) -> SimCluster:
        name = os.environ.get("TY_SIM_PREFIX", "") + name  # parallel sessions on one engine keep apart
        made.append(name)
        return sim_up(name, nodes, mtu, slurm)

    yield _make
    for name in made:
        sim_down(name)
