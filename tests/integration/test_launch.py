"""The launch role and torchrun_launch on a 3-node simulated cluster: real torchrun, real DDP over gloo on the
data network, inside each node's training container (runtime docker, pid_mode host).

Runs tests/integration/playbooks/launch.yml (container role, a stand-in env file, the launch role; the cluster
model from playbooks/validate.yml) and playbooks/status.yml.
The tests run in order on one job: launch → idempotent relaunch → kill -9 of a rank → status names it, the
survivors exit → relaunch resumes → stop leaves nothing of the job and spares a decoy named torchrun.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest

from helpers import parse_recap, wait_until

PLAYBOOK = "tests/integration/playbooks/launch.yml"
STATE = "/var/lib/trainyard/train"
RW = f"{STATE}/job-rw"
OUT = "/srv/outputs"
ARGV = ["--steps", "5000", "--save-every", "5", "--sleep", "0.3", "--output-root", OUT]
# What torchrun records when a rank's collective failed because a peer went away (module_utils/torchrun.py's
# communication errors).
COMM_ERROR = re.compile(r"connection (reset|closed|refused)|pair\.cc|timed out", re.I)
EXTRA = ["-e", json.dumps({"launch_example_argv": ARGV, "launch_wait_timeout": 600})]


def play(cluster, *args):
    r = cluster.playbook(PLAYBOOK, *args)
    return r, parse_recap(r.stdout)


def log_of(cluster, node) -> str:
    return cluster.exec(node, ["cat", f"{RW}/torchrun.log"], check=False).stdout


def state_of(cluster, node) -> dict | None:
    r = cluster.exec(node, ["cat", f"{STATE}/launch.json"], check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def ps(cluster, node) -> list[tuple[int, int, str]]:
    out = cluster.exec(node, ["ps", "-eo", "pid=,ppid=,args="]).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3:
            rows.append((int(parts[0]), int(parts[1]), parts[2]))
    return rows


def trainers(cluster, node) -> list[int]:
    """PIDs of the example's rank processes (python running ddp_train.py, not torchrun itself)."""
    return [pid for pid, _, args in ps(cluster, node) if "ddp_train.py" in args and "torchrun" not in args
            and "launcher.py" not in args]


def token_holders(cluster, node, token) -> list[int]:
    script = ("import os\nfor p in os.listdir('/proc'):\n  if p.isdigit():\n    try:\n"
              "      e=open('/proc/%s/environ'%p,'rb').read().split(b'\\0')\n    except OSError:\n      continue\n"
              f"    if b'TRAINYARD_LAUNCH_ID={token}' in e: print(p)\n")
    out = cluster.exec(node, ["python3", "-c", script]).stdout
    return [int(x) for x in out.split()]


def status_play(cluster):
    """playbooks/status.yml (validate, then every node's job state)."""
    return cluster.playbook("playbooks/status.yml")


def head_step(cluster) -> int:
    steps = re.findall(r"trainyard: step (\d+) ", log_of(cluster, cluster.head))
    return int(steps[-1]) if steps else 0


def latest_complete(cluster) -> int:
    out = cluster.exec(cluster.head, ["sh", "-c", f"ls -d {OUT}/checkpoint-*/trainer_state.json 2>/dev/null"],
                       check=False).stdout
    steps = [int(m) for m in re.findall(r"checkpoint-(\d+)/", out)]
    return max(steps) if steps else 0


