"""launch_backend slurm on a 3-node simulated cluster with a real Slurm (simcluster.py up --slurm: slurmctld on the
head, slurmd and munge on every node, Debian's Slurm 22.05).

In order, on one cluster: another user's Slurm job (a decoy, `sbatch --wrap "sleep 600"` as SLURM_OTHER_USER) is
submitted first → a node Slurm does not know stops site.yml before any host changes → site.yml runs every check and render, then submits the job: Slurm runs it on the 3 nodes and every
rank trains its first steps → a killed rank is named by status.yml and the job ends in Slurm → relaunch (the launch
play) resumes from the last complete checkpoint as a new Slurm job → export.yml writes the hand-off, its prolog passes on a
proven node and names a drifted MTU → reset.yml cancels this job only: the decoy
still runs, no process of the job is left on any node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from helpers import REPO, SimCluster, run_dir_of, sim_down, sim_up, wait_until
from test_launch import latest_complete  # the head's newest checkpoint with its trainer_state.json

STATE = "/var/lib/trainyard/train"
LOG = f"{STATE}/job-rw/torchrun.log"
OUT = "/srv/outputs"
# The example's options through the render play (role train_args), as a user sets them.
OPTIONS = {"--steps": 5000, "--save-every": 5, "--sleep": 0.3, "--output-root": OUT}
EXTRA = ["-e", "launch_backend=slurm", "-e", json.dumps({"train_args_options": OPTIONS, "launch_wait_for": "first_step",
                                                         "launch_wait_timeout": 600})]
# The launch play alone (site.yml --tags launch) has no render play: the same example arguments and the nccl.env the
# first run rendered on the nodes.
RELAUNCH = [*EXTRA, "-e", json.dumps({"launch_example_argv": ["--steps", "5000", "--save-every", "5", "--sleep", "0.3",
                                                               "--output-root", OUT],
                                      "launch_env_files": [f"{STATE}/job-ro/nccl.env"]})]


@pytest.fixture(scope="module")
def cluster():
    name = os.environ.get("TY_SIM_PREFIX", "") + "slurm"
    if os.environ.get("TY_SIM_REUSE") == "1" and (REPO / ".sim" / name / "cluster.json").exists():
        yield SimCluster(name)
        return
    c = sim_up(name, 3, slurm=True)
    try:
        yield c
    finally:
        sim_down(name)


def sq(cluster, *args) -> str:
    return cluster.exec(cluster.head, ["squeue", "-h", *args]).stdout


def job_state(cluster, job_id) -> str:
    out = cluster.exec(cluster.head, ["scontrol", "show", "job", "-o", job_id], check=False).stdout
    m = re.search(r"\bJobState=(\S+)", out)
    return m.group(1) if m else ""


def record(cluster) -> dict | None:
    r = cluster.exec(cluster.head, ["cat", f"{STATE}/slurm.json"], check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def log_of(cluster, node) -> str:
    return cluster.exec(node, ["cat", LOG], check=False).stdout


def ranks(cluster, node) -> list[int]:
    """PIDs of the example's rank processes on the node (python running ddp_train.py, not torchrun)."""
    out = cluster.exec(node, ["ps", "-eo", "pid=,args="]).stdout
    return [int(line.split(None, 1)[0]) for line in out.splitlines()
            if "ddp_train.py" in line and "torchrun" not in line and "docker exec" not in line
            and "slurm_node.py" not in line]


@pytest.fixture(scope="module")
def decoy(cluster):
    """Another user's Slurm job on the head node, submitted before the product's job (an hour long: site.yml on a
    busy 2-core machine takes minutes)."""
    user = cluster.meta["slurm_other_user"]
    r = cluster.exec(cluster.head, ["runuser", "-u", user, "--", "sbatch", "--parsable", f"--chdir=/home/{user}",
                                    f"--nodelist={cluster.head}", "--job-name=not-trainyard", "--wrap", "sleep 3600"])
    job_id = r.stdout.strip().split(";")[0]
    assert wait_until(lambda: job_state(cluster, job_id) == "RUNNING", 60), job_state(cluster, job_id)
    yield job_id
    cluster.exec(cluster.head, ["scancel", job_id], check=False)


