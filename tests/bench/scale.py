"""The scale section of `make bench` (tests/bench/run.py --only scale): converged site.yml on light nodes.

    .venv/bin/python tests/bench/run.py --only scale --sizes 16,32,64 [--config-at 32]

Per cluster size (light simulated nodes, `simcluster.py up --kind light`: sshd and Python only; the inventory
turns the engine and torch roles off through the product's variables, and the launch play is left out with
--skip-tags launch because it needs torch on the node):

* a first site.yml run (converges the nodes), then converged re-runs (changed must be 0), each measured for
  - wall time;
  - controller CPU from cgroup accounting: ansible-playbook runs in a cpuacct cgroup of its own (its workers
    and the SSH multiplexing masters it leaves behind stay in it), and the CPU of its main process alone
    (sampled from /proc/<pid>/stat: the strategy loop, forks and result handling, which do not spread over
    cores);
  - node-side CPU from each node container's cpuacct cgroup (docker's cgroupfs driver);
  - tasks per node (from the recap) and remote executions per node (every `ssh` Ansible runs, counted by a
    wrapper named in ANSIBLE_SSH_EXECUTABLE; pipelined, one per module call);
  - per-task wall time (profile_tasks, every task), with the tasks whose cost grows faster than linearly
    summed apart: the pairwise path-MTU proof (the task that runs path_mtu_check, and that module's own
    seconds from the report) and the cross-node comparisons (every task whose arguments read other hosts'
    hostvars over a host list, found in the role task files, so the list follows the roles as they change).
* optionally (--config-at N) the converged re-run at size N once per ansible.cfg setting put back to Ansible's
  default, and once with Ansible's defaults altogether (tests/bench/ansible-defaults.cfg).

model() fits the measured slopes and projects a converged run to 64, 256 and 1,024 nodes on a 16-core
controller with the nodes in parallel; docs/benchmarks.md says how (the analysis part) and the table shows how
far the model is off at each measured size. Raw results: docs/benchmarks-scale.json.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")
RAW = REPO / "docs/benchmarks-scale.json"
SKIP = ["--skip-tags", "launch"]
HZ = os.sysconf("SC_CLK_TCK")

# ansible.cfg settings put back to Ansible's default, one at a time (environment overrides ansible.cfg).
CONFIG_VARIANTS = {
    "project ansible.cfg": {},
    "forks 5 (default; project 64)": {"ANSIBLE_FORKS": "5"},
    "pipelining off (default; project on)": {"ANSIBLE_PIPELINING": "False", "ANSIBLE_SSH_PIPELINING": "False"},
    "internal_poll_interval 0.001 (default; project 0.01)": {"ANSIBLE_INTERNAL_POLL_INTERVAL": "0.001"},
    "fact_caching jsonfile (project and default: memory)": {"ANSIBLE_CACHE_PLUGIN": "jsonfile"},
    # Ansible's behaviour: every worker loads the filters, tests and its action itself (callback_plugins/warm_workers.py).
    "warm_workers off (Ansible's behaviour; project on)": {"TRAINYARD_WARM_WORKERS": "false"},
}


def log(msg: str) -> None:
    print(f"[bench:scale] {msg}", flush=True)


# --------------------------------------------------------------------------- accounting

class CpuGroup:
    """A cpuacct cgroup the measured ansible-playbook runs in (its children inherit it)."""

    def __init__(self, name: str):
        self.path = CGROUP_ROOT / name
        self.ok = False
        try:
            self.path.mkdir(exist_ok=True)
            self.ok = (self.path / "cgroup.procs").exists()
        except OSError as e:
            log(f"no cpuacct cgroup ({e}): controller CPU falls back to rusage of the children")

    def usage_s(self) -> float | None:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9 if self.ok else None

    def enter(self) -> None:  # preexec_fn: runs in the child before exec
        if self.ok:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def close(self) -> None:
        """Stop what this bench left in the group (SSH multiplexing masters of a cluster now gone), remove it."""
        if not self.ok:
            return
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), 15)
            except OSError:
                pass
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.2)


def container_cpu_s(ids: list[str]) -> float:
    total = 0
    for cid in ids:
        f = CGROUP_ROOT / "docker" / cid / "cpuacct.usage"
        total += int(f.read_text()) if f.exists() else 0
    return total / 1e9


def machine_busy_s() -> float:
    """CPU-seconds the whole machine has been busy (every process, every core), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / HZ


