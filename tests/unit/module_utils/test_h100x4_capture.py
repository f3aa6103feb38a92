"""The quick burn-in tier's parsers and records on a second real machine: 4 x NVIDIA H100 80GB HBM3 behind NVSwitch
(docs/gpu-acceptance/stress-h100x4/, captured by tests/gpu/probe_stress.sh; commands.sh there says how). The H200
capture under tests/data/nvidia-smi/h200x4 drives the stand-in; this one is read as the machine printed it."""

from pathlib import Path

from ansible_collections.trainyard.core.plugins.module_utils import gpu_health as gh
from ansible_collections.trainyard.core.plugins.module_utils import gpudirect as gd
from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi

REPO = Path(__file__).resolve().parents[3]
CAP = REPO / "docs/gpu-acceptance/stress-h100x4"


def test_health_records_of_the_h100_capture_pass_with_every_gpu_read():
    gpus = gh.parse_health_xml((CAP / "nvidia-smi-q.xml").read_text())
    assert len(gpus) == 4
    assert {tuple(sorted(g["pcie"].items())) for g in gpus} == {
        (("gen_current", 5), ("gen_max", 5), ("width_current", 16), ("width_max", 16))}
    records = {r["check"]: r for r in gh.health_records("h100", {"gpus": gpus, "kernel": {}})}
    for check in ("nvidia_driver.ecc", "nvidia_driver.throttle", "nvidia_driver.pcie_link"):
        assert records[check]["status"] == "pass", records[check]
    assert "4 GPU(s)" in records["nvidia_driver.pcie_link"]["detail"]


def test_nvlink_errors_of_the_h100_capture_read_18_clean_links_per_gpu():
    errors = gd.parse_nvlink_errors((CAP / "nvlink-e.txt").read_text())
    assert len(errors) == 4 and all(len(links) == 18 for links in errors.values())
    assert gd.nvlink_errors_record("h100", errors)["status"] == "pass"


def test_gpu_facts_of_the_h100_capture_name_the_model_and_its_nvlinks():
    facts = nvidia_smi.parse_query_xml((CAP / "nvidia-smi-q.xml").read_text())
    links = nvidia_smi.parse_nvlink_status((CAP / "nvlink-s.txt").read_text())
    assert [g["name"] for g in facts["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 4
    assert len({g["uuid"] for g in facts["gpus"]}) == 4 and facts["driver_version"]
    # 18 NVLink4 links per GPU, all active, 478 GB/s a direction: the row docs/bandwidth.md's H100 figure needs.
    assert links == {i: {"links": 18, "active": 18, "inactive": 0, "gbps": 478.116} for i in range(4)}
