"""Burn-in on the simulated cluster (docs/burn-in.md): the PCIe link check against the stand-in nvidia-smi's pcie=
fault, and the node failure policy: a node with a stand-in GPU fault is left out (exclude), the others re-ranked,
the machine written to <runs dir>/bad_machines.json and left out (or warned about) on the next run until cleared.

tests/integration/playbooks/exclude.yml runs validation, the nvidia_driver checks, the GPU stress's burn-in step,
playbooks/exclude.yml, a play on the kept nodes and the report; test_site_launches_on_the_kept_nodes and
test_a_slow_gpu_found_by_the_stress_is_left_out_and_the_job_launches_on_the_others run site.yml itself.

The GPU stress on the CPU sim: a STAND-IN for the Python that runs it (tests/sim/standin/gpu-stress-python, not the
stress) replays the real stress's line of 4 x H100 with another process on GPU 3
(docs/gpu-acceptance/stress-h100x4/stress-hog.log) on one node; the others run the real gpu_stress.py, which finds
no CUDA device and records a skip.
"""

from __future__ import annotations

import json
import re

import pytest

from helpers import REPO
from test_gpu import clear_fault, records, report, set_fault

PLAYBOOK = "tests/integration/playbooks/exclude.yml"
# The stand-in for the GPU stress's Python and the real capture it replays, where the node and its training container
# both see them (cluster_shared_root of the sim, mounted read-only into the container).
STANDIN_DIR = "/srv/shared/trainyard-standin"
STANDIN = STANDIN_DIR + "/gpu-stress-python"
# What the exclusion, its report line and the record keep of the hog node's stress record (its first line).
SLOW = "nccl_check.gpu_stress: slow GPU(s) on {} (% of the fleet median or expected, the lower): GPU 3 matmul 47% copy 49%"
STRESS = ["-e", "cluster_burnin_tier=standard", "-e", f"nccl_check_python={STANDIN}"]
# A link that trained at half its width on GPU 1 (stand-in fault, tests/sim/standin/README.md).
FAULT = "pcie=x8@1"


@pytest.fixture
def bad(cluster):
    """The last node, with the GPU fault; its fault file is removed afterwards whatever happens."""
    node = cluster.nodes[-1]
    set_fault(cluster, node, FAULT)
    yield node
    clear_fault(cluster, node)


@pytest.fixture
def hog(cluster):
    """The stand-in for the GPU stress's Python on every node, replaying the real hog capture on the last node
    (GPU 3 at half its figures); removed afterwards whatever happens. A job an earlier test file left training on
    this shared cluster is stopped first: the stress skips nodes where the job trains (their GPUs are busy)."""
    node = cluster.nodes[-1]
    r = cluster.playbook("tests/integration/playbooks/launch.yml", "-e", "test_launch_entry=reset",
                         "-e", "test_launch_prepare=false")
    assert r.returncode == 0, r.stdout[-3000:]
    for n in cluster.nodes:
        cluster.exec(n, ["sh", "-c", f"mkdir -p {STANDIN_DIR} && cat > {STANDIN} && chmod 0755 {STANDIN}"],
                     input=(REPO / "tests/sim/standin/gpu-stress-python").read_text())
        cluster.exec(n, ["sh", "-c", f"cat > {STANDIN_DIR}/stress-hog.log"],
                     input=(REPO / "docs/gpu-acceptance/stress-h100x4/stress-hog.log").read_text())
    cluster.exec(node, ["sh", "-c", f"echo gpu-stress=hog > {STANDIN_DIR}/fault"])
    yield node
    for n in cluster.nodes:
        cluster.exec(n, ["rm", "-rf", STANDIN_DIR], check=False)


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


def test_a_slow_gpu_found_by_the_stress_fails_the_run_naming_node_gpu_and_fix(cluster, hog, tmp_path):
    """Policy fail (the default): the stress's verdict is a check of the node preparation; the run stops at the report
    naming the node, the GPU index and the fix, and the machine is remembered. Host runtime: the stand-in runs on the
    node itself (this playbook starts no container)."""
    r = cluster.playbook(PLAYBOOK, *STRESS, "-e", "nccl_check_runtime=host", "-e", f"cluster_run_dir={tmp_path}/runs/1")
    assert r.returncode != 0, r.stdout[-3000:]
    failed = records(tmp_path / "runs/1", status="fail")
    assert set(failed) == {(hog, "nccl_check.gpu_stress")}, sorted(failed)
    rec = failed[(hog, "nccl_check.gpu_stress")]
    assert f"{hog} GPU 3 (GPU-5143d391-f87c-5db8-0849-944f52c1a186): bf16 matmul 323.7 TFLOP/s" in rec["detail"], rec
    assert "cluster_node_failure_policy: exclude" in rec["fix"] and f"{hog}:" in rec["fix"]
    for n in cluster.nodes[:-1]:  # the real stress on a CPU node: a skip with the reason, never a pass
        assert records(tmp_path / "runs/1")[(n, "nccl_check.gpu_stress")]["status"] == "skip"
    assert len(kept(r.stdout)) == len(cluster.nodes)
    machines = json.loads((tmp_path / "runs/bad_machines.json").read_text())["machines"]
    assert [m["last_host"] for m in machines] == [hog]
    assert machines[0]["checks"] == [SLOW.format(hog)]


def test_a_slow_gpu_found_by_the_stress_is_left_out_and_the_job_launches_on_the_others(cluster, hog, tmp_path):
    """Policy exclude, site.yml: the stress runs in the training container at the end of the prepare play, before
    the exclusion play, so the node with the slow GPU is left out, remembered by its GPUs, and the job launches on
    the other two. The job is stopped afterwards (the cluster as it was)."""
    try:
        r = cluster.playbook("site.yml", *STRESS, "-e", "cluster_node_failure_policy=exclude",
                             "-e", f"cluster_run_dir={tmp_path}/runs/1", "-e", "nccl_check_min_inter_busbw_gbps=0.001",
                             "-e", "nccl_check_min_intra_busbw_gbps=0.001", timeout=1500)
        assert r.returncode == 0, r.stdout[-6000:]
        ex = report(tmp_path / "runs/1")["exclusion"]
        assert [(e["host"], e["reason"]) for e in ex["excluded"]] == [(hog, "failed")], ex
        assert ex["excluded"][0]["checks"] == [SLOW.format(hog)]
        assert re.search(rf"left out: {re.escape(hog)} \(machine m-\w+, failed\): nccl_check.gpu_stress", r.stdout)
        (machine,) = json.loads((tmp_path / "runs/bad_machines.json").read_text())["machines"]
        assert machine["last_host"] == hog and len(machine["gpu_uuids"]) == 4
        for node in cluster.nodes[:-1]:
            state = json.loads(cluster.exec(node, ["cat", "/var/lib/trainyard/train/launch.json"]).stdout)
            assert "--nnodes=2" in " ".join(state["command"]), state["command"]
        left = cluster.exec(hog, ["cat", "/var/lib/trainyard/train/launch.json"], check=False)
        assert left.returncode != 0 or "--nnodes=2" not in left.stdout  # the left-out node launched nothing
        page = (tmp_path / "runs/1/health.html").read_text()
        assert 'id="exclusion"' in page and f"{hog} (excluded)" in page and "nccl_check.gpu_stress" in page
    finally:
        cluster.playbook("tests/integration/playbooks/launch.yml", "-e", "test_launch_entry=reset",
                         "-e", "test_launch_prepare=false")