def shard_mains(parent: int) -> list[int]:
    """The main processes of a sharded run's children (docs/sharding.md): ansible-playbook processes with
    TRAINYARD_SHARD in their environment whose parent (the parent run's worker) has none. Their workers have it and
    so has their parent."""
    def env_has(pid):
        try:
            return b"\0TRAINYARD_SHARD=" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return None

    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid = int(stat[1])
        if ppid in (0, 1, parent) or not env_has(d.name) or env_has(ppid) is not False:
            continue
        out.append(int(d.name))
    return out


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of the process itself (all its threads, not its children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / HZ


SSH_WRAPPER = """#!/bin/sh
# Counts the SSH executions of the measured run: one line per call, naming the target (the argument before the
# remote command), what the remote command is (a module's Python, interpreter discovery, anything else) and the
# task (TRAINYARD_BENCH_TASK, set by tests/bench/callbacks/cpu_per_task.py before the task's workers fork), then
# runs the real ssh.
eval "target=\\${$(($# - 1))}"
eval "remote=\\${$#}"
case "$remote" in
  *PLATFORM*) kind=discovery ;;
  *python*) kind=module ;;
  *) kind=other ;;
esac
printf '%s\\t%s\\t%s\\n' "$target" "$kind" "$TRAINYARD_BENCH_TASK" >> "$TRAINYARD_BENCH_SSH_LOG"
exec ssh "$@"
"""


# --------------------------------------------------------------------------- parsing

RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)")
PROFILE = re.compile(r"^(.+?) -+ (\d+\.\d+)s$")


def parse_recap(text: str) -> dict[str, dict[str, int]]:
    out = {}
    for line in text.splitlines():
        m = RECAP.match(line)
        if m:
            out[m.group(1)] = dict(zip(("ok", "changed", "unreachable", "failed", "skipped"),
                                       map(int, m.groups()[1:])))
    return out


def parse_profile(text: str) -> list[tuple[str, float]]:
    """profile_tasks' summary (every task, in execution order): [(\"role : task\", seconds)]."""
    if "TASKS RECAP" not in text:
        return []
    rows = []
    for line in text.split("TASKS RECAP", 1)[1].splitlines():
        m = PROFILE.match(line.strip())
        if m:
            rows.append((m.group(1).strip(), float(m.group(2))))
    return rows


def _walk_tasks(items, role: str):
    for t in items or []:
        if not isinstance(t, dict):
            continue
        for key in ("block", "rescue", "always"):
            if key in t:
                yield from _walk_tasks(t[key], role)
        if "name" in t and "block" not in t:
            yield f"{role} : {t['name']}", t


HOST_LISTS = ("ansible_play_hosts", "_hosts", "groups[", "groups.")


def superlinear_tasks(roles_dir: Path = REPO / "roles") -> dict[str, str]:
    """{'role : task name': class} for the tasks whose cost grows faster than linearly with the node count:
    'path_mtu' (runs path_mtu_check, directly or through network_checks: every node probes its peers) and
    'cross_node' (reads other hosts' hostvars over a host list: n lookups per node)."""
    out = {}
    for f in sorted(roles_dir.glob("*/tasks/*.yml")):
        role = f.parts[-3]
        try:
            doc = yaml.safe_load(f.read_text())
        except yaml.YAMLError:
            continue
        for name, task in _walk_tasks(doc if isinstance(doc, list) else [], role):
            text = json.dumps(task)
            if "path_mtu_check" in task or "network_checks" in task:  # network_checks runs path_mtu_check
                out[name] = "path_mtu"
            elif "hostvars" in text and any(h in text for h in HOST_LISTS):
                out[name] = "cross_node"
    return out


CONTROLLER_PLAYS = ("validate.yml", "exclude.yml", "report.yml")  # playbooks/: plays on localhost, once per run


def _role_file_tasks(role: str, tasks_from: str, roles_dir: Path, seen: set) -> list[str]:
    """'role : task' names of a role's task file and of the files it includes or imports (same role)."""
    f = roles_dir / role / "tasks" / tasks_from
    if f in seen or not f.exists():
        return []
    seen.add(f)
    try:
        doc = yaml.safe_load(f.read_text())
    except yaml.YAMLError:
        return []
    names = []
    for name, task in _walk_tasks(doc if isinstance(doc, list) else [], role):
        names.append(name)
        for key in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks"):
            ref = task.get(key)
            ref = ref.get("file") if isinstance(ref, dict) else ref
            if isinstance(ref, str) and "{{" not in ref:
                names += _role_file_tasks(role, ref, roles_dir, seen)
    return names


