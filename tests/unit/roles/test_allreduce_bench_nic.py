"""The all-reduce benchmark's node-side readings (roles/nccl_check/files/allreduce_bench.py), without torch: the data
NIC and the RDMA ports from a sysfs tree, and the sweep's sizes."""

from __future__ import annotations

import os

import pytest

from helpers import load

bench = load("roles/nccl_check/files/allreduce_bench.py", "allreduce_bench")


def sysfs(tmp_path, iface, speed, virtual):
    root = tmp_path / "sys"
    dev = root / "devices" / ("virtual/net" if virtual else "pci0000:00/0000:00:05.0/net") / iface
    dev.mkdir(parents=True)
    if speed is not None:
        (dev / "speed").write_text(f"{speed}\n")
    (root / "class" / "net").mkdir(parents=True)
    os.symlink(dev, root / "class" / "net" / iface)
    return root


def test_a_physical_nic_and_its_rdma_ports(tmp_path):
    root = sysfs(tmp_path, "ens5", 100000, False)
    for dev, layer, state in (("mlx5_0", "InfiniBand", "4: ACTIVE"), ("mlx5_1", "Ethernet", "1: DOWN")):
        port = root / "class" / "infiniband" / dev / "ports" / "1"
        port.mkdir(parents=True)
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
        (port / "link_layer").write_text(layer + "\n")
        (port / "state").write_text(state + "\n")
    nic = bench.nic_facts("ens5", str(root))
    assert nic == {"iface": "ens5", "speed_mbps": 100000, "virtual": False, "rdma": [
        {"device": "mlx5_0", "port": "1", "rate_gbps": 400.0, "link_layer": "InfiniBand", "state": "4: ACTIVE"},
        {"device": "mlx5_1", "port": "1", "rate_gbps": 400.0, "link_layer": "Ethernet", "state": "1: DOWN"}]}


def test_a_veth_is_virtual_and_an_unknown_speed_is_none(tmp_path):
    assert bench.nic_facts("eth1", str(sysfs(tmp_path, "eth1", 10000, True)))["virtual"] is True
    assert bench.nic_facts("eth2", str(sysfs(tmp_path / "b", "eth2", -1, False)))["speed_mbps"] is None
    assert bench.nic_facts("eth3", str(sysfs(tmp_path / "c", "eth3", None, False)))["speed_mbps"] is None
    assert bench.nic_facts("../x", str(tmp_path))["speed_mbps"] is None
    assert bench.nic_facts("", str(tmp_path)) == {"iface": "", "speed_mbps": None, "virtual": False, "rdma": []}


def test_sizes():
    assert bench.parse_sizes("16,1,4") == [1.0, 4.0, 16.0]
    with pytest.raises(ValueError, match="--sizes-mb '0,4': give sizes in MiB above 0"):
        bench.parse_sizes("0,4")
