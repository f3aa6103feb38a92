"""A sharded run (docs/sharding.md) on the simulated cluster: site.yml with cluster_shard_nodes 2 runs its node plays in
two child ansible-playbook processes (nodes 1-2 and 3), every cross-node step exchanging its values between them.

* converged, it gives the same report (check ids and statuses) as one process, changes nothing, and the job runs on
  every node with its rank;
* a failing check on a node of the second shard fails the run in every shard: the parent prints the node and the
  fix as the child prints them, and the one report (written once) names it;
* a node of the second shard that fails in the launch play keeps every node of the first from starting the job
  (the barrier before torchrun).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import parse_recap, report_of

SHARDED = ["-e", "cluster_shard_nodes=2", "-e", "cluster_shard_max=2"]
STATE = "/var/lib/trainyard/train/launch.json"


def statuses(report: dict) -> dict:
    return {(x["host"], x["check"]): x["status"] for x in report["records"]}


def child_recaps(out: str) -> dict:
    """The children's PLAY RECAP lines, relayed by the parent with their shard."""
    return parse_recap("\n".join(re.sub(r"^\[shard \d+\] ", "", ln) for ln in out.splitlines()
                                 if ln.startswith("[shard ") and " : ok=" in ln))


def test_a_sharded_run_gives_the_one_process_report_and_launches_every_rank(cluster):
    # No job of an earlier test: whether a job trains changes some verdicts (nccl_check skips a busy cluster).
    reset = cluster.playbook("reset.yml", "-e", "reset_confirm=true")
    assert reset.returncode == 0, reset.stdout[-4000:]
    one = cluster.playbook("site.yml", "--skip-tags", "launch")
    assert one.returncode == 0, one.stdout[-4000:]
    r = cluster.playbook("site.yml", "--skip-tags", "launch", *SHARDED)
    out = r.stdout
    assert r.returncode == 0, out[-4000:]
    assert f"shard 0/2: 2 node(s) {cluster.nodes[0]}..{cluster.nodes[1]}" in out
    assert f"shard 1/2: 1 node(s) {cluster.nodes[2]}..{cluster.nodes[2]}" in out
    # Every node ran in exactly one child, converged; the parent's own node plays selected no node.
    recaps = child_recaps(out)
    assert set(cluster.nodes) <= set(recaps), recaps
    assert all(recaps[n]["changed"] == 0 and recaps[n]["failed"] == 0 for n in cluster.nodes), recaps
    assert "PLAY [Prepare the nodes]" in out and "skipping: no hosts matched" in out
    # The same checks with the same verdicts as one process, in one report written once.
    report = report_of(out)
    assert statuses(report) == statuses(report_of(one.stdout))
    assert report["hosts"] == cluster.nodes
    # Every node's cluster model in the report, though each child set it on its own nodes and the head only.
    assert report["cluster_model"] == report_of(one.stdout)["cluster_model"]
    assert sorted(report["cluster_model"]) == sorted(cluster.nodes)
    second = open(f"{report['run_dir']}/shards/1.log", encoding="utf-8").read()
    model_task = second.split("Set the cluster model on every trainer of this process", 1)[1].split("TASK [", 1)[0]
    assert sorted(re.findall(r"\(item=(\S+) rank", model_task)) == sorted([cluster.nodes[0], cluster.nodes[2]]), model_task
    for i in (0, 1):
        assert "PLAY RECAP" in open(f"{report['run_dir']}/shards/{i}.log", encoding="utf-8").read()
    # The launch: the job starts on every node, each with its rank.
    launched = cluster.playbook("site.yml", *SHARDED)
    assert launched.returncode == 0, launched.stdout[-4000:]
    for rank, node in enumerate(cluster.nodes):
        state = json.loads(cluster.exec(node, ["cat", STATE]).stdout)
        assert int(state["node_rank"]) == rank, state