def once_tasks(repo: Path = REPO) -> set[str]:
    """The tasks that run once per run on one host, whatever the node count: run_once, and every task of the plays on
    localhost (the validate, exclude and report plays). Their CPU is one worker's at a time: serial on any
    controller, however many cores it has (several of them read every node's hostvars: O(n) once)."""
    out: set[str] = set()
    roles_dir = repo / "roles"
    for f in sorted(roles_dir.glob("*/tasks/*.yml")):
        try:
            doc = yaml.safe_load(f.read_text())
        except yaml.YAMLError:
            continue
        for name, task in _walk_tasks(doc if isinstance(doc, list) else [], f.parts[-3]):
            if task.get("run_once") is True:
                out.add(name)
    for play_file in CONTROLLER_PLAYS:
        try:
            plays = yaml.safe_load((repo / "playbooks" / play_file).read_text()) or []
        except (OSError, yaml.YAMLError):
            continue
        for play in plays:
            # A play of a sharded run's children names localhost through an expression ({{ [] if ... else
            # 'localhost' }}, docs/sharding.md).
            hosts = play.get("hosts") if isinstance(play, dict) else None
            if not isinstance(hosts, str) or not (hosts == "localhost" or hosts.rstrip().endswith("'localhost' }}")):
                continue
            for task in play.get("tasks") or []:
                if not isinstance(task, dict):
                    continue
                out.add(str(task.get("name", "")))
                for key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                    ref = task.get(key)
                    if isinstance(ref, dict) and ref.get("tasks_from"):
                        out.update(_role_file_tasks(ref["name"], ref["tasks_from"], roles_dir, set()))
    out.discard("")
    return out


def once_cpu_s(run: dict, names: set[str] | None = None) -> float | None:
    """The controller CPU of a run's once-per-run tasks (once_tasks()), from its per-task CPU; None without it."""
    per_task = run.get("task_cpu")
    if not per_task:
        return None
    names = once_tasks() if names is None else names
    return round(sum(c[1] for c in per_task if c and c[0] in names), 3)


