"""Burn-in on the simulated cluster (docs/burn-in.md): the PCIe link check against the stand-in nvidia-smi's pcie=
fault, and the node failure policy: a node with a stand-in GPU fault is left out (exclude), the others re-ranked,
the machine written to <runs dir>/bad_machines.json and left out (or warned about) on the next run until cleared.

tests/integration/playbooks/exclude.yml runs validation, the nvidia_driver checks, playbooks/exclude.yml, a play
on the kept nodes and the report; test_site_launches_on_the_kept_nodes runs site.yml itself.
"""

from __future__ import annotations

import json
import re

import pytest

from test_gpu import clear_fault, records, report, set_fault

PLAYBOOK = "tests/integration/playbooks/exclude.yml"
# A link that trained at half its width on GPU 1 (stand-in fault, tests/sim/standin/README.md).
FAULT = "pcie=x8@1"


@pytest.fixture
def bad(cluster):
    """The last node, with the GPU fault; its fault file is removed afterwards whatever happens."""
    node = cluster.nodes[-1]
    set_fault(cluster, node, FAULT)
    yield node
    clear_fault(cluster, node)


def kept(stdout: str) -> list[tuple[str, int, int]]:
    return sorted((m[0], int(m[1]), int(m[2])) for m in re.findall(r"kept (\S+) rank (\d+) of (\d+)", stdout))


def test_pcie_link_fault_fails_naming_the_gpu(cluster, bad, tmp_path):
    r = cluster.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}/runs/1")
    assert r.returncode != 0, r.stdout[-3000:]
    failed = records(tmp_path / "runs/1", status="fail")
    assert {h for h, _ in failed} == {bad}, sorted(failed)
    rec = failed[(bad, "nvidia_driver.pcie_link")]
    assert re.search(r"GPU 1 \(0000:00:07\).*PCIe Gen5 x8 \(max Gen5 x16\)", rec["detail"]), rec
    for n in cluster.nodes[:-1]:
        assert records(tmp_path / "runs/1")[(n, "nvidia_driver.pcie_link")]["status"] == "pass"
    # Policy fail (the default) leaves nobody out, and still remembers the machine.
    assert len(kept(r.stdout)) == len(cluster.nodes)
    machines = json.loads((tmp_path / "runs/bad_machines.json").read_text())["machines"]
    assert [m["last_host"] for m in machines] == [bad]


def test_quick_tier_gpudirect_checks_skip_on_the_cpu_sim_and_nvlink_errors_fail(cluster, tmp_path):
    node = cluster.nodes[-1]
    set_fault(cluster, node, "nvlink-errors=3@2")
    try:
        r = cluster.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}/runs/1")
    finally:
        clear_fault(cluster, node)
    assert r.returncode != 0, r.stdout[-3000:]
    recs = records(tmp_path / "runs/1")
    assert {h for (h, _), rec in recs.items() if rec["status"] == "fail"} == {node}
    rec = recs[(node, "nvidia_driver.nvlink_errors")]
    assert rec["status"] == "fail" and f"{node} GPU 2 link 0: CRC Errors 3, Recovery Errors 3" in rec["detail"]
    for n in cluster.nodes:
        # No RDMA device, no lspci on the simulated nodes: skipped with the reason, never passed.
        for check in ("ib_ports", "peermem", "iommu"):
            assert recs[(n, "nvidia_driver." + check)]["status"] == "skip", recs[(n, "nvidia_driver." + check)]
    assert recs[(cluster.nodes[0], "nvidia_driver.nvlink_errors")]["status"] == "pass"


