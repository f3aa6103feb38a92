"""Fail fast across the cluster, two ranks per node (CPU/gloo, the simulated inventory's defaults plus
-e cluster_nproc_per_node=2): kill -9 of one rank on node 1 while every rank sits in a long compute phase (a
120 s step sleep: no collective is in flight, so no survivor can notice the dead peer by itself, as NCCL ranks
in their error path or in a long forward pass do not). The product stops every other node's processes of the job
within 15 s of the death (module_utils/failfast.py: the launchers share the head's torchrun store), status.yml
names the killed rank and says why each other node ended.

Runs tests/integration/playbooks/launch.yml (the launch role in each node's training container) and
playbooks/status.yml on the shared simulated cluster (TY_SIM_NAME).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from helpers import parse_recap, wait_until

PLAYBOOK = "tests/integration/playbooks/launch.yml"
STATE = "/var/lib/trainyard/train"
ARGV = ["--steps", "3", "--save-every", "0", "--sleep", "120", "--output-root", "/srv/outputs"]
SHAPE = ["-e", "cluster_nproc_per_node=2",
         "-e", json.dumps({"launch_example_argv": ARGV, "launch_wait_for": "first_step", "launch_wait_timeout": 600})]


def job_pids(cluster, node, token) -> dict[int, dict]:
    """{pid: {RANK, LOCAL_RANK, cmd}} of every live process on the node that carries the launch's token."""
    script = ("import os, json\nout = {}\nfor p in os.listdir('/proc'):\n  if not p.isdigit(): continue\n  try:\n"
              "    e = dict(x.split(b'=', 1) for x in open('/proc/%s/environ' % p, 'rb').read().split(b'\\0') "
              "if b'=' in x)\n    st = open('/proc/%s/stat' % p).read().rsplit(')', 1)[1].split()[0]\n"
              "    cmd = open('/proc/%s/cmdline' % p, 'rb').read().replace(b'\\0', b' ').decode()[:200]\n"
              "  except OSError: continue\n"
              f"  if e.get(b'TRAINYARD_LAUNCH_ID') == b'{token}' and st != 'Z':\n"
              "    out[p] = {'RANK': e.get(b'RANK', b'').decode(), 'LOCAL_RANK': e.get(b'LOCAL_RANK', b'').decode(),"
              " 'cmd': cmd}\nprint(json.dumps(out))\n")
    r = cluster.exec(node, ["python3", "-c", script], check=False)
    return {int(k): v for k, v in json.loads(r.stdout or "{}").items()}


def launch_state(cluster, node) -> dict:
    return json.loads(cluster.exec(node, ["cat", f"{STATE}/launch.json"]).stdout)


def exit_record(cluster, node) -> dict:
    r = cluster.exec(node, ["cat", f"{STATE}/job-rw/launch.exit.json"], check=False)
    return json.loads(r.stdout) if r.returncode == 0 else {}


@pytest.fixture(scope="module")
def job(cluster):
    r = cluster.playbook(PLAYBOOK, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
    assert r.returncode == 0, r.stdout[-3000:]
    for node in cluster.nodes:  # an earlier test's checkpoints would resume this job past its 3 steps
        cluster.exec(node, ["sh", "-c", "rm -rf /srv/outputs/checkpoint-*"])
    r = cluster.playbook(PLAYBOOK, *SHAPE)
    assert r.returncode == 0, r.stdout[-4000:]
    recap = parse_recap(r.stdout)
    assert all(recap[n]["failed"] == 0 for n in cluster.nodes)
    yield cluster
    cluster.playbook(PLAYBOOK, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")


def test_killing_one_rank_stops_every_other_nodes_job_within_15_s_and_status_says_why(job):
    tokens = {n: launch_state(job, n)["token"] for n in job.nodes}
    procs = {n: job_pids(job, n, tokens[n]) for n in job.nodes}
    ranks = {n: sorted(v["RANK"] for v in procs[n].values() if v["RANK"]) for n in job.nodes}
    assert [len(ranks[n]) for n in job.nodes] == [2, 2, 2], ranks  # two ranks on every node
    victim_node = job.nodes[1]
    victim = next(p for p, v in procs[victim_node].items() if v["RANK"] == "3" and "ddp_train.py" in v["cmd"]
                  and "torchrun" not in v["cmd"])
    survivors = [job.nodes[0], job.nodes[2]]
    assert all(procs[n] for n in survivors)
    job.exec(victim_node, ["kill", "-9", str(victim)])
    killed_at = time.monotonic()
    gone = wait_until(lambda: all(not job_pids(job, n, tokens[n]) for n in job.nodes), 60, step=0.5)
    took = time.monotonic() - killed_at
    left = {n: job_pids(job, n, tokens[n]) for n in job.nodes}
    assert gone, f"processes of the job still alive {took:.0f} s after the kill: {left}"
    # Each step sleeps 120 s: without the product's fail-fast the survivors would sit there for up to two minutes.
    assert took <= 15, f"the other nodes' processes took {took:.1f} s to end (limit 15 s)"

    reason = "stopped because node rank 1 failed: rank 3 (local rank 1), exit code -9 (SIGKILL)"
    for node in survivors:
        rec = exit_record(job, node)
        assert rec.get("peer_stop", {}).get("reason") == reason, rec
    assert exit_record(job, victim_node).get("failfast", {}).get("published") is True

    r = job.playbook("playbooks/status.yml")
    assert r.returncode != 0  # the status play fails when a rank died
    assert f"first failure: node {victim_node} (node rank 1), rank 3 (local rank 1), exit code -9 (SIGKILL)" \
        in r.stdout, r.stdout[-4000:]
    for node in survivors:
        assert re.search(rf"{node}\s+rank \d\s+failed\s+{re.escape(reason)}", r.stdout), r.stdout[-4000:]
