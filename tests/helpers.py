"""Helpers every test imports (``from helpers import ...``): the repo's paths, loading a module or plugin by its
file path, the one ``wait_until``, one module run by the real ``ansible``, and the simulated cluster's driver
(``SimCluster``, ``sim_up``/``sim_down``, playbook runs and their recaps and reports). The conftests hold fixtures
and setup only; ``tests/unit/conftest.py`` and ``tests/integration/conftest.py`` put this directory on
``sys.path``, and the benchmarks do the same.

* shared Python through the collection loader, as ``ansible_collections.trainyard.core.plugins.module_utils.<name>``
  (modules and controller) and ``...plugins.plugin_utils.<name>`` (controller only), from ``collections/``
  (docs/architecture.md "Shared code");
* modules and plugins by their file path (``load``), as Ansible's plugin loader reads them;
* the toolchain (ansible, ansible-playbook) beside the Python that runs the tests (``BIN``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the toolchain beside the Python that runs the tests
COLLECTIONS = REPO / "collections"
SIM = [sys.executable, str(REPO / "tests/sim/simcluster.py")]
NVIDIA_SMI_DATA = REPO / "tests/data/nvidia-smi"  # captured nvidia-smi output: a real H200 x4 node, and faults


def wait_until(pred, timeout, step=1.0):
    """pred()'s first true value within timeout seconds (polled every step s), else its last answer."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def xml(name):
    """A captured `nvidia-smi -q -x` (or other output) by file name: the faulty variant where there is one."""
    faulty, real = NVIDIA_SMI_DATA / "faulty" / name, NVIDIA_SMI_DATA / "h200x4" / name
    return (faulty if faulty.exists() else real).read_text()


def facts_of(name="nvidia-smi-q.xml", **extra):
    """nvidia_gpu_facts' facts of the captured node (every NVLink up), extra on top."""
    from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi as ns

    f = ns.parse_query_xml(xml(name))
    f.update(gpu_count=len(f["gpus"]), kernel_module_version=None, fabric_applicable=ns.fabric_applicable(f["gpus"]),
             nvswitch={"present": ns.fabric_applicable(f["gpus"]), "local": False, "devices": [], "source": "fabric"},
             fabricmanager_version=f["driver_version"])
    for g in f["gpus"]:
        g["nvlink"] = {"links": 18, "active": 18, "inactive": 0, "gbps": 478.116}
    f.update(extra)
    return f


def by_check(records):
    """{check id: record}."""
    return {r["check"]: r for r in records}


def load(relpath: str, name: str | None = None):
    """Import a file of the repo as a module (modules and plugins: their directories are not packages)."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def adhoc(module: str, args: dict, *flags: str) -> dict:
    """One module of the repo run by the real `ansible` on this machine (local connection); its result."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    p = subprocess.run([str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
                        "-e", f"ansible_python_interpreter={sys.executable}", "-m", module, "-a", json.dumps(args),
                        *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    # The JSON document sits between the project's profile callback's timing lines.
    out, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index("{"):])
    return out["plays"][0]["tasks"][0]["hosts"]["localhost"]


class SymlinkSwapper:
    """The job's race against host code, as a context manager: in a thread, the directory at path is moved aside
    and a symlink to target put in its place, then both undone, in a tight loop (the window between a host's
    mkdir and its chmod, or between a check and an open)."""

    def __init__(self, path, target):
        import threading

        self.path, self.target = Path(path), Path(target)
        self.aside = self.path.with_name(self.path.name + ".aside")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            try:
                os.rename(self.path, self.aside)
                os.symlink(self.target, self.path)
            except OSError:
                pass
            for undo in (lambda: os.unlink(self.path), lambda: os.rmdir(self.aside)):
                try:
                    undo()
                except OSError:
                    pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)


_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
                    r"\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)", re.M)


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


# ---------------------------------------------------------------------------------------------- the render roles
# A local "cluster" for the render roles: N inventory hosts on the controller (connection local), each with its own
# cluster_state_dir, carrying the cluster_model fact the validate play would set. Runs the real roles with the real
# ansible-playbook (tests/integration/playbooks/render.yml) and reads back files, records and facts.
RENDER_PLAYBOOK = REPO / "tests/integration/playbooks/render.yml"


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
        argv = [str(BIN / "ansible-playbook"), "-i", str(self.inventory), str(RENDER_PLAYBOOK),
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
