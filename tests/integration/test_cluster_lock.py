"""The cluster lock on a simulated 2-node cluster of this module's own: two site.yml runs at once, site.yml and
reset.yml at once, status.yml while site.yml holds the lock, and the lock a killed controller leaves (taken over).

Runs are started as real ansible-playbook processes (their output in files, so a full pipe never stalls them);
a run "holds the lock" once the head's lock file names its PID.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from helpers import REPO, BIN, SimCluster, ansible_env, parse_recap, sim_down, sim_up, wait_until

LOCK = "/var/lib/trainyard-lock/cluster.lock"
SHORT_WAIT = ["-e", "cluster_lock_wait_s=5"]
# The bandwidth floor is not under test here: a busy 2-core machine must not fail a site.yml run on it.
SITE = ["site.yml", "-e", "nccl_check_min_inter_busbw_gbps=0.001", "-e", "nccl_check_min_intra_busbw_gbps=0.001"]

# Distinct TRAINYARD_LAUNCH_ID values of the processes of a node: one per launched job.
TOKENS = ("import os\nseen = set()\nfor p in os.listdir('/proc'):\n if p.isdigit():\n  try:\n"
          "   e = open('/proc/%s/environ' % p, 'rb').read().split(b'\\0')\n  except OSError:\n   continue\n"
          "  seen.update(x.split(b'=', 1)[1].decode() for x in e if x.startswith(b'TRAINYARD_LAUNCH_ID='))\n"
          "print('\\n'.join(sorted(seen)))\n")


@pytest.fixture(scope="module")
def lk():
    name = os.environ.get("TY_SIM_NAME", "it") + "lk"
    if os.environ.get("TY_SIM_REUSE") == "1" and (REPO / ".sim" / name / "cluster.json").exists():
        yield SimCluster(name)
        return
    c = sim_up(name, 2)
    try:
        yield c
    finally:
        sim_down(name)


class Run:
    """An ansible-playbook run in the background; .pid is the ansible-playbook process."""

    def __init__(self, cluster, tmp_path, playbook, *args):
        self.log = tmp_path / f"{playbook.replace('/', '_')}-{time.monotonic_ns()}.log"
        self._out = open(self.log, "w")
        argv = [str(BIN / "ansible-playbook"), "-i", str(cluster.inventory), playbook, *args]
        self.proc = subprocess.Popen(argv, cwd=REPO, env=ansible_env(), stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT)
        self.pid = self.proc.pid

    def wait(self, timeout=900):
        rc = self.proc.wait(timeout=timeout)
        self._out.close()
        return rc

    @property
    def output(self):
        return self.log.read_text()


def holder(cluster, node):
    r = cluster.exec(node, ["cat", LOCK], check=False)
    return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None


def wait_for_holder(cluster, run, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = holder(cluster, cluster.head)
        if h and h.get("pid") == run.pid:
            return h
        assert run.proc.poll() is None, f"the run ended before it held the lock:\n{run.output[-3000:]}"
        time.sleep(0.5)
    raise AssertionError("the run never took the lock")


def lock_mtime(cluster, node):
    r = cluster.exec(node, ["stat", "-c", "%Y", LOCK], check=False)
    return int(r.stdout) if r.returncode == 0 else None


def lock_error(output):
    """The one line the task failed with."""
    lines = [ln for ln in output.splitlines() if "Cluster lock " in ln and ln.lstrip().startswith("[ERROR]")]
    assert lines, output[-3000:]
    return lines[0]


def job_tokens(cluster, node):
    """The launch tokens of the jobs running on node (a sidecar's token is its job's plus "-<name>")."""
    return sorted({t.split("-")[0] for t in cluster.exec(node, ["python3", "-c", TOKENS]).stdout.split()})


def run_sync(cluster, tmp_path, playbook, *args):
    r = Run(cluster, tmp_path, playbook, *args)
    return r.wait(), r


def test_two_site_runs_at_once_launch_one_job_per_node(lk, tmp_path):
    a = Run(lk, tmp_path, *SITE, *SHORT_WAIT)
    b = Run(lk, tmp_path, *SITE, *SHORT_WAIT)
    rcs = {a: a.wait(), b: b.wait()}
    winners = [r for r, rc in rcs.items() if rc == 0]
    assert len(winners) == 1, {r.pid: (rc, r.output[-2500:]) for r, rc in rcs.items()}
    winner, loser = winners[0], (b if winners[0] is a else a)
    line = lock_error(loser.output)
    assert f"ansible-playbook PID {winner.pid}" in line and "running site.yml" in line, line
    assert "cluster_lock_wait_s" in line and "since " in line, line
    assert "nccl_check.inter_node" not in loser.output
    for node in lk.nodes:
        assert len(job_tokens(lk, node)) == 1, node
        assert holder(lk, node) is None, node


def test_a_converged_run_while_the_job_trains_measures_nothing_and_gives_the_lock_back(lk, tmp_path):
    """The job of the test above trains: the cluster role's probe says so (host_facts job), so role nccl_check records
    the skip on every node without a status read of its own (no node in the read play, none in the role's late read);
    each node's confirmed start gave its lock back, so the release play has no node left, and no lock remains."""
    before = {n: job_tokens(lk, n) for n in lk.nodes}
    assert all(len(t) == 1 for t in before.values()), before
    rc, site = run_sync(lk, tmp_path, *SITE, "-e", f"cluster_run_dir={tmp_path}")
    assert rc == 0, site.output[-3000:]
    records = json.loads((tmp_path / "report.json").read_text())["records"]
    inter = {x["host"]: x for x in records if x["check"] == "nccl_check.inter_node"}
    assert sorted(inter) == sorted(lk.nodes), inter
    assert all(x["status"] == "skip" and "is training on" in x["detail"] for x in inter.values()), inter
    # The probe answered on every node: the play that reads the others selects none, and the role reads nothing.
    read = site.output.split("PLAY [Read whether the job trains where this run cannot tell yet]", 1)[1]
    assert read.split("PLAY [", 1)[0].strip().splitlines()[-1] == "skipping: no hosts matched", read[:2000]
    assert "Read whether this job already runs on the node]" not in site.output
    late = site.output.split("Read whether this job runs where the run could not tell yet", 1)[1].split("TASK [", 1)[0]
    assert "skipping:" in late and "ok:" not in late, late
    release = site.output.split("PLAY [Release the cluster lock]", 1)[1].split("PLAY RECAP", 1)[0]
    assert "skipping: no hosts matched" in release, release
    # The nodes come with the driver and the engine (the simulated cluster's inventory): no node installs anything,
    # so the install play selects none and no install task runs, not even a skipped one.
    assert play_of(site.output, INSTALL_PLAY) == "skipping: no hosts matched", play_of(site.output, INSTALL_PLAY)
    assert "Install the NVIDIA driver]" not in site.output and "Install the docker engine]" not in site.output
    for node in lk.nodes:
        assert job_tokens(lk, node) == before[node], node
        assert holder(lk, node) is None, node


def play_of(output, name):
    """The output of play `name` of a run, up to the next play."""
    return output.split(f"PLAY [{name}]", 1)[1].split("\n", 1)[1].split("PLAY [", 1)[0].strip()


INSTALL_PLAY = "Install the driver and the engine where the inventory asks for them"


def test_the_install_play_runs_on_the_nodes_that_install_only(lk, tmp_path):
    """One node whose own variables ask for the engine's install (host_vars) is the one node of site.yml's install
    play; its engine came with the node, so the install changes nothing, and the job the tests above started trains
    on."""
    node = lk.nodes[-1]
    inventory = lk.inventory if lk.inventory.is_dir() else lk.inventory.parent
    host_vars = inventory / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / f"{node}.yml").write_text("container_engine_install: true\n")
    try:
        rc, site = run_sync(lk, tmp_path, *SITE, "-e", f"cluster_run_dir={tmp_path}")
    finally:
        (host_vars / f"{node}.yml").unlink()
    assert rc == 0, site.output[-3000:]
    install = play_of(site.output, INSTALL_PLAY)
    hosts = set(re.findall(r"^(?:ok|changed|skipping|failed): \[([^\]\s]+)", install, re.M))
    hosts |= {h for line in re.findall(r"^included: \S+ for (.+)$", install, re.M) for h in line.split(", ")}
    assert hosts == {node}, install[:3000]
    assert "Install the docker engine and the Python libraries of the docker modules]" in install, install[:3000]
    assert parse_recap(site.output)[node]["changed"] == 0, site.output[-2500:]