def test_a_node_slurm_does_not_know_stops_the_run_before_any_host_changes(cluster):
    names = {"launch_slurm_node_names": {cluster.nodes[2]: "gpu-999"}}
    r = cluster.playbook("site.yml", "-e", "launch_backend=slurm", "-e", json.dumps(names))
    assert r.returncode != 0
    assert (f"Stop if launch_backend is slurm and Slurm (sinfo on {cluster.head}) does not know the node(s) gpu-999"
            in r.stdout), r.stdout[-3000:]
    assert "Take the cluster lock" not in r.stdout  # stopped in the validate play: nothing on a node changed
    r = cluster.playbook("site.yml", "-e", "launch_backend=slurm", "-e", "launch_runtime=host")
    assert r.returncode != 0 and "Stop if launch_backend is slurm while launch_runtime is not docker" in r.stdout
    assert "Ask sbatch for its version" not in r.stdout  # the inventory rule stops it before any host is contacted


def test_site_submits_the_job_and_it_trains_across_three_nodes(cluster, decoy):
    r = cluster.playbook("site.yml", *EXTRA, timeout=1500)
    assert r.returncode == 0, r.stdout[-5000:]
    rec = record(cluster)
    assert rec and rec["nodes"] == cluster.nodes and rec["exclude"] == [], rec
    assert f"Slurm job {rec['job_id']} " in r.stdout
    assert job_state(cluster, rec["job_id"]) == "RUNNING"
    assert sq(cluster, "-j", rec["job_id"], "-o", "%N %D").split()[1] == "3"
    for rank, node in enumerate(cluster.nodes):
        log = log_of(cluster, node)
        assert f"trainyard: slurm job {rec['job_id']} step 0 on {node}, node rank {rank}" in log, log[-2000:]
        assert f"trainyard: rendezvous done rank={rank} world=3" in log, log[-2000:]
        assert "trainyard: first step done" in log, log[-2000:]
    assert job_state(cluster, decoy) == "RUNNING"


def test_status_reports_every_node_running(cluster):
    r = cluster.playbook("playbooks/status.yml", "-e", "launch_backend=slurm")
    assert r.returncode == 0, r.stdout[-4000:]
    for rank, node in enumerate(cluster.nodes):
        assert re.search(rf"{node}\s+rank {rank}\s+running", r.stdout), r.stdout[-4000:]


def test_a_killed_rank_is_named_and_the_slurm_job_ends(cluster):
    job_id = record(cluster)["job_id"]
    assert wait_until(lambda: latest_complete(cluster) >= 5, 300), log_of(cluster, cluster.head)[-2000:]
    victim = cluster.nodes[1]
    pids = ranks(cluster, victim)
    assert len(pids) == 1, pids
    cluster.exec(victim, ["kill", "-9", str(pids[0])])
    assert wait_until(lambda: job_state(cluster, job_id) not in ("RUNNING", "COMPLETING", ""), 300), \
        job_state(cluster, job_id)
    assert job_state(cluster, job_id) == "FAILED"
    # the other nodes' tasks ended their ranks in the container (by the job's token) when Slurm ended the step
    assert wait_until(lambda: not any(ranks(cluster, n) for n in cluster.nodes), 120), \
        {n: ranks(cluster, n) for n in cluster.nodes}
    r = cluster.playbook("playbooks/status.yml", "-e", "launch_backend=slurm")
    assert r.returncode != 0
    assert f"first failure: node {victim} (node rank 1), rank 1 (local rank 0), exit code -9 (SIGKILL)" in r.stdout, \
        r.stdout[-4000:]


def jobs_of_this_user(cluster) -> list[str]:
    return sorted(sq(cluster, "-u", "root", "-o", "%i").split())


