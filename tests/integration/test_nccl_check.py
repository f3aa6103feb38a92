"""The NCCL check (playbooks/nccl_check.yml) on the simulated cluster: a real all-reduce over gloo between the
nodes' training containers on the data network; every node records the cluster's figure, a floor above it fails
every node with the floor named; a link slowed for real (tc tbf on one node's data interface) is named by the
bisection, with its numbers; and a cluster without containers (container_enabled false) records the container role
as skipped and runs nothing of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PLAYBOOK = "playbooks/nccl_check.yml"


def records(run_dir: Path, check: str) -> dict:
    report = json.loads((run_dir / "report.json").read_text())
    return {r["host"]: r for r in report["records"] if r["check"] == check}


@pytest.fixture(scope="module")
def containers(cluster):
    """The training container on every node (the check runs torch inside it)."""
    r = cluster.playbook("site.yml", "--tags", "container")
    assert r.returncode == 0, r.stdout[-3000:]
    return cluster


def test_every_node_records_the_same_inter_node_figure(containers, tmp_path):
    r = containers.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}")
    assert r.returncode == 0, r.stdout[-4000:]
    inter = records(tmp_path, "nccl_check.inter_node")
    assert set(inter) == set(containers.nodes)
    figures = {h: rec["data"]["busbw_gbps"] for h, rec in inter.items()}
    assert all(rec["status"] == "pass" for rec in inter.values()), inter
    assert len(set(figures.values())) == 1 and float(next(iter(figures.values()))) > 0, figures
    n = len(containers.nodes)
    assert all(f"(gloo, {n} ranks on {n} nodes" in rec["detail"] for rec in inter.values()), inter
    intra = records(tmp_path, "nccl_check.intra_node")
    assert all(rec["status"] == "skip" for rec in intra.values())  # one process per simulated node
    # The playbook reads the GPU facts the intra-node expectation needs (site.yml's nvidia_driver role does it there):
    # the stand-in nvidia-smi answers on every node.
    task = r.stdout.split("TASK [Keep the GPU facts where nvidia-smi answered]", 1)[1].split("TASK [", 1)[0]
    assert all(f"ok: [{n}]" in task for n in containers.nodes), task


def test_the_built_in_gpu_stress_skips_on_the_cpu_sim_with_the_reason(containers, tmp_path):
    """Burn-in tier standard without dcgmi (docs/burn-in.md): gpu_stress.py runs in every node's training container,
    finds no CUDA device and the record is a skip naming that, never a pass."""
    r = containers.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}", "-e", "cluster_burnin_tier=standard")
    assert r.returncode == 0, r.stdout[-4000:]
    stress = records(tmp_path, "nccl_check.gpu_stress")
    assert set(stress) == set(containers.nodes), stress
    for host, rec in stress.items():
        assert rec["status"] == "skip", rec
        assert f"built-in GPU stress (burn-in tier standard) not run on {host}: no CUDA device visible to torch" \
            in rec["detail"], rec
    assert "nccl_check.gpu_stress" not in json.dumps(records(tmp_path, "nccl_check.inter_node"))


def test_a_floor_above_the_figure_fails_every_node_naming_it(containers, tmp_path):
    r = containers.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}", "-e", "nccl_check_min_inter_busbw_gbps=1000")
    assert r.returncode != 0
    inter = records(tmp_path, "nccl_check.inter_node")
    assert {h: rec["status"] for h, rec in inter.items()} == {h: "fail" for h in containers.nodes}
    for rec in inter.values():
        assert "floor 1000" in rec["detail"] and "nccl_check_min_inter_busbw_gbps" in rec["fix"]


def test_a_slowed_node_is_named_by_the_bisection(containers, tmp_path):
    """The last node's data interface sends at 8 Mbit/s (tc tbf in its network namespace, the sim node being a
    container): the cluster's all-reduce falls below the floor, and the bisection's rounds name that node, with the
    pairs' figures, while the others pass naming it."""
    slow = containers.nodes[-1]
    containers.exec(slow, ["tc", "qdisc", "replace", "dev", "eth1", "root", "tbf", "rate", "8mbit", "burst", "64kb",
                           "latency", "400ms"])
    try:
        r = containers.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}", "-e", json.dumps({
            "nccl_check_sizes": [0.25, 1], "nccl_check_iters": 5, "nccl_check_warmup": 1,
            "nccl_check_bisect_size_mb": 1, "nccl_check_bisect_iters": 3,
            "nccl_check_min_inter_busbw_gbps": 0.005}))
    finally:
        containers.exec(slow, ["tc", "qdisc", "del", "dev", "eth1", "root"], check=False)
    assert r.returncode != 0
    inter = records(tmp_path, "nccl_check.inter_node")
    assert {rec["status"] for rec in inter.values()} == {"fail"}, inter
    assert "the largest of 2 sizes from 0.25 MiB" in inter[slow]["detail"], inter[slow]["detail"]
    assert "no expectation for eth1 (virtual)" in inter[slow]["detail"], inter[slow]["detail"]
    bisect = records(tmp_path, "nccl_check.bisect")
    assert bisect[slow]["status"] == "fail", bisect
    assert bisect[slow]["detail"].startswith(f"{slow} is slow: "), bisect[slow]["detail"]
    assert "a node measured fine" in bisect[slow]["detail"] and "(below 0.005 GB/s)" in bisect[slow]["detail"]
    for node in containers.nodes[:-1]:
        assert bisect[node]["status"] == "pass", bisect[node]
        assert f"the bisection named: {slow} is slow" in bisect[node]["detail"]
    pairs = bisect[slow]["data"]["pairwise"]["allreduce_pair_busbw_gbps"]
    assert pairs and all(0 < v < 0.005 for v in pairs.values()), pairs
    fine = [v for k, v in bisect[slow]["data"]["groups"].items() if slow not in k.split(",")]
    assert fine and all(v >= 0.005 for v in fine), bisect[slow]["data"]["groups"]
    page = (tmp_path / "health.html").read_text()
    assert 'id="allreduce-findings"' in page and f"{slow} is slow" in page


def test_container_role_off_runs_nothing_of_it(cluster, tmp_path):
    r = cluster.playbook("playbooks/preflight.yml", "-e", f"cluster_run_dir={tmp_path}",
                         "-e", "container_enabled=false", "-e", "launch_runtime=host")
    report = json.loads((tmp_path / "report.json").read_text())
    ctr = {(x["host"], x["check"]): x for x in report["records"] if x["check"].startswith("container.")}
    assert set(ctr) == {(h, "container.enabled") for h in cluster.nodes}, sorted(ctr)
    assert all(x["status"] == "skip" and "launch_runtime: host" in x["detail"] for x in ctr.values())
    ran = {}
    for block in r.stdout.split("\nTASK [")[1:]:
        title, _, body = block.partition("]")
        if title.startswith("container : "):
            results = [ln.split(":")[0] for ln in body.splitlines() if ln.startswith(("ok:", "changed:", "fatal:"))]
            if results:
                ran[title] = results
    # One task for the cluster (run_once), a record naming each node above.
    assert ran == {"container : Record that the container role is switched off (once, on every node where it is)":
                   ["ok"]}, ran


def test_container_off_with_the_docker_runtime_stops_before_any_host(cluster, tmp_path):
    r = cluster.playbook("site.yml", "-e", f"cluster_run_dir={tmp_path}", "-e", "container_enabled=false")
    assert r.returncode != 0
    assert "Stop if container_enabled is false while launch_runtime is docker" in r.stdout
    assert "PLAY [Prepare the nodes]" not in r.stdout  # stopped in the validation play