def path_mtu_module_seconds(report: Path) -> list[float]:
    """The path_mtu_check module's own wall time per node, from network.path_mtu's detail in report.json."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return []
    out = []
    for rec in data.get("records", []):
        if rec.get("check") == "network.path_mtu":
            m = re.search(r"\((\d+(?:\.\d+)?) s\)", rec.get("detail", ""))
            if m:
                out.append(float(m.group(1)))
    return out


# --------------------------------------------------------------------------- one measured run

def measured_run(venv_bin: Path, inventory: Path, nodes: list[str], group: CpuGroup, env_extra: dict | None = None,
                 label: str = "", keep_output: bool = False, args: list[str] | None = None) -> dict:
    """One measured site.yml run (args: its extra arguments; the light harness's --skip-tags launch by default)."""
    from helpers import ansible_env
    ids = [subprocess.run(["docker", "inspect", "-f", "{{.Id}}", n], capture_output=True, text=True,
                          check=True).stdout.strip() for n in nodes]
    with tempfile.TemporaryDirectory(prefix="tybench-") as tmp:
        wrapper = Path(tmp) / "ssh"
        wrapper.write_text(SSH_WRAPPER)
        wrapper.chmod(0o755)
        ssh_log = Path(tmp) / "ssh.log"
        ssh_log.touch()
        task_cpu = Path(tmp) / "task_cpu.json"
        env = ansible_env({"ANSIBLE_SSH_EXECUTABLE": str(wrapper), "TRAINYARD_BENCH_SSH_LOG": str(ssh_log),
                           "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all", "PROFILE_TASKS_SORT_ORDER": "none",
                           "ANSIBLE_CALLBACK_PLUGINS": f"{REPO / 'callback_plugins'}:{REPO / 'tests/bench/callbacks'}"})
        if group.ok:  # the controller CPU of every task (tests/bench/callbacks/cpu_per_task.py)
            env.update({"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks,cpu_per_task",
                        "TRAINYARD_BENCH_CGROUP": str(group.path), "TRAINYARD_BENCH_TASK_CPU": str(task_cpu),
                        "TRAINYARD_BENCH_NODE_CGROUPS": ":".join(str(CGROUP_ROOT / "docker" / i / "cpuacct.usage")
                                                                 for i in ids)})
        if env_extra:
            env.update(env_extra)
            if env_extra.get("ANSIBLE_CACHE_PLUGIN") == "jsonfile":
                env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(Path(tmp) / "facts")
        argv = [str(venv_bin / "ansible-playbook"), "-i", str(inventory), "site.yml", *(SKIP if args is None else args)]
        sharded = any(a.startswith("cluster_shard_nodes=") and a != "cluster_shard_nodes=0" for a in argv)
        ctrl0, node0, busy0 = group.usage_s(), container_cpu_s(ids), machine_busy_s()
        ru0 = os.times()
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, preexec_fn=group.enter)
        main_cpu = [0.0]
        shard_cpu: dict[int, float] = {}  # a sharded run's children's main processes (docs/sharding.md)

        def sample():
            ticks = 0
            while proc.poll() is None:
                v = proc_cpu_s(proc.pid)
                if v is not None:
                    main_cpu[0] = v
                if sharded and ticks % 5 == 0:
                    for pid in set(shard_cpu) | set(shard_mains(proc.pid)):
                        c = proc_cpu_s(pid)
                        if c is not None:
                            shard_cpu[pid] = c
                ticks += 1
                time.sleep(0.2)
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        out = proc.communicate()[0]
        wall = time.monotonic() - t0
        th.join()
        ru1 = os.times()
        ctrl1, node1, busy1 = group.usage_s(), container_cpu_s(ids), machine_busy_s()
        calls = [line.split("\t") for line in ssh_log.read_text().splitlines() if line.strip()]
        targets = [c[0] for c in calls]
        ssh_kinds = {k: sum(1 for c in calls if c[1:2] == [k]) for k in ("module", "discovery", "other")}
        # SSH executions per task (all nodes together), in run order
        ssh_tasks: dict[str, int] = {}
        for c in calls:
            task = c[2] if len(c) > 2 and c[2] else "(before the first task)"
            ssh_tasks[task] = ssh_tasks.get(task, 0) + 1
        per_task = json.loads(task_cpu.read_text()) if task_cpu.exists() else []
    recap = {h: v for h, v in parse_recap(out).items() if h != "localhost"}
    if sharded:  # each node's tasks: the parent's (the lock) plus its child's recap, relayed as "[shard i] ..."
        kids = parse_recap("\n".join(re.sub(r"^\[shard \d+\] ", "", ln) for ln in out.splitlines()
                                     if ln.startswith("[shard ")))
        recap = {h: {k: v[k] + kids.get(h, {}).get(k, 0) for k in v} for h, v in recap.items()}
    n = len(nodes)
    profile = parse_profile(out)
    classes = superlinear_tasks()
    by_class: dict[str, float] = {"path_mtu": 0.0, "cross_node": 0.0}
    for name, secs in profile:
        if name in classes:
            by_class[classes[name]] += secs
    ctrl = (ctrl1 - ctrl0) if ctrl0 is not None else ((ru1.children_user + ru1.children_system)
                                                        - (ru0.children_user + ru0.children_system))
    per_host_tasks = [v["ok"] + v["failed"] + v["skipped"] for v in recap.values()]
    per_host_run = [v["ok"] + v["failed"] for v in recap.values()]
    head = min(recap, default=None)  # the simulated nodes are named <cluster>-node<i>; node1 is the head
    pmtu = path_mtu_module_seconds(REPO / "runs/latest/report.json")
    row = {
        "label": label, "nodes": n, "rc": proc.returncode, "wall_s": round(wall, 2),
        "changed": sum(v["changed"] for v in recap.values()) if recap else None,
        "failed": sum(v["failed"] + v["unreachable"] for v in recap.values()) if recap else None,
        "controller_cpu_s": round(ctrl, 2), "controller_main_cpu_s": round(main_cpu[0], 2),
        # Sampled every second: each child's main process CPU up to its last second (docs/sharding.md).
        "shard_main_cpu_s": sorted(round(v, 2) for v in shard_cpu.values()),
        "controller_cpu_source": "cgroup" if ctrl0 is not None else "rusage",
        "node_cpu_s": round(node1 - node0, 2),
        # Everything else the machine ran meanwhile (other users' work shares the same cores).
        "others_cpu_s": round((busy1 - busy0) - ctrl - (node1 - node0), 2),
        "cores": os.cpu_count(),
        "tasks_per_node": round(statistics.mean(per_host_tasks), 1) if per_host_tasks else None,
        "tasks_run_per_node": round(statistics.mean(per_host_run), 1) if per_host_run else None,
        "tasks_by_host": {h: {"run": v["ok"] + v["failed"], "skipped": v["skipped"]} for h, v in recap.items()},
        "head": head,
        "ssh_execs": len(targets), "ssh_execs_per_node": round(len(targets) / n, 1), "ssh_kinds": ssh_kinds,
        "ssh_tasks": ssh_tasks,
        "path_mtu_task_s": round(by_class["path_mtu"], 2), "cross_node_task_s": round(by_class["cross_node"], 2),
        "path_mtu_module_s_median": round(statistics.median(pmtu), 3) if pmtu else None,
        "tasks_timed": len(profile), "profile": profile, "task_cpu": per_task,
        "cross_node_tasks": sorted(k for k, v in classes.items() if v == "cross_node"),
    }
    row["controller_once_cpu_s"] = once_cpu_s(row)
    if proc.returncode != 0:
        row["output_tail"] = out[-3000:]
    if keep_output:
        row["output"] = out
    log(f"{label or 'run'} {n} nodes: {row['wall_s']} s, changed {row['changed']}, controller {row['controller_cpu_s']} "
        f"CPU-s (main {row['controller_main_cpu_s']}), nodes {row['node_cpu_s']} CPU-s, others {row['others_cpu_s']} "
        f"CPU-s, {row['tasks_per_node']} "
        f"tasks and {row['ssh_execs_per_node']} ssh per node, path MTU {row['path_mtu_task_s']} s, cross-node "
        f"{row['cross_node_task_s']} s")
    return row


