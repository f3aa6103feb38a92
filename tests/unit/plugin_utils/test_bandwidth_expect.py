"""The expected-bandwidth table (plugin_utils/bandwidth_expect.py) on the GPU facts the product reads (the H200 capture
in tests/data/nvidia-smi/h200x4, parsed as module nvidia_gpu_facts parses it) and on NIC facts as the benchmark reads
them from sysfs. No GPU machine this session: these fixtures are the GPU side's only exercise."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi
from ansible_collections.trainyard.core.plugins.plugin_utils import bandwidth_expect as be

DATA = Path(__file__).resolve().parents[2] / "data" / "nvidia-smi"


def h200_facts():
    facts = nvidia_smi.parse_query_xml((DATA / "h200x4" / "nvidia-smi-q.xml").read_text())
    links = nvidia_smi.parse_nvlink_status((DATA / "h200x4" / "nvidia-smi-nvlink-s.txt").read_text())
    for g in facts["gpus"]:
        g["nvlink"] = links.get(g["index"])
    return facts


def gpus(name, links, n=8):
    return {"gpus": [{"name": name, "nvlink": {"links": links, "active": links}} for _ in range(n)]}


def test_the_h200_capture_expects_nvlink4():
    e = be.intra_expectation(h200_facts(), 4)
    assert e["gbps"] == 320.0
    assert e["hardware"] == "4x NVIDIA H200, NVLink4 (18 links) through NVSwitch"
    assert "alayanew" in e["source"] and "gpu-acceptance" in e["source"]


@pytest.mark.parametrize("name,links,gbps,hardware", [
    ("NVIDIA H100 80GB HBM3", 18, 320.0, "NVLink4"),
    ("NVIDIA A100-SXM4-80GB", 12, 230.0, "NVLink3"),
    ("NVIDIA H100 PCIe", 0, 35.0, "PCIe Gen5 x16"),
    ("NVIDIA A100 80GB PCIe", 0, 17.5, "PCIe Gen4 x16"),
    ("NVIDIA L40S", 0, 17.5, "PCIe Gen4 x16"),
])
def test_rows_by_model_and_link(name, links, gbps, hardware):
    e = be.intra_expectation(gpus(name, links), 8)
    assert e["gbps"] == gbps and hardware in e["hardware"] and e["source"]


@pytest.mark.parametrize("facts,reason", [
    (None, "no GPU facts in this run"),
    (gpus("NVIDIA GeForce RTX 4090", 0), "is not in the table"),
    (gpus("NVIDIA H100 NVL", 12), "bridged pairs"),
    ({"gpus": [{"name": "NVIDIA H100 80GB HBM3"}, {"name": "NVIDIA A100-SXM4-80GB"}]}, "mixed GPU models"),
    (gpus("NVIDIA H100 80GB HBM3", 0), "no NVLink listed"),
])
def test_unknown_hardware_has_no_expectation_and_says_why(facts, reason):
    e = be.intra_expectation(facts, 8)
    assert e["gbps"] is None and reason in e["reason"]


def test_family_matching_is_exact():
    assert be.gpu_family("NVIDIA H200") == "H200"
    assert be.gpu_family("NVIDIA H20") is None
    assert be.gpu_family("NVIDIA L4") == "L4" and be.gpu_family("NVIDIA L40S") == "L40S"


def test_nic_rows():
    tcp = be.nic_expectation({"iface": "ens5", "speed_mbps": 100000, "virtual": False}, "tcp")
    assert tcp["gbps"] == 7.5 and tcp["hardware"] == "TCP over ens5 at 100 Gb/s"
    ib = [{"device": f"mlx5_{i}", "port": 1, "rate_gbps": 400, "link_layer": "InfiniBand", "state": "4: ACTIVE"}
          for i in range(8)]
    e = be.nic_expectation({"iface": "ib0", "rdma": ib}, "ib", nproc=8)
    assert e["gbps"] == 360.0 and e["hardware"] == "8x IB 400 Gb/s"
    # One rank per node drives one NIC: 200G HDR -> 22.5 GB/s (nccl-tests#119 reads about 24).
    hdr = [dict(p, rate_gbps=200) for p in ib]
    assert be.nic_expectation({"rdma": hdr}, "ib", nproc=1)["gbps"] == 22.5
    assert be.nic_expectation({"rdma": hdr}, "roce")["gbps"] is None  # InfiniBand ports do not serve RoCE
    efa = [{"device": "rdmap16s27", "port": 1, "rate_gbps": 100, "link_layer": "Unspecified", "state": "4: ACTIVE"}]
    assert be.nic_expectation({"rdma": efa}, "efa")["gbps"] == 10.0


@pytest.mark.parametrize("nic,profile,reason", [
    ({"iface": "eth1", "speed_mbps": 10000, "virtual": True}, "tcp", "eth1 is a virtual interface"),
    ({"iface": "eth1", "speed_mbps": -1}, "tcp", "reports no link speed"),
    ({"iface": "eth1", "speed_mbps": None}, "tcp", "reports no link speed"),
    # The GPU acceptance's nodes run with network_enabled false: the benchmark is given no interface.
    ({"iface": "", "speed_mbps": None, "virtual": False}, "tcp", "no data interface was named"),
    ({"rdma": [{"device": "mlx5_0", "rate_gbps": 400, "link_layer": "InfiniBand", "state": "1: DOWN"}]}, "ib",
     "no active ib port"),
    ({}, "gcp-tcpxo", "no table row for the gcp-tcpxo profile"),
])
def test_unknown_nics_have_no_expectation(nic, profile, reason):
    e = be.nic_expectation(nic, profile)
    assert e["gbps"] is None and reason in e["reason"]


def test_a_group_goes_at_its_slowest_node():
    a = be.nic_expectation({"iface": "ens5", "speed_mbps": 100000}, "tcp")
    b = be.nic_expectation({"iface": "ens5", "speed_mbps": 25000}, "tcp")
    g = be.group_expectation({"n1": a, "n2": b})
    assert g["gbps"] == b["gbps"] and g["hardware"] == "TCP over ens5 at 25 Gb/s on n2"
    none = be.group_expectation({"n1": a, "n2": be.nic_expectation({"iface": "eth1", "virtual": True}, "tcp")})
    assert none["gbps"] is None and none["hardware"] == "eth1 (virtual) on n2"


def test_grades_read_measured_against_expected():
    e = {"gbps": 320.0, "hardware": "8x NVIDIA H200, NVLink4"}
    assert be.grade(300, e, 0) == ("pass", "300 GB/s = 94% of the 320 GB/s expected for 8x NVIDIA H200, NVLink4")
    assert be.grade(200, e, 50)[0] == "warn"
    assert be.grade(100, e, 50)[0] == "fail"
    # The floor overrides: below it fails whatever the expectation says.
    assert be.grade(300, e, 310) == ("fail", "300 GB/s = 94% of the 320 GB/s expected for 8x NVIDIA H200, "
                                             "NVLink4, floor 310 GB/s (below the floor)")
    assert be.grade(200, e, 0, pass_fraction=0.6)[0] == "pass"
    none = {"gbps": None, "hardware": "eth1 (virtual)", "reason": "eth1 is a virtual interface: no line rate"}
    assert be.grade(2.5, none, 1) == ("pass", "2.5 GB/s; no expectation for eth1 (virtual) (eth1 is a virtual "
                                              "interface: no line rate), floor 1 GB/s")
    assert be.grade(0.5, none, 1)[0] == "fail"
    assert be.threshold(e, 50) == 256.0 and be.threshold(none, 1) == 1.0


# ------------------------------------------------------------------------------------- checked on real hardware
CAP = Path(__file__).resolve().parents[3] / "docs" / "gpu-acceptance" / "stress-h100x4"


def test_the_table_on_the_real_h100x4_capture():
    """docs/gpu-acceptance/stress-h100x4 (4 x H100 80GB HBM3, NVSwitch, no NVLS): nvidia-smi -q -x and nvlink -s
    through the parsers module nvidia_gpu_facts uses, the expectation for 4 ranks, and the product's own sweep
    (allreduce-intra.log, its result line read as the role reads it) graded as the role grades it."""
    import json

    from ansible_collections.trainyard.core.plugins.plugin_utils.allreduce_checks import intra_node_record
    from helpers import load

    facts = nvidia_smi.parse_query_xml((CAP / "nvidia-smi-q.xml").read_text())
    links = nvidia_smi.parse_nvlink_status((CAP / "nvlink-s.txt").read_text())
    for g in facts["gpus"]:
        g["nvlink"] = links.get(g["index"])
    assert [g["nvlink"]["active"] for g in facts["gpus"]] == [18] * 4
    expect = be.intra_expectation(facts, 4)
    assert expect["gbps"] == 320.0
    assert expect["hardware"] == "4x NVIDIA H100 80GB HBM3, NVLink4 (18 links) through NVSwitch"

    filters = load("filter_plugins/nccl_check.py", "nccl_check_filters")
    result = filters.allreduce_result({"rc": 0, "stdout": (CAP / "allreduce-intra.log").read_text()})
    assert result["busbw_gbps"] == json.loads((CAP / "allreduce-intra.json").read_text())["busbw_gbps"] == 354.863
    rec = intra_node_record(result, 50.0, 0, expect, (0.8, 0.5))
    assert rec["status"] == "pass"
    assert ("354.863 GB/s = 111% of the 320 GB/s expected for 4x NVIDIA H100 80GB HBM3, NVLink4 (18 links) through "
            "NVSwitch, floor 50 GB/s") in rec["detail"]


# ------------------------------------------------------------------------------------- busbw and the per-NIC rate
IB8 = {"iface": "ib0", "rdma": [{"device": f"mlx5_{i}", "port": 1, "rate_gbps": 200, "link_layer": "InfiniBand",
                                  "state": "4: ACTIVE"} for i in range(8)]}


def test_per_nic_conversion_of_a_tree_on_two_nodes():
    """2 nodes x 8 GPUs, one 200G IB NIC per GPU, NCCL_ALGO unset: NCCL runs a tree (nccl-tests#196), each NIC carries
    busbw x (k-1)/(n-1) = busbw / 15 and the busbw expected is the NICs' 180 GB/s x 15 x 2 / 16 = 337.5 GB/s."""
    rel = be.nic_relation(2, 16, {})
    assert rel["hierarchical"] and rel["algorithm"] == "tree" and rel["per_nic_factor"] == pytest.approx(1 / 15)
    assert "per NIC = busbw x (k - 1) / (n - 1) = busbw x 1/15" in rel["text"]
    e = be.convert_for_nics(be.nic_expectation(IB8, "ib", 8), 2, 16, {"NCCL_VERSION": "2.28.9"})
    assert e["nic_gbps"] == 180.0 and e["gbps"] == 337.5
    # A NIC at two thirds of its rate: busbw 200 GB/s passed as 111% of 180 before the conversion; now it warns.
    status, text = be.grade(200.0, e, 1.0)
    assert status == "warn" and text.startswith("200 GB/s = 59% of the 337.5 GB/s expected for 8x IB 200 Gb/s (NCCL "
                                                "picks a tree (or NVLS tree) on 2 nodes: per NIC = busbw x (k - 1) / "
                                                "(n - 1) = busbw x 1/15)")


def test_rings_need_no_conversion():
    for nodes, env in ((2, {"NCCL_ALGO": "Ring"}), (4, {}), (3, {"NCCL_ALGO": "^tree"})):
        e = be.convert_for_nics(be.nic_expectation(IB8, "ib", 8), nodes, nodes * 8, env)
        assert e["gbps"] == 180.0 and not e["relation"]["hierarchical"] and "nic_gbps" not in e
        assert e["relation"]["per_nic_factor"] == 1 / 8  # the node's busbw over its 8 NICs
    forced = be.nic_relation(4, 32, {"NCCL_ALGO": "NVLSTree"})
    assert forced["hierarchical"] and forced["per_nic_factor"] == pytest.approx(3 / 31)
    assert be.nic_relation(2, 2, {})["node_factor"] == 1.0  # one rank per node: busbw is the NIC rate
    assert be.nic_relation(1, 8, {})["algorithm"] == ""


def test_one_nic_for_all_the_ranks_of_a_node():
    rel = be.nic_relation(2, 16, {}, nics=1)
    assert rel["per_nic_factor"] == pytest.approx(8 / 15) and "x 8/1 (1 NIC(s) for 8 ranks per node)" in rel["text"]