def test_relaunch_resumes_from_the_last_complete_checkpoint_as_a_new_slurm_job(cluster, decoy):
    # Sharded (docs/sharding.md): the nodes run in two ansible-playbook processes (nodes 1-2 and 3); only the shard
    # that runs the head submits, once every shard's nodes wrote their task, and the other waits on that job.
    old = record(cluster)["job_id"]
    ckpt = latest_complete(cluster)
    assert ckpt >= 5
    r = cluster.playbook("site.yml", *RELAUNCH, "-e", "cluster_shard_nodes=2", "-e", "cluster_shard_max=2",
                         timeout=1800)
    assert r.returncode == 0, r.stdout[-5000:]
    new = record(cluster)["job_id"]
    assert new != old and job_state(cluster, new) == "RUNNING"
    assert set(jobs_of_this_user(cluster)) - {old} == {new}, "one new job: the second shard submitted none"
    logs = [(run_dir_of(r.stdout) / "shards" / f"{i}.log").read_text() for i in (0, 1)]
    assert f"resume from {OUT}/checkpoint-{ckpt}," in logs[0], logs[0][-3000:]
    for log in logs:  # each shard's nodes wait on the one job
        assert f"Slurm job {new} " in log, log[-3000:]
    # Only the head's shard submits (two shards racing past slurm_job's record check would submit twice).
    submit = [log.split("TASK [launch : Submit the job to Slurm from the head", 1)[1].split("TASK [", 1)[0] for log in logs]
    assert re.search(r"^changed: ", submit[0], re.M) and not re.search(r"^(ok|changed): ", submit[1], re.M), submit
    assert re.search(r"^skipping: ", submit[1], re.M), submit[1]
    line = f"trainyard: resumed from {OUT}/checkpoint-{ckpt} at step {ckpt}"
    assert wait_until(lambda: line in log_of(cluster, cluster.head), 300), log_of(cluster, cluster.head)[-2000:]
    for node in cluster.nodes:
        assert wait_until(lambda: f"first step done step={ckpt + 1}" in log_of(cluster, node), 300), \
            log_of(cluster, node)[-2000:]
    assert job_state(cluster, decoy) == "RUNNING"


def test_export_writes_the_hand_off_and_the_prolog_passes_on_a_proven_node(cluster, tmp_path):
    r = cluster.playbook("playbooks/export.yml", "-e", f"export_dir={tmp_path}", "-e", "launch_backend=slurm")
    assert r.returncode == 0, r.stdout[-3000:]
    script = (tmp_path / "sbatch-train.sh").read_text()
    assert subprocess.run(["bash", "-n", str(tmp_path / "sbatch-train.sh")]).returncode == 0
    assert f"#SBATCH --nodelist={','.join(cluster.nodes)}" in script and "export NCCL_SOCKET_IFNAME=eth1" in script
    health = json.loads((tmp_path / "trainyard-health.json").read_text())
    for node in cluster.nodes:
        pinned = health["nodes"][node]
        assert pinned["gpu_count"] == 4 and pinned["data_iface"] == "eth1" and pinned["data_mtu"] == 9000, pinned
        assert pinned["driver_version"] and pinned["fabricmanager_version"], pinned
    head = cluster.head
    for f in ("trainyard-prolog.py", "trainyard-health.json"):
        subprocess.run(["docker", "cp", str(tmp_path / f), f"{head}:/etc/slurm/{f}"], check=True)
    ok = cluster.exec(head, ["env", f"SLURMD_NODENAME={head}", "python3", "/etc/slurm/trainyard-prolog.py"], check=False)
    assert ok.returncode == 0, ok.stderr
    cluster.exec(head, ["ip", "link", "set", "eth1", "mtu", "1500"])
    try:
        bad = cluster.exec(head, ["env", f"SLURMD_NODENAME={head}", "python3", "/etc/slurm/trainyard-prolog.py"],
                           check=False)
        assert bad.returncode == 1 and "data_mtu on eth1 is 1500, the run proved 9000" in bad.stderr, bad.stderr
    finally:
        cluster.exec(head, ["ip", "link", "set", "eth1", "mtu", "9000"])


def test_reset_cancels_this_job_only(cluster, decoy):
    job_id = record(cluster)["job_id"]
    r = cluster.playbook("reset.yml", "-e", "reset_confirm=true", "-e", "launch_backend=slurm")
    assert r.returncode == 0, r.stdout[-4000:]
    assert job_state(cluster, job_id) == "CANCELLED", job_state(cluster, job_id)
    assert job_state(cluster, decoy) == "RUNNING"
    assert sq(cluster, "-o", "%i").split() == [decoy]
    for node in cluster.nodes:
        assert ranks(cluster, node) == [], node
        ps = cluster.exec(node, ["ps", "-eo", "args="]).stdout
        assert "torchrun --nnodes" not in ps and "slurm_node.py" not in ps, ps
    assert record(cluster) is None  # the record goes with the job: the next reset has nothing to cancel
    r = cluster.playbook("reset.yml", "-e", "reset_confirm=true", "-e", "launch_backend=slurm")
    assert r.returncode == 0 and job_state(cluster, decoy) == "RUNNING", r.stdout[-3000:]
