"""module_utils/gpudirect.py: the quick burn-in tier's GPUDirect checks on the formats their sources print (the
stand-in nvidia-smi's nvlink -e, a public H100 capture's format; sysfs trees written as the kernel's
Documentation/ABI/stable/sysfs-class-infiniband documents them) and gpu_checks wiring them in."""

import subprocess
import sys
from pathlib import Path

from ansible_collections.trainyard.core.plugins.module_utils import gpudirect as gd

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests/data/nvidia-smi/h200x4"
STANDIN = REPO / "tests/sim/standin/nvidia-smi"
# The public capture's lines (stas00/ml-engineering, network/README.md), one GPU, two links, with one replay error.
CAPTURE = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-abcdefab-cdef-abdc-abcd-abababababab)
         Link 0: Replay Errors: 0
         Link 0: Recovery Errors: 0
         Link 0: CRC Errors: 0

         Link 1: Replay Errors: 2
         Link 1: Recovery Errors: 0
         Link 1: CRC Errors: 0
"""


def standin(tmp_path, *faults):
    fault = tmp_path / "fault"
    fault.write_text("".join(f + "\n" for f in faults))
    env = {"TRAINYARD_STANDIN_DATA": str(DATA), "TRAINYARD_STANDIN_FAULT": str(fault),
           "TRAINYARD_STANDIN_HOST": "node1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, str(STANDIN), "nvlink", "-e"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def sysfs(root, ports):
    """Write /sys/class/infiniband/<dev>/ports/<n>/{state,rate,link_layer,gids/0} under root."""
    for (dev, port), files in ports.items():
        d = root / "sys/class/infiniband" / dev / "ports" / str(port)
        (d / "gids").mkdir(parents=True)
        for name, text in files.items():
            (d / ("gids/0" if name == "gid0" else name)).write_text(text + "\n")


ACTIVE = {"state": "4: ACTIVE", "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand",
          "gid0": "fe80:0000:0000:0000:a088:c203:0046:3a7c"}


def test_nvlink_errors_of_the_standin_pass_and_its_fault_fails(tmp_path):
    clean = gd.parse_nvlink_errors(standin(tmp_path))
    assert len(clean) == 4 and len(clean[0]) == 18
    assert gd.nvlink_errors_record("node1", clean)["status"] == "pass"
    rec = gd.nvlink_errors_record("node1", gd.parse_nvlink_errors(standin(tmp_path, "nvlink-errors=3@1")))
    assert rec["status"] == "fail" and "node1 GPU 1 link 0: CRC Errors 3, Recovery Errors 3" in rec["detail"]
    assert "nvlink -ec" in rec["fix"]


def test_replay_errors_of_the_public_capture_warn():
    rec = gd.nvlink_errors_record("n", gd.parse_nvlink_errors(CAPTURE))
    assert rec["status"] == "warn" and "GPU 0 link 1: Replay Errors 2" in rec["detail"]
    assert gd.nvlink_errors_record("n", {})["status"] == "skip"


def test_ib_ports_active_pass_down_warns_no_gid_fails(tmp_path):
    sysfs(tmp_path / "a", {("mlx5_0", 1): ACTIVE, ("mlx5_1", 1): ACTIVE})
    rec = gd.ib_ports_record("n", gd.read_ib_ports(str(tmp_path / "a")))
    assert rec["status"] == "pass" and "2 RDMA port(s) Active at 400 Gb/s" in rec["detail"]
    sysfs(tmp_path / "b", {("mlx5_0", 1): ACTIVE, ("mlx5_1", 1): dict(ACTIVE, state="1: DOWN")})
    rec = gd.ib_ports_record("n", gd.read_ib_ports(str(tmp_path / "b")))
    assert rec["status"] == "warn" and "mlx5_1 port 1 (InfiniBand) is DOWN" in rec["detail"]
    roce = dict(ACTIVE, link_layer="Ethernet", rate="100 Gb/sec (4X EDR)",
                gid0="0000:0000:0000:0000:0000:0000:0000:0000")
    sysfs(tmp_path / "c", {("mlx5_0", 1): roce})
    rec = gd.ib_ports_record("n", gd.read_ib_ports(str(tmp_path / "c")))
    assert rec["status"] == "fail" and "no GID" in rec["detail"] and "(Ethernet)" in rec["detail"]
    sysfs(tmp_path / "d", {("mlx5_0", 1): ACTIVE, ("mlx5_1", 1): dict(ACTIVE, rate="200 Gb/sec (4X HDR)")})
    assert "different rates" in gd.ib_ports_record("n", gd.read_ib_ports(str(tmp_path / "d")))["detail"]
    sysfs(tmp_path / "e", {("mlx5_0", 1): dict(ACTIVE, state="1: DOWN")})
    assert gd.ib_ports_record("n", gd.read_ib_ports(str(tmp_path / "e")))["status"] == "fail"


def test_cpu_sim_skips_every_check_without_the_hardware(tmp_path):
    read = gd.read_node(str(tmp_path))  # no sysfs, no /proc, no nvidia-smi, no lspci
    recs = {r["check"]: r for r in gd.records("cpu1", read, has_gpu=False)}
    assert {k: r["status"] for k, r in recs.items()} == dict.fromkeys(
        ["nvidia_driver.nvlink_errors", "nvidia_driver.ib_ports", "nvidia_driver.peermem", "nvidia_driver.iommu"],
        "skip")
    assert "no InfiniBand/RoCE device" in recs["nvidia_driver.ib_ports"]["detail"]


def test_peermem_and_iommu():
    assert gd.peermem_record("n", "nvidia_peermem 16384 0 - Live 0x0\nnvidia 1 0\n", True, True)["status"] == "pass"
    rec = gd.peermem_record("n", "nvidia 1 0 - Live\n", True, True)
    assert rec["status"] == "warn" and "modprobe nvidia_peermem" in rec["fix"]
    assert gd.peermem_record("n", "", False, True)["status"] == "skip"
    lspci = ("00:01.1 PCI bridge: PLX Technology PEX 89xx\n\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+\n"
             "01:00.0 3D controller: NVIDIA Corporation\n")
    rec = gd.iommu_record("n", "BOOT_IMAGE=/vmlinuz iommu=pt", 40, lspci)
    assert rec["status"] == "fail" and "00:01.1" in rec["detail"]
    assert gd.iommu_record("n", "BOOT_IMAGE=/vmlinuz intel_iommu=on", 40, "")["status"] == "warn"
    assert gd.iommu_record("n", "BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt", 40, "")["status"] == "pass"
    # Without lspci the failing half (ACS) is unread: skip, never pass.
    assert gd.iommu_record("n", "BOOT_IMAGE=/vmlinuz", 0, None)["status"] == "skip"
