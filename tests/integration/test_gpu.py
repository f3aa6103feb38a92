"""GPU stack on the simulated cluster: nvidia_driver and fabricmanager against the stand-in nvidia-smi.

Each fault is set on one node through the stand-in's fault file (/etc/trainyard-standin/fault) and must fail
preflight with the right check, naming that node; the healthy cluster passes and a second run changes nothing.
tests/integration/playbooks/gpu.yml runs validation, the two roles and the report (other roles cannot mask
or break these results); test_full_preflight_names_a_fabric_fault runs playbooks/preflight.yml itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import parse_recap

PLAYBOOK = "tests/integration/playbooks/gpu.yml"
FAULT = "/etc/trainyard-standin/fault"


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


def records(run_dir: Path, host: str | None = None, status: str | None = None) -> dict:
    return {(r["host"], r["check"]): r for r in report(run_dir)["records"]
            if (host is None or r["host"] == host) and (status is None or r["status"] == status)}


def set_fault(cluster, node: str, text: str) -> None:
    cluster.exec(node, ["sh", "-c", f"mkdir -p /etc/trainyard-standin && printf '%s\\n' \"$0\" > {FAULT}", text])


def clear_fault(cluster, node: str) -> None:
    cluster.exec(node, ["rm", "-f", FAULT])


@pytest.fixture
def odd(cluster):
    """The node that gets the fault; its fault file is removed afterwards whatever happens."""
    node = cluster.nodes[1]
    clear_fault(cluster, node)
    yield node
    clear_fault(cluster, node)


def test_healthy_cluster_passes_and_second_run_changes_nothing(cluster, tmp_path):
    for n in cluster.nodes:
        clear_fault(cluster, n)
    first = cluster.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}/1")
    assert first.returncode == 0, first.stdout[-4000:]
    second = cluster.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}/2")
    assert second.returncode == 0, second.stdout[-4000:]
    recap = parse_recap(second.stdout)
    assert {n: recap[n]["changed"] for n in cluster.nodes} == {n: 0 for n in cluster.nodes}
    recs = records(tmp_path / "2")
    for n in cluster.nodes:
        assert recs[(n, "nvidia_driver.drift")]["status"] == "pass"
        gmap = recs[(n, "nvidia_driver.gpu_map")]["data"]["gpu_map"]
        assert [(m["local_rank"], m["pci_bus_id"]) for m in gmap] == [
            (i, f"00000000:00:0{6 + i}.0") for i in range(4)]
        assert recs[(n, "fabricmanager.fabric")]["status"] == "pass"
        assert recs[(n, "fabricmanager.service")]["status"] == "skip"  # no systemd on the simulated nodes
        assert "not verifiable" in recs[(n, "fabricmanager.service")]["detail"]
        env = cluster.exec(n, ["cat", "/etc/environment"]).stdout
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env.splitlines()
    uuids = [m["uuid"] for n in cluster.nodes for m in recs[(n, "nvidia_driver.gpu_map")]["data"]["gpu_map"]]
    assert len(set(uuids)) == len(uuids) == 4 * len(cluster.nodes)


FAULTS = [
    ("fabric=In Progress", "fabricmanager.fabric", r"GPU 0 \(00000000:00:06\.0\): state In Progress"),
    ("fabric=Failure@2", "fabricmanager.fabric", r"GPU 2 \(00000000:00:08\.0\): state Completed, status Failure"),
    ("driver=570.86.15", "nvidia_driver.drift", r"driver 570\.86\.15 on {node}; 2 other node\(s\) run 580\.159\.04"),
    ("gpus=3", "nvidia_driver.gpu_count", r"3 GPU\(s\), cluster_gpus_per_node 4"),
    ("duplicate-pci", "nvidia_driver.pci_unique", r"PCI bus id 0000:00:06\.0 reported for GPUs 0, 1"),
    ("fabricmanager=580.95.05", "fabricmanager.version", r"fabric manager 580\.95\.05, driver 580\.159\.04"),
    ("error", "nvidia_driver.smi", r"{node}: the NVIDIA kernel module is not loaded.*exit 9"),
    ("nvlink=down@1", "fabricmanager.nvlink", r"GPU 1 \(00000000:00:07\.0\): 18 of 18 NVLinks inactive"),
    ("mig=Enabled@1", "nvidia_driver.mig", r"GPU 1 \(00000000:00:07\.0\): MIG Enabled \(1 MIG device\)"),
]


@pytest.mark.parametrize("fault, check, detail", FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_on_one_node_fails_preflight_naming_it(cluster, odd, tmp_path, fault, check, detail):
    set_fault(cluster, odd, fault)
    r = cluster.playbook(PLAYBOOK, "-e", "gpu_tasks=preflight.yml", "-e", f"cluster_run_dir={tmp_path}")
    assert r.returncode != 0, r.stdout[-3000:]
    failed = records(tmp_path, status="fail")
    assert (odd, check) in failed, sorted(failed)
    assert re.search(detail.format(node=re.escape(odd)), failed[(odd, check)]["detail"]), failed[(odd, check)]
    assert failed[(odd, check)]["fix"]
    assert {h for h, _ in failed} == {odd}, sorted(failed)  # the healthy nodes are not blamed
    assert re.search(rf"{re.escape(odd)}: {re.escape(check)} FAIL", r.stdout), r.stdout[-3000:]


def test_same_gpu_uuids_on_two_nodes_fail_both(cluster, odd, tmp_path):
    set_fault(cluster, odd, f"uuid-from={cluster.nodes[0]}")
    r = cluster.playbook(PLAYBOOK, "-e", "gpu_tasks=preflight.yml", "-e", f"cluster_run_dir={tmp_path}")
    assert r.returncode != 0
    failed = records(tmp_path, status="fail")
    assert set(failed) == {(cluster.nodes[0], "nvidia_driver.uuid_unique"), (odd, "nvidia_driver.uuid_unique")}
    assert f"{cluster.nodes[0]}, {odd}" in failed[(odd, "nvidia_driver.uuid_unique")]["detail"]


def test_missing_nvidia_smi_is_named(cluster, odd, tmp_path):
    cluster.exec(odd, ["mv", "/usr/local/bin/nvidia-smi", "/usr/local/bin/nvidia-smi.away"])
    try:
        r = cluster.playbook(PLAYBOOK, "-e", "gpu_tasks=preflight.yml", "-e", f"cluster_run_dir={tmp_path}")
    finally:
        cluster.exec(odd, ["mv", "/usr/local/bin/nvidia-smi.away", "/usr/local/bin/nvidia-smi"])
    assert r.returncode != 0
    rec = records(tmp_path, status="fail")[(odd, "nvidia_driver.smi")]
    assert "nvidia-smi is not installed" in rec["detail"]
    skipped = records(tmp_path, host=odd, status="skip")
    assert (odd, "nvidia_driver.drift") in skipped and (odd, "fabricmanager.fabric") in skipped


def test_pinned_version_and_visible_devices(cluster, tmp_path):
    r = cluster.playbook(PLAYBOOK, "-e", "gpu_tasks=preflight.yml", "-e", f"cluster_run_dir={tmp_path}",
                         "-e", "nvidia_driver_version=580.95.05", "-e", "nvidia_driver_visible_devices=3,1")
    assert r.returncode != 0
    failed = records(tmp_path, status="fail")
    assert {c for _, c in failed} == {"nvidia_driver.version"}
    assert "pinned 580.95.05" in failed[(cluster.head, "nvidia_driver.version")]["detail"]
    gmap = records(tmp_path)[(cluster.head, "nvidia_driver.gpu_map")]["data"]["gpu_map"]
    assert [(m["local_rank"], m["index"]) for m in gmap] == [(0, 3), (1, 1)]


def test_install_path_in_check_mode_stops_on_a_non_ubuntu_node(cluster, tmp_path):
    """The simulated nodes run Debian: the install path must stop with the distribution and the fix, and
    check mode must not touch /etc/environment."""
    r = cluster.playbook(PLAYBOOK, "--check", "-e", "nvidia_driver_install=true", "-e", f"cluster_run_dir={tmp_path}")
    assert r.returncode != 0
    assert re.search(r"Stop if the node is not Ubuntu 22\.04 or 24\.04: \S+-node\d runs Debian 12", r.stdout), \
        r.stdout[-3000:]
    assert "nvidia_driver_install: false" in r.stdout


def test_full_preflight_names_a_fabric_fault(cluster, odd, tmp_path):
    set_fault(cluster, odd, "fabric=In Progress")
    r = cluster.playbook("playbooks/preflight.yml", "-e", f"cluster_run_dir={tmp_path}")
    assert r.returncode != 0
    assert re.search(rf"{re.escape(odd)}: fabricmanager\.fabric FAIL: GPU 0 \(00000000:00:06\.0\): state In Progress",
                     r.stdout), r.stdout[-4000:]


def test_a_node_that_runs_the_fabric_manager_is_checked_after_the_install(cluster, odd, tmp_path):
    """fabricmanager_required: always makes every node run the fabric manager (verify only here): the role's first
    task leaves the checks to the task after the install steps, which records all five and prints a failure."""
    set_fault(cluster, odd, "fabric=In Progress")
    r = cluster.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}", "-e", "fabricmanager_required=always",
                         "-e", "fabricmanager_install=false")
    assert r.returncode != 0
    titles = [t.split("]")[0] for t in r.stdout.split("TASK [")[1:]]
    install = titles.index("fabricmanager : Enable and start the fabric manager")
    assert titles.index("fabricmanager : Record the fabric manager checks after the install") > install, titles
    assert re.search(rf"{re.escape(odd)}: fabricmanager\.fabric FAIL: GPU 0 \(00000000:00:06\.0\): state In Progress",
                     r.stdout), r.stdout[-4000:]
    recs = records(tmp_path)
    for n in cluster.nodes:
        fm = {c: rec["status"] for (h, c), rec in recs.items() if h == n and c.startswith("fabricmanager.")}
        assert fm == {"fabricmanager.nvswitch": "pass", "fabricmanager.version": "pass",
                      "fabricmanager.service": "skip", "fabricmanager.nvlink": "pass",
                      "fabricmanager.fabric": "fail" if n == odd else "pass"}, (n, fm)