def test_exclude_leaves_the_node_out_and_the_next_run_remembers_it(cluster, bad, tmp_path):
    first = cluster.playbook(PLAYBOOK, "-e", "cluster_node_failure_policy=exclude",
                             "-e", f"cluster_run_dir={tmp_path}/runs/1")
    assert first.returncode == 0, first.stdout[-4000:]
    n = len(cluster.nodes) - 1
    assert kept(first.stdout) == sorted((h, i, n) for i, h in enumerate(cluster.nodes[:-1]))
    ex = report(tmp_path / "runs/1")["exclusion"]
    assert [(e["host"], e["reason"]) for e in ex["excluded"]] == [(bad, "failed")]
    assert ex["excluded"][0]["checks"][0].startswith("nvidia_driver.pcie_link: ")
    assert re.search(rf"left out: {re.escape(bad)} \(machine m-\w+, failed\): nvidia_driver.pcie_link", first.stdout)
    machines = json.loads((tmp_path / "runs/bad_machines.json").read_text())["machines"]
    assert [m["last_host"] for m in machines] == [bad] and len(machines[0]["gpu_uuids"]) == 4
    machine = machines[0]["id"]

    clear_fault(cluster, bad)  # the node passes now: still left out until the record is cleared
    second = cluster.playbook(PLAYBOOK, "-e", "cluster_node_failure_policy=exclude",
                              "-e", f"cluster_run_dir={tmp_path}/runs/2")
    assert second.returncode == 0, second.stdout[-4000:]
    assert [h for h, _, _ in kept(second.stdout)] == cluster.nodes[:-1]
    ex = report(tmp_path / "runs/2")["exclusion"]
    assert [(e["host"], e["reason"], e["id"]) for e in ex["excluded"]] == [(bad, "remembered", machine)]
    assert records(tmp_path / "runs/2", status="fail") == {}

    warned = cluster.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}/runs/3")
    assert warned.returncode == 0, warned.stdout[-4000:]
    assert len(kept(warned.stdout)) == len(cluster.nodes)
    assert f"{bad} is machine {machine}" in warned.stdout and "watch it" in warned.stdout

    cleared = cluster.playbook(PLAYBOOK, "-e", "cluster_node_failure_policy=exclude", "-e",
                               f"cluster_clear_bad_machines={machine}", "-e", f"cluster_run_dir={tmp_path}/runs/4")
    assert cleared.returncode == 0, cleared.stdout[-4000:]
    assert len(kept(cleared.stdout)) == len(cluster.nodes)
    assert json.loads((tmp_path / "runs/bad_machines.json").read_text())["machines"] == []


def test_too_few_nodes_left_stops_before_the_launch(cluster, bad, tmp_path):
    r = cluster.playbook(PLAYBOOK, "-e", "cluster_node_failure_policy=exclude",
                         "-e", f"cluster_min_nodes={len(cluster.nodes)}", "-e", f"cluster_run_dir={tmp_path}/runs/1")
    assert r.returncode != 0
    assert re.search(rf"Stop: not launching: {len(cluster.nodes) - 1} of {len(cluster.nodes)} nodes are healthy", r.stdout)
    assert kept(r.stdout) == [] and "Traceback" not in r.stdout


def test_site_launches_on_the_kept_nodes(cluster, bad, tmp_path):
    r = cluster.playbook("site.yml", "-e", "cluster_node_failure_policy=exclude", "-e", f"cluster_run_dir={tmp_path}/runs/1",
                         "-e", "nccl_check_min_inter_busbw_gbps=0.001", "-e", "nccl_check_min_intra_busbw_gbps=0.001",
                         timeout=1500)
    assert r.returncode == 0, r.stdout[-6000:]
    ex = report(tmp_path / "runs/1")["exclusion"]
    assert [e["host"] for e in ex["excluded"]] == [bad]
    for node in cluster.nodes[:-1]:
        state = json.loads(cluster.exec(node, ["cat", "/var/lib/trainyard/train/launch.json"]).stdout)
        assert "--nnodes=2" in " ".join(state["command"]), state["command"]
    left = cluster.exec(bad, ["cat", "/var/lib/trainyard/train/launch.json"], check=False)
    assert left.returncode != 0 or "--nnodes=2" not in left.stdout  # the left-out node launched nothing


def test_plan_says_how_long_the_tier_takes(cluster, tmp_path):
    r = cluster.playbook("playbooks/plan.yml", "--check", "--diff", "-e", "cluster_burnin_tier=standard",
                         "-e", f"cluster_run_dir={tmp_path}/runs/1")
    n = len(cluster.nodes)
    assert f"burn-in tier standard: about 2 min on this cluster ({n} node(s), 64 at a time: 1 round(s) of 130 s " \
           "per node = quick 10 s + DCGM level 2 120 s or, where dcgmi is absent, the built-in stress 1 GPU(s) x 20 s " \
           "= 30 s (the longer counts))" in r.stdout, r.stdout[-4000:]
    # The CPU sim has no GPU device: the standard tier's diagnostics are skipped with the reason, never passed.
    burn = records(tmp_path / "runs/1")[(cluster.nodes[0], "nvidia_driver.burnin")]
    assert burn["status"] == "skip" and "not run in check mode" in burn["detail"]