def test_status_runs_and_reset_stops_while_site_holds_the_lock(lk, tmp_path):
    before = {n: job_tokens(lk, n) for n in lk.nodes}
    # A heartbeat every 2 s; the data path measured although the job trains, so that the converged run still holds
    # the lock (taken at its start, given back by each node's confirmed launch) when status.yml and reset.yml come.
    site = Run(lk, tmp_path, *SITE, "-e", "cluster_lock_stale_s=8", "-e", "nccl_check_while_running=true")
    try:
        wait_for_holder(lk, site)
        first = lock_mtime(lk, lk.head)
        assert wait_until(lambda: site.proc.poll() is not None or (lock_mtime(lk, lk.head) or 0) > first, 120, 0.5), \
            "the holder's heartbeat never touched the lock"
        assert site.proc.poll() is None, "site.yml ended before its heartbeat was seen"
        rc, status = run_sync(lk, tmp_path, "playbooks/status.yml")
        assert "Cluster lock" not in status.output and "Take the cluster lock" not in status.output
        assert rc == 0, status.output[-3000:]
        h = holder(lk, lk.head)
        assert h and h["pid"] == site.pid, "status.yml ran after site.yml had finished: nothing was proven"

        rc, reset = run_sync(lk, tmp_path, "reset.yml", "-e", "reset_confirm=true", "-e", "cluster_lock_wait_s=3")
        assert rc != 0, (f"reset.yml exited 0 while site.yml {'ran' if site.proc.poll() is None else 'had ended'} "
                         f"(holder now: {holder(lk, lk.head)}):\n{reset.output[-4000:]}")
        line = lock_error(reset.output)
        assert f"ansible-playbook PID {site.pid}" in line and "running site.yml" in line, line
        # Stopped at the lock, before the question and any node's reset (reset.yml takes the lock in the play that
        # resets, so the play's name alone proves nothing).
        assert "Stop the job and clean after it" not in reset.output and "Ask before touching" not in reset.output
    finally:
        assert site.wait() == 0, site.output[-3000:]
    for node in lk.nodes:
        after = job_tokens(lk, node)  # one job, and the one that ran before site.yml when there was one
        assert len(after) == 1 and after == (before[node] or after), (node, before[node], after)
        assert holder(lk, node) is None, node