def test_a_failing_check_in_one_shard_fails_every_shard_and_names_the_node(cluster):
    node = cluster.nodes[2]  # shard 1
    cluster.exec(node, ["mount", "-o", "remount,size=64m", "/dev/shm"])
    try:
        r = cluster.playbook("site.yml", *SHARDED)
    finally:
        cluster.exec(node, ["mount", "-o", "remount,size=512m", "/dev/shm"])
    out = r.stdout
    assert r.returncode != 0, out[-4000:]
    # The node and the fix, as the children print them, in the parent's output.
    assert re.search(rf"\[shard \d\] .*{node}: cluster\.shm FAIL: /dev/shm 64 MiB", out), out[-4000:]
    assert "The run failed in 2 of 2 shard(s)" in out
    report = report_of(out)
    assert statuses(report)[(node, "cluster.shm")] == "fail"
    assert all(statuses(report)[(n, "cluster.shm")] == "pass" for n in cluster.nodes[:2])
    # No child went on to the launch.
    assert "Start torchrun" not in out


def test_a_node_failing_in_the_launch_play_keeps_every_shard_from_launching(cluster):
    # shard 1: a secret name that only the launch role's own checks on the node refuse (the validate play takes any
    # mapping), so the node fails in the launch play, after the report passed on every node.
    node = cluster.nodes[2]
    host_vars = Path(cluster.inventory) / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / f"{node}.yml").write_text('launch_secret_env: {"BAD-NAME": "x"}\n')
    before = {n: cluster.exec(n, ["cat", STATE], check=False).stdout for n in cluster.nodes}
    try:
        # A new command (another job variable) would relaunch on every node: the barrier must stop all of them.
        r = cluster.playbook("site.yml", *SHARDED, "-e", json.dumps({"launch_env": {"TY_SHARD_TEST": "1"}}))
    finally:
        (host_vars / f"{node}.yml").unlink()
    out = r.stdout
    assert r.returncode != 0, out[-4000:]
    assert f"{node}: launch_secret_env must map variable names" in out, out[-4000:]
    assert re.search(rf"\[shard 0\] .*Not launching: {node} failed or did not get here", out), out[-4000:]
    # No node (the first shard's included) started the job anew.
    after = {n: cluster.exec(n, ["cat", STATE], check=False).stdout for n in cluster.nodes}
    assert after == before


def test_a_shard_whose_every_node_is_left_out_does_not_hold_the_others(cluster, tmp_path):
    # cluster_node_failure_policy exclude: node3, the whole of shard 1, fails a check and is left out. Shard 1 then runs
    # no node play: the node steps of shard 0 must not wait for it (here 120 s, then a failure naming shard 1), and
    # the report, which every child runs, still has node3's records and the exclusion. The job starts on the two
    # kept nodes with ranks 0 and 1 of 2.
    node = cluster.nodes[2]
    reset = cluster.playbook("reset.yml", "-e", "reset_confirm=true")
    assert reset.returncode == 0, reset.stdout[-4000:]
    run_dir = ["-e", f"cluster_run_dir={tmp_path}/runs/1"]
    cluster.exec(node, ["mount", "-o", "remount,size=64m", "/dev/shm"])
    try:
        r = cluster.playbook("site.yml", *SHARDED, *run_dir, "-e", "cluster_node_failure_policy=exclude",
                             "-e", "cluster_shard_wait_s=120")
    finally:
        cluster.exec(node, ["mount", "-o", "remount,size=512m", "/dev/shm"])
    out = r.stdout
    try:
        assert r.returncode == 0, out[-4000:]
        assert "did not reach it within" not in out
        report = report_of(out)
        assert statuses(report)[(node, "cluster.shm")] == "fail"
        assert [e["host"] for e in report["exclusion"]["excluded"]] == [node]
        assert sorted(report["cluster_model"]) == sorted(cluster.nodes)
        retired = json.loads((tmp_path / "runs/1/shards/retired/1.json").read_text())
        assert "left out" in retired["reason"]
        assert not (tmp_path / "runs/1/shards/retired/0.json").exists()
        for rank, n in enumerate(cluster.nodes[:2]):
            cmd = json.loads(cluster.exec(n, ["cat", STATE]).stdout)["command"]
            assert "--nnodes=2" in cmd and f"--node_rank={rank}" in cmd, cmd
        assert "--nnodes=2" not in cluster.exec(node, ["cat", STATE], check=False).stdout  # not launched there
    finally:
        reset = cluster.playbook("reset.yml", "-e", "reset_confirm=true")
        assert reset.returncode == 0, reset.stdout[-4000:]
