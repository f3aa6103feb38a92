"""playbooks/status.yml diagnosing a live job on the simulated cluster: a real DDP job over gloo
(examples/ddp_train.py, CPU-bound work per step, per-rank progress files).

* Straggler: one node's training container gets CPU limits (`docker update --cpu-quota --cpu-shares` in the node's
  own engine: that is the cgroup its ranks run in; a quota on the outer node container does not reach them, because
  the node's dockerd puts the training container in a cgroup of its own beside the node's, not beneath it).
  status.yml names exactly that node, from the ranks' own compute times.
* Hang: one rank is frozen (SIGSTOP) and the others wait for it at the next collective (the collective timeout is
  long, so the job stays hung). With no progress for status_stall_s, status.yml dumps every rank's Python stack with
  py-spy (placed on the node from the controller), names the stopped rank with the fix, and collect.yml gathers the
  stacks.
* Watch: `-e status_watch=<s>` prints the table again and again until a short job ends.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from test_collect import CONTAINER, RW, STATE, clear_progress_and_checkpoints, launch, run_dir_of, steps, wait_until

ARGV = ["--steps", "100000", "--save-every", "0", "--sleep", "0.05", "--work", "400", "--output-root", "/srv/outputs",
        "--collective-timeout", "1800"]
PS = "ps -eo pid=,args= | grep '[d]dp_train.py' | grep -v torchrun | awk '{print $1}'"


def start_job(cluster, argv):
    r = launch(cluster, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
    assert r.returncode == 0, r.stdout[-3000:]
    clear_progress_and_checkpoints(cluster)
    extra = {"launch_example_argv": argv, "launch_wait_timeout": 600,
             "launch_env": {"TRAINYARD_PROGRESS_DIR": f"{RW}/progress"}}
    r = launch(cluster, "-e", "test_launch_entry=main", "-e", json.dumps(extra))
    assert r.returncode == 0, r.stdout[-3000:]


@pytest.fixture(scope="module")
def job(cluster):
    start_job(cluster, ARGV)
    assert wait_until(lambda: all(steps(cluster, n) >= 3 for n in cluster.nodes), 900), "no progress files"
    try:
        yield cluster
    finally:
        launch(cluster, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")


def stragglers(out: str) -> list[str]:
    return re.findall(r"STRAGGLER (\S+) \(node rank \d+\) is a straggler", out)


def test_a_node_with_a_cpu_quota_is_named_the_straggler(job):
    slow = job.nodes[-1]
    r = job.playbook("playbooks/status.yml", "-e", "status_stall_s=100000")
    assert r.returncode == 0 and stragglers(r.stdout) == [], r.stdout[-3000:]
    # CPU limits on the training container, in the node's own engine: a quota of 2 ms per 100 ms slows the ranks
    # there when the machine is idle, a quarter of the CPU shares when it is busy (a quota alone does not bind when
    # every process gets less than it anyway)
    job.exec(slow, ["docker", "update", "--cpu-period", "100000", "--cpu-quota", "2000", "--cpu-shares", "256",
                    CONTAINER])
    try:
        limits = job.exec(slow, ["docker", "inspect", "-f", "{{.HostConfig.CpuQuota}} {{.HostConfig.CpuShares}}",
                                 CONTAINER]).stdout.split()
        assert limits == ["2000", "256"]
        # the progress files average the last 20 steps: wait until they all ran under the limits
        s0 = steps(job, slow)
        assert wait_until(lambda: steps(job, slow) >= s0 + 22, 1500, step=5), "the slowed node made no progress"
        r = job.playbook("playbooks/status.yml", "-e", "status_stall_s=100000")
        out = r.stdout
        assert r.returncode == 0, out[-3000:]
        assert stragglers(out) == [slow], out[-3000:]
        m = re.search(rf"STRAGGLER {slow} \(node rank \d\) is a straggler: its ranks \[\d+\] compute a step in "
                      r"([\d.]+) s, the other nodes' ranks in ([\d.]+) s \(([\d.]+)x\).*fix: on " + slow, out)
        assert m and float(m.group(1)) > float(m.group(2)), out[-3000:]
        assert "CPU quota on the training container" in out
    finally:
        job.exec(slow, ["docker", "update", "--cpu-quota", "-1", "--cpu-shares", "1024", CONTAINER], check=False)


def test_a_hung_job_gets_every_ranks_stack_and_the_stopped_rank_is_named(job):
    frozen = job.nodes[-1]
    pid = job.exec(frozen, ["sh", "-c", PS]).stdout.split()
    assert len(pid) == 1, pid
    job.exec(frozen, ["kill", "-STOP", pid[0]])
    try:
        # every rank stops making progress (the others wait for the frozen one at the next collective); the
        # stall time below is shorter than this wait
        time.sleep(15)
        r = job.playbook("playbooks/status.yml", "-e", "status_stall_s=10")
        out = r.stdout
        assert r.returncode == 0, out[-4000:]
        assert "STALLED: no progress on" in out, out[-4000:]
        n = len(job.nodes)
        sits = re.findall(r"ranks? ((?:\d+ \(\S+\)(?:, )?)+) sits? in (\S+ \(\S+:\d+\))", out)
        named = sorted(int(x) for ranks, _call in sits for x in re.findall(r"(\d+) \(", ranks))
        assert named == list(range(n)), out[-4000:]  # every rank's stack, each in exactly one group
        frozen_rank = n - 1  # one rank per node, node ranks in inventory order
        assert re.search(rf"rank {frozen_rank} on {frozen} \(pid {pid[0]}\) is stopped \(SIGSTOP.*fix: send it "
                         r"SIGCONT", out), out[-4000:]
        assert "no stack:" not in out  # no rank left without its stack
        for node in job.nodes:
            assert job.exec(node, ["sh", "-c", f"test -x /var/lib/trainyard/bin/py-spy && ls {STATE}/stacks"]
                            ).stdout.split() == [f"rank_{job.nodes.index(node)}.txt"]
        r = job.playbook("playbooks/collect.yml")
        assert r.returncode == 0, r.stdout[-4000:]
        run = run_dir_of(r.stdout)
        text = (run / "nodes" / frozen / "stacks" / f"rank_{frozen_rank}.txt").read_text()
        assert f"Process {pid[0]}" in text and "ddp_train.py" in text
        # An entry point that writes no progress files (or a job hung before its first step): the silence of its
        # log since the launch tells the hang, on every node.
        for node in job.nodes:
            job.exec(node, ["sh", "-c", f"rm -f {RW}/progress/*"])
        r = job.playbook("playbooks/status.yml", "-e", "status_stall_s=10")
        assert r.returncode == 0, r.stdout[-4000:]
        line = next(x for x in r.stdout.splitlines() if "STALLED: no progress on" in x)
        assert all(f"{n} (no step recorded and its log silent)" in line for n in job.nodes), line
    finally:
        job.exec(frozen, ["kill", "-CONT", pid[0]], check=False)


def test_status_watch_prints_the_table_until_the_job_ends(cluster):
    start_job(cluster, ["--steps", "80", "--save-every", "0", "--sleep", "0.5", "--output-root", "/srv/outputs"])
    try:
        r = cluster.playbook("playbooks/status.yml", "-e", "status_watch=3", "-e", "status_stall_s=100000")
        out = r.stdout
        assert r.returncode == 0, out[-4000:]
        tables = [m.start() for m in re.finditer(r'"node\s+rank\s+state', out)]
        assert len(tables) >= 2, out[-4000:]  # refreshed while the job ran
        last = out[tables[-1]:]
        for node in cluster.nodes:  # the last table: the job ended on every node
            assert re.search(rf'"{node}\s+\d\s+finished\s+80\s', last), last[:3000]
        assert "job train: finished" in out
        for node in cluster.nodes:
            assert "done steps=80" in cluster.exec(node, ["cat", f"{RW}/torchrun.log"]).stdout
    finally:
        launch(cluster, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