def bench_scale(sizes: list[int], repeats: int, config_at: int | None) -> dict:
    from helpers import SIM, BIN
    results: dict = {"sizes": [], "config": [], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "commit": os.environ.get("TRAINYARD_BENCH_COMMIT") or subprocess.run(
                         ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()}
    group = CpuGroup(f"trainyard-bench-{os.getpid()}")
    # The size with the ansible.cfg runs goes last: the scale table is complete before the longest part.
    try:
        for n in sorted(sizes, key=lambda x: (x == config_at, x)):
            name = f"hn{n}"
            t0 = time.monotonic()
            subprocess.run([*SIM, "up", "--name", name, "--nodes", str(n), "--kind", "light"], cwd=REPO,
                           check=True)
            up = time.monotonic() - t0
            meta = json.loads((REPO / ".sim" / name / "cluster.json").read_text())
            inv = Path(meta["inventory"])
            try:
                first = measured_run(BIN, inv, meta["nodes"], group, label="first")
                reruns = []
                entry = {"nodes": n, "bringup_s": round(up, 1), "first": first, "reruns": reruns, "median": None}
                for i in range(max(1, repeats)):
                    reruns.append(measured_run(BIN, inv, meta["nodes"], group, label=f"re-run {i + 1}"))
                    entry["median"] = sorted(reruns, key=lambda r: r["wall_s"])[(len(reruns) - 1) // 2]
                    if entry not in results["sizes"]:
                        results["sizes"].append(entry)
                    RAW.write_text(json.dumps(results, indent=1) + "\n")  # a run cut short keeps what it measured
                if config_at == n:
                    for label, env in CONFIG_VARIANTS.items():
                        results["config"].append(measured_run(BIN, inv, meta["nodes"], group, env_extra=env,
                                                              label=label))
                        RAW.write_text(json.dumps(results, indent=1) + "\n")
            finally:
                subprocess.run([*SIM, "down", "--name", name], cwd=REPO, check=False)
    finally:
        group.close()
    return results


# --------------------------------------------------------------------------- model

def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b·x -> (a, b); one point gives (y, 0)."""
    if len(xs) < 2:
        return (ys[0] if ys else 0.0), 0.0
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def fit_growth(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """fit_line for a per-node cost, with a slope of at least 0: a per-node cost that falls with n is the run's
    fixed start-up cost spread over more nodes (and noise), not an economy of scale to extrapolate."""
    a, b = fit_line(xs, ys)
    return (a, b) if b >= 0 else (statistics.mean(ys), 0.0)


def model(points: list[dict], cores: int = 16, forks: int = 64, rtt_s: float = 0.001,
          project_to: tuple[int, ...] = (64, 256, 1024)) -> dict:
    """Fit the per-node costs on the measured points (converged re-runs) and project the wall time.

    points: [{nodes, wall_s, controller_cpu_s, controller_main_cpu_s, node_cpu_s, others_cpu_s, cores,
    ssh_execs_per_node, controller_once_cpu_s or task_cpu}]. Per node, each cost is fitted as a + b·n (b: what grows
    faster than linearly in all):
      serial(n)   = n·(s0 + s1·n)   the main process's CPU (strategy loop, forks, results): one core at most
      once(n)     =    o0 + o1·n    the once-per-run tasks (once_tasks(): run_once and the plays on localhost; their
                                    controller CPU, main process included): one worker at a time, serial too
      parallel(n) = n·(w0 + w1·n)   the workers' CPU (controller CPU less the main process and the once tasks):
                                    spreads over cores
      node(n)     =    c0 + c1·n    one node's CPU (its module runs, its sshd)
    A point without the once tasks' CPU (measured before it was kept) counts them as parallel, as the model did
    before: once(n) = 0 unless every point has it.
    Checked here, where the controller and every node share the machine's cores with other users' work:
      CPU(n) = serial(n) + parallel(n) + n·node(n), against the CPU measured;
      T_here(n) = max(serial(n), CPU(n) / cores_got), cores_got = cores - (others' CPU / wall) of that run.
    Projected on a cluster (a controller of `cores` cores to itself, each node its own CPUs, at most `forks`
    workers at once):
      T(n) = serial(n) + once(n) + parallel(n) / min(cores, forks, n) + node(n) + execs_per_node·rtt
    (additive: a task's controller and node parts are taken not to overlap, and the main process's share of the once
    tasks is counted in both serial terms, so this errs long).
    """
    pts = sorted(points, key=lambda p: p["nodes"])
    ns = [p["nodes"] for p in pts]
    onces = [p.get("controller_once_cpu_s") if p.get("controller_once_cpu_s") is not None else once_cpu_s(p)
             for p in pts]
    if not pts or any(o is None for o in onces):
        onces = [0.0] * len(pts)
    o0, o1 = fit_line(ns, onces) if len(pts) >= 2 else ((onces[0] if pts else 0.0), 0.0)
    if o1 < 0:  # a once cost that falls with n is noise: its mean, flat
        o0, o1 = statistics.mean(onces), 0.0
    s0, s1 = fit_growth(ns, [p["controller_main_cpu_s"] / p["nodes"] for p in pts])
    w0, w1 = fit_growth(ns, [(p["controller_cpu_s"] - p["controller_main_cpu_s"] - o) / p["nodes"]
                             for p, o in zip(pts, onces)])
    c0, c1 = fit_growth(ns, [p["node_cpu_s"] / p["nodes"] for p in pts])
    execs = statistics.mean(p["ssh_execs_per_node"] for p in pts) if pts else 0.0
    fit = {"s0": s0, "s1": s1, "o0": o0, "o1": o1, "w0": w0, "w1": w1, "c0": c0, "c1": c1, "execs_per_node": execs,
           "once_measured": any(onces)}

    def check(p, f):
        n = p["nodes"]
        serial = n * (f["s0"] + f["s1"] * n) + f["o0"] + f["o1"] * n
        cpu = serial + n * (f["w0"] + f["w1"] * n) + n * (f["c0"] + f["c1"] * n)
        measured_cpu = p["controller_cpu_s"] + p["node_cpu_s"]
        got = max(0.05, p.get("cores", 2) - max(0.0, p.get("others_cpu_s", 0.0)) / p["wall_s"])
        wall = max(serial, cpu / got)
        return {"nodes": n, "cpu_s": round(measured_cpu, 1), "cpu_model_s": round(cpu, 1),
                "cpu_error_pct": round(100 * (cpu - measured_cpu) / measured_cpu, 1), "cores_got": round(got, 2),
                "measured_s": p["wall_s"], "model_s": round(wall, 1),
                "error_pct": round(100 * (wall - p["wall_s"]) / p["wall_s"], 1)}

    checks = [check(p, fit) for p in pts]
    holdout = None
    if len(pts) >= 3:  # extrapolation: fitted without the largest size, predicting it
        holdout = dict(check(pts[-1], model(pts[:-1], cores, forks, rtt_s, ())["fit"]), fitted_on=ns[:-1])

    def cluster(n):
        par = n * (w0 + w1 * n) / max(1, min(cores, forks, n))
        once = o0 + o1 * n
        return {"nodes": n, "serial_s": round(n * (s0 + s1 * n), 1), "once_s": round(once, 1),
                "parallel_s": round(par, 1), "node_s": round(c0 + c1 * n, 1),
                "wall_s": round(n * (s0 + s1 * n) + once + par + c0 + c1 * n + execs * rtt_s, 1)}

    return {"fit": fit, "assumptions": {"cores": cores, "forks": forks, "rtt_s": rtt_s}, "checks": checks,
            "holdout": holdout, "projection": [cluster(n) for n in project_to]}


# --------------------------------------------------------------------------- report

def table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(h for h, _, _ in cols) + " |\n|" + "---|" * len(cols) + "\n"
    body = ""
    for r in rows:
        cells = []
        for _, key, fmt in cols:
            v = r.get(key)
            cells.append(format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v))
        body += "| " + " | ".join(cells) + " |\n"
    return head + body


def _row(n: int, kind: str, r: dict) -> dict:
    busy = r["controller_cpu_s"] + r["node_cpu_s"]
    return {"nodes": n, "run": kind, "wall": r["wall_s"], "rc": r["rc"], "changed": r["changed"],
            "ctrl": r["controller_cpu_s"] / n, "main": r["controller_main_cpu_s"] / n, "node": r["node_cpu_s"] / n,
            "share": busy / (busy + max(0.0, r.get("others_cpu_s") or 0.0)), "tasks": r["tasks_per_node"],
            "ran": r.get("tasks_run_per_node"), "execs": r["ssh_execs_per_node"], "pmtu": r["path_mtu_task_s"],
            "pmtu_mod": r.get("path_mtu_module_s_median"), "cross": r["cross_node_task_s"]}


ONCE_TXT = ("Once per run, serial (run_once tasks and the plays on localhost, scale.once_tasks()): {o0:.2f} + "
            "{o1:.4f}·n CPU-s in all.")
PROJECTION_COLUMNS = [("nodes", "nodes", "d"), ("serial (main process) s", "serial_s", ".1f"),
                      ("once-per-run tasks (serial) s", "once_s", ".1f"), ("workers / cores s", "parallel_s", ".1f"),
                      ("one node s", "node_s", ".1f"), ("projected wall s", "wall_s", ".1f")]


def _model_sections(title: str, pts: list[dict]) -> list[str]:
    m = model(pts)
    f = m["fit"]
    a = m["assumptions"]
    fit_txt = (f"Fit (per node, n nodes): main process {f['s0']:.3f} + {f['s1']:.5f}·n CPU-s; workers "
               f"{f['w0']:.3f} + {f['w1']:.5f}·n CPU-s; one node {f['c0']:.3f} + {f['c1']:.5f}·n CPU-s; "
               f"{f['execs_per_node']:.1f} remote executions per node. " + ONCE_TXT.format(**f))
    hold = m["holdout"]
    hold_txt = (f"\n\nExtrapolation check: fitted on {hold['fitted_on']} only, the model gives "
                f"{hold['cpu_model_s']} CPU-s at {hold['nodes']} nodes against {hold['cpu_s']} measured "
                f"({hold['cpu_error_pct']:+.1f}%), and a wall of {hold['model_s']} s against {hold['measured_s']} s "
                f"({hold['error_pct']:+.1f}%)." if hold else
                "\n\nTwo sizes only: each line goes through both points unless its slope was held at 0, so this check "
                "says little; a third size gives the extrapolation check.")
    return [f"### Model on the {title}, against the measured points\n\nThis machine: its cores shared by the "
            "controller, every node and other users' work (cores got = cores less the others' CPU over the run's "
            f"wall).\n\n{fit_txt}{hold_txt}\n\n"
            + table(m["checks"], [("nodes", "nodes", "d"), ("CPU s", "cpu_s", ".1f"),
                                  ("model CPU s", "cpu_model_s", ".1f"), ("CPU off by %", "cpu_error_pct", "+.1f"),
                                  ("cores got", "cores_got", ".2f"), ("wall s", "measured_s", ".1f"),
                                  ("model wall s", "model_s", ".1f"), ("wall off by %", "error_pct", "+.1f")]),
            f"### Projection from the {title}: a {a['cores']}-core controller, nodes in parallel (forks {a['forks']}, "
            f"{a['rtt_s'] * 1000:.0f} ms per remote execution)\n\n"
            + table(m["projection"], PROJECTION_COLUMNS)]


def task_cost_section(run: dict, top: int = 20) -> str:
    """Where a converged run's CPU goes, per task and node: the controller's and the nodes' CPU (cgroups, read as each
    task starts) and the SSH executions of the task (the bench's ssh wrapper), heaviest controller tasks first."""
    n = run["nodes"]
    ssh = run.get("ssh_tasks") or {}
    rows = [{"task": t, "ctrl": c / n, "node": nd / n, "ssh": ssh.get(t, 0) / n} for t, c, nd, *_ in run["task_cpu"]]
    total = {"ctrl": sum(r["ctrl"] for r in rows), "node": sum(r["node"] for r in rows),
             "ssh": sum(r["ssh"] for r in rows)}
    rows.sort(key=lambda r: -r["ctrl"])
    rest = rows[top:]
    shown = rows[:top] + ([{"task": f"the other {len(rest)} tasks", "ctrl": sum(r["ctrl"] for r in rest),
                            "node": sum(r["node"] for r in rest), "ssh": sum(r["ssh"] for r in rest)}] if rest else [])
    shown.append({"task": "all tasks", **total})
    beats = {k: v for k, v in ssh.items() if k not in {r["task"] for r in rows}}
    note = ("" if not beats else "\n\nSSH executions outside the tasks above (per node): " + ", ".join(
        f"{k}: {v / n:.1f}" for k, v in beats.items()) + ".")
    return (f"### Where a converged run's CPU goes, per task ({n} light nodes, converged re-run)\n\n"
            "Controller CPU = the run's cgroup between the start of the task and the start of the next one (its "
            "workers, their SSH clients, the main process meanwhile, and the cluster lock's heartbeat refreshers "
            "that beat then); node CPU the same on the nodes' cgroups; SSH = executions the bench's ssh wrapper "
            "logged while the task ran (module runs; the cluster lock's heartbeats count under the task that took "
            "the lock, whose workers fork the refreshers). Per node.\n\n"
            + table(shown, [("task", "task", ""), ("controller CPU s/node", "ctrl", ".3f"),
                            ("node CPU s/node", "node", ".3f"), ("SSH/node", "ssh", ".2f")]) + note)


def sections(results: dict, command: str, machine: str) -> list[str]:
    sizes = sorted(results["sizes"], key=lambda e: e["nodes"])
    rows = []
    for e in sizes:
        rows.append(_row(e["nodes"], "first", e["first"]))
        if e.get("median"):
            rows.append(_row(e["nodes"], "converged", e["median"]))
    out = [f"## Scale: converged site.yml on light nodes\n\nMachine: {machine}  \nDate: {results['date']} "
           f"(commit {results['commit']})  \nCommand: `{command}`  \nRaw: `docs/benchmarks-scale.json`"
           + (f"  \nNote: {results['note']}" if results.get("note") else "") + "\n\n"
           "Light simulated nodes (`simcluster.py up --kind light`: sshd and Python only; container_enabled false, "
           "launch_runtime host, nccl_check_enabled false; `--skip-tags launch`). CPU from cgroup accounting, per "
           "node; share = this run's CPU over all the machine's busy CPU meanwhile (other users' work included); "
           "tasks per node from the recap (ran = not skipped); remote executions = `ssh` calls per node (one per "
           "module call, pipelined); path MTU = the task that runs path_mtu_check (its module's own median seconds "
           "beside it); cross-node = the summed wall time of every task that reads other hosts' hostvars over a host "
           "list.\n\n" + table(rows, [
               ("nodes", "nodes", "d"), ("run", "run", ""), ("wall s", "wall", ".1f"), ("rc", "rc", ""),
               ("changed", "changed", ""), ("controller CPU s/node", "ctrl", ".2f"),
               ("of it main process s/node", "main", ".2f"), ("node CPU s/node", "node", ".2f"),
               ("share", "share", ".2f"), ("tasks/node", "tasks", ""), ("ran/node", "ran", ""),
               ("remote execs/node", "execs", ""), ("path MTU task s", "pmtu", ".2f"),
               ("path MTU module s", "pmtu_mod", ""), ("cross-node tasks s", "cross", ".2f")])]
    # A run whose trainers all finished their tasks (failed 0) measured the whole workload, whatever its rc.
    for title, pts in (("converged re-runs", [e["median"] for e in sizes if e.get("median")]),
                       ("first runs", [e["first"] for e in sizes])):
        pts = [p for p in pts if p.get("failed") in (0, None) and p.get("changed") is not None]
        if len(pts) >= 2:
            out += _model_sections(title, pts)
    big = next((e for e in reversed(sizes) if e.get("median") and e["median"].get("task_cpu")), None)
    if big:
        out.append(task_cost_section(big["median"]))
    if results.get("config"):
        base = next((r for r in results["config"] if r["label"] == "project ansible.cfg"), None)
        rows = []
        for r in results["config"]:
            cpu = r["controller_cpu_s"] + r["node_cpu_s"]
            rows.append({"setting": r["label"], "wall": r["wall_s"], "rc": r["rc"], "changed": r["changed"],
                         "ctrl": r["controller_cpu_s"], "node": r["node_cpu_s"], "execs": r["ssh_execs_per_node"],
                         "ratio": (r["wall_s"] / base["wall_s"]) if base else None,
                         "cpu_ratio": cpu / (base["controller_cpu_s"] + base["node_cpu_s"]) if base else None})
        out.append(f"### ansible.cfg against Ansible's defaults, one setting at a time ({results['config'][0]['nodes']} "
                   "light nodes, converged re-run each)\n\n" + table(rows, [
                       ("setting", "setting", ""), ("wall s", "wall", ".1f"), ("rc", "rc", ""),
                       ("changed", "changed", ""), ("controller CPU s", "ctrl", ".1f"), ("node CPU s", "node", ".1f"),
                       ("ssh calls/node", "execs", ""), ("wall / project", "ratio", ".2f"),
                       ("CPU / project", "cpu_ratio", ".2f")]))
    return out