def test_killed_controller_lock_is_taken_over_by_the_next_run(lk, tmp_path):
    # reset_container=always: the container's restart follows job_reset on every node, so job_reset does not give the
    # lock back in its call (it does where it is the node's last change: a run killed after that leaves no lock there).
    run = Run(lk, tmp_path, "reset.yml", "-e", "reset_confirm=true", "-e", "reset_container=always",
              "-e", "cluster_lock_stale_s=8")  # a heartbeat every 2 s
    wait_for_holder(lk, run)
    os.kill(run.pid, signal.SIGKILL)  # not reaped yet: a zombie, as under a runner that waits later
    try:
        time.sleep(3)  # a heartbeat under way at the kill ends on its own; none starts after it
        assert holder(lk, lk.head)["pid"] == run.pid
        beat = lock_mtime(lk, lk.head)
        time.sleep(5)
        assert lock_mtime(lk, lk.head) == beat, "the killed run's heartbeat still touches the lock"

        rc, again = run_sync(lk, tmp_path, "reset.yml", "-e", "reset_confirm=true")
        assert rc == 0, again.output[-3000:]
        took = re.findall(rf"took over the cluster lock of \S+ \(ansible-playbook PID {run.pid}\) running "
                          rf"reset\.yml since .*: its ansible-playbook process {run.pid} no longer runs",
                          " ".join(again.output.split()))  # a long warning may be wrapped
        assert took, again.output[-3000:]
        assert "waiting up to" not in again.output  # a dead holder is taken over at once
    finally:
        run.wait()
    for node in lk.nodes:
        assert holder(lk, node) is None, node


def test_failed_run_gives_the_lock_back(lk, tmp_path):
    # Unconfirmed (stdin is not a terminal): the reset fails on the controller after it took the lock; the plays
    # after a failed one never run, the callback cluster_lock gives the lock back at exit.
    rc, r = run_sync(lk, tmp_path, "reset.yml")
    assert rc != 0 and "Reset not confirmed" in r.output, r.output[-3000:]
    # The lock was taken on every node in one try before the question failed.
    taken = r.output.split("Take the cluster lock on every node at once", 1)[-1].split("TASK [", 1)[0]
    assert all(f"ok: [{n}]" in taken for n in lk.nodes), r.output[-3000:]
    for node in lk.nodes:
        assert wait_until(lambda n=node: holder(lk, n) is None, 120, 0.5), f"{node}: the failed run's lock was never released"