@pytest.fixture(scope="module")
def job(cluster):
    """The training container on every node, no job, no checkpoints; the job stopped at the end."""
    r, _ = play(cluster, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
    assert r.returncode == 0, r.stdout[-3000:]
    for node in cluster.nodes:
        cluster.exec(node, ["sh", "-c", f"rm -rf {OUT}/checkpoint-* {RW}/torchrun.log*"])
    r, _ = play(cluster, "-e", "test_launch_entry=none", *EXTRA)
    assert r.returncode == 0, r.stdout[-3000:]
    yield cluster
    play(cluster, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")


def test_check_mode_shows_each_nodes_command_and_starts_nothing(job):
    r, recap = play(job, "--check", "-v", "-e", "test_launch_prepare=false", *EXTRA)
    assert r.returncode == 0, r.stdout[-3000:]
    for rank, node in enumerate(job.nodes):
        assert f"--node_rank={rank}" in r.stdout
        assert state_of(job, node) is None
        assert trainers(job, node) == []
    assert '"GLOO_SOCKET_IFNAME": "eth1"' in r.stdout  # the env file's content is reported


def test_all_ranks_rendezvous_and_train_20_steps(job):
    r, recap = play(job, "-e", "test_launch_prepare=false", *EXTRA)
    assert r.returncode == 0, r.stdout[-4000:]
    assert all(recap[n]["changed"] >= 1 and recap[n]["failed"] == 0 for n in job.nodes)
    for rank, node in enumerate(job.nodes):
        st = state_of(job, node)
        assert st["node_rank"] == rank and st["runtime"] == "docker" and st["job"] == "train"
        assert f"--node_rank={rank}" in st["command"]
        assert f"trainyard: rendezvous done rank={rank} world=3" in wait_until(
            lambda: "rendezvous done" in log_of(job, node) and log_of(job, node), 300)
    assert wait_until(lambda: head_step(job) >= 20, 600) >= 20 or head_step(job) >= 20, log_of(job, job.head)[-2000:]


def test_the_job_runs_as_the_containers_unprivileged_user(job):
    """The launch's docker exec runs the launcher, torchrun and the ranks as container_user (65532:65532), with no
    capability and no-new-privileges; the checkpoints they write on the node are that uid's (as root, before the
    hardening, every one of these was 0)."""
    for node in job.nodes:
        st = state_of(job, node)
        for pid in [st["pid"], *trainers(job, node)]:
            status = job.exec(node, ["cat", f"/proc/{pid}/status"]).stdout
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            assert fields["Uid"].split()[:2] == ["65532", "65532"], (node, pid, fields["Uid"])
            assert fields["Gid"].split()[:2] == ["65532", "65532"], (node, pid, fields["Gid"])
            assert int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0, (node, pid, fields["CapBnd"])
            assert fields["NoNewPrivs"].strip() == "1", (node, pid)
    owners = job.exec(job.head, ["sh", "-c", f"stat -c %u:%g {OUT}/checkpoint-* | sort -u"]).stdout.split()
    assert owners == ["65532:65532"], owners


def test_second_launch_starts_no_second_copy(job):
    before = {n: state_of(job, n) for n in job.nodes}
    r, recap = play(job, "-e", "test_launch_prepare=false", *EXTRA)
    assert r.returncode == 0, r.stdout[-4000:]
    for node in job.nodes:
        assert recap[node]["changed"] == 0, r.stdout[-4000:]
        st = state_of(job, node)
        assert (st["pid"], st["start_ticks"]) == (before[node]["pid"], before[node]["start_ticks"])
        assert len(trainers(job, node)) == 1
        agents = [p for p, _, a in ps(job, node) if "torchrun --nnodes" in a]
        assert len(agents) == 1


def test_kill_one_rank_status_names_it_and_survivors_exit(job):
    victim = job.nodes[1]
    pids = trainers(job, victim)
    assert len(pids) == 1
    job.exec(victim, ["kill", "-9", str(pids[0])])
    survivors = [job.nodes[0], job.nodes[2]]
    # Fail-fast is shown by behaviour, not by a stopwatch: each survivor's own collective raises (the dead peer's
    # connection closed, or the job's short collective timeout) and torchrun records that error for its rank. A
    # job without fail-fast sits in the collective until the 30-minute watchdog, far past this liveness limit.
    assert wait_until(lambda: all(not trainers(job, n) for n in survivors), 600, step=2), \
        {n: log_of(job, n)[-2000:] for n in survivors}
    # every node's launcher has written its exit record and ended (status reads "running" until then)
    tokens = {n: state_of(job, n)["token"] for n in job.nodes}
    assert wait_until(lambda: all(not token_holders(job, n, tokens[n]) for n in job.nodes), 120, step=1), \
        {n: token_holders(job, n, tokens[n]) for n in job.nodes}
    for node in survivors:
        log = log_of(job, node)
        # Either the survivor's own collective failed first (torchrun's report of its rank's communication error),
        # or the product's fail-fast watcher stopped it and its launcher said why (module_utils/failfast.py).
        if "stopped because node rank 1 failed: rank 1 (local rank 0), exit code -9 (SIGKILL)" in log:
            continue
        assert "ChildFailedError" in log, log[-3000:]
        assert COMM_ERROR.search(log.split("ChildFailedError", 1)[1]), log[-3000:]
    r = status_play(job)
    assert r.returncode != 0  # the status play fails when a rank died
    assert f"first failure: node {victim} (node rank 1), rank 1 (local rank 0), exit code -9 (SIGKILL)" in r.stdout, \
        r.stdout[-4000:]
    for node in job.nodes:
        assert re.search(rf"{node}\s+rank \d\s+failed", r.stdout), r.stdout.split("Show the job on every node")[1][:3000]


def test_relaunch_resumes_from_the_last_complete_checkpoint(job):
    ckpt = latest_complete(job)
    assert ckpt >= 5
    r, recap = play(job, "-e", "test_launch_prepare=false", *EXTRA)
    assert r.returncode == 0, r.stdout[-4000:]
    assert f"resume from {OUT}/checkpoint-{ckpt}," in r.stdout
    line = f"trainyard: resumed from {OUT}/checkpoint-{ckpt} at step {ckpt}"
    assert wait_until(lambda: line in log_of(job, job.head), 300), log_of(job, job.head)[-2000:]
    for node in job.nodes:
        assert wait_until(lambda: f"first step done step={ckpt + 1}" in log_of(job, node), 300), \
            log_of(job, node)[-2000:]
        assert state_of(job, node)["resume_from"] == f"{OUT}/checkpoint-{ckpt}"


def test_stop_leaves_no_process_of_the_job_and_spares_a_decoy(job):
    tokens = {n: state_of(job, n)["token"] for n in job.nodes}
    decoys = {}
    decoy = f"/root/decoy-{uuid.uuid4().hex[:8]}/torchrun"
    for node in job.nodes:
        job.exec(node, ["sh", "-c", 'mkdir -p "${0%/*}" && cp /bin/sleep "$0"', decoy])
        job.exec(node, [decoy, "900"], detach=True)
        decoys[node] = wait_until(lambda: [p for p, _, a in ps(job, node) if a == f"{decoy} 900"], 10)
        assert decoys[node]
    try:
        r, recap = play(job, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
        assert r.returncode == 0, r.stdout[-3000:]
        for node in job.nodes:
            assert recap[node]["changed"] >= 1
            assert token_holders(job, node, tokens[node]) == []
            assert not any("ddp_train.py" in a or "launcher.py" in a for _, _, a in ps(job, node))
            assert state_of(job, node) is None
            assert [p for p, _, a in ps(job, node) if a == f"{decoy} 900"] == decoys[node]
        r, recap = play(job, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
        assert r.returncode == 0 and all(recap[n]["changed"] == 0 for n in job.nodes)
    finally:
        for node in job.nodes:
            for pid in decoys.get(node) or []:
                job.exec(node, ["kill", str(pid)], check=False)


def test_status_after_stop_reports_no_job(job):
    r = status_play(job)
    assert r.returncode == 0, r.stdout[-3000:]
    for node in job.nodes:
        assert re.search(rf"{node}\s+rank -\s+absent", r.stdout)
