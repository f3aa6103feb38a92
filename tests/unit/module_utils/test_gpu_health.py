"""module_utils/gpu_health.py on real kernel log lines (tests/data/kernel-log/, sources in its README) and on
the real H200 x4 capture as the stand-in nvidia-smi edits it (ecc=, remap=, throttle=); the stand-in dmesg."""

import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import gpu_health as gh

REPO = Path(__file__).resolve().parents[3]
LOGS = REPO / "tests/data/kernel-log"
DATA = REPO / "tests/data/nvidia-smi/h200x4"
STANDIN = REPO / "tests/sim/standin"


def log(name):
    return (LOGS / name).read_text()


@pytest.fixture
def standin(tmp_path):
    fault = tmp_path / "fault"

    def run(prog, *args, faults=()):
        fault.write_text("".join(f + "\n" for f in faults))
        env = {"TRAINYARD_STANDIN_DATA": str(DATA), "TRAINYARD_STANDIN_FAULT": str(fault),
               "TRAINYARD_STANDIN_HOST": "node1", "PATH": "/usr/bin:/bin"}
        r = subprocess.run([sys.executable, str(STANDIN / prog), *args], env=env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout
    return run


def test_xid79_real_lines_in_both_formats():
    for name, pci in (("xid79-journal.log", "0000:2b:00"), ("xid79-dmesg.log", "0000:18:00")):
        ev = [e for e in gh.parse_kernel_log(log(name)) if e["kind"] == "xid"]
        assert [(e["code"], e["pci"], e["severity"]) for e in ev] == [(79, pci, "fail")]
        assert "fallen off the bus" in ev[0]["meaning"] and "power-cycle" in ev[0]["fix"]
    assert gh.parse_kernel_log(log("xid79-dmesg.log"))[0]["pid"] == 1234


@pytest.mark.parametrize("name,code,severity,word", [
    ("xid63.log", 63, "warn", "activate the remap"),
    ("xid94.log", 94, "fail", "restart the job"),
    ("xid74.log", 74, "fail", "nvlink"),
])
def test_real_xid_lines_are_explained_with_a_fix(name, code, severity, word):
    (e,) = gh.parse_kernel_log(log(name))
    assert (e["kind"], e["code"], e["severity"]) == ("xid", code, severity)
    assert word in e["fix"]


def test_old_format_without_pci_prefix_and_unknown_code():
    ev = gh.parse_kernel_log(log("xid-old-format.log"))
    kinds = [(e["kind"], e.get("code"), e.get("pci")) for e in ev]
    assert ("fallen", 79, "0000:01:00") in kinds and ("xid", 3, "0000:01:00") in kinds
    unknown = [e for e in ev if e.get("code") == 3][0]
    assert unknown["severity"] == "fail" and "catalog" in unknown["fix"]


def test_oom_and_segfault():
    ev = gh.parse_kernel_log(log("oom-segv.log"), boot_epoch=1000.0)
    assert [(e["kind"], e["pid"], e["name"]) for e in ev] == [("oom", 4242, "python3"), ("segfault", 4317, "python3")]
    assert ev[0]["time"] == pytest.approx(9201.118532)
    lines = gh.other_kernel_events("node2", ev, {"node_rank": 1})
    assert lines[0]["text"].startswith("node2 (node rank 1): OOM kill of python3 (pid 4242)")


def test_since_drops_older_lines_and_keeps_untimed_ones():
    text = ("2026-11-23T10:00:00,000000+00:00 NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n"
            "2026-11-23T12:00:00+0000 host kernel: NVRM: Xid (PCI:0000:18:00): 94, pid=2, Contained\n"
            "NVRM: Xid (PCI:0000:18:00): 63, pid=3, Row Remapper\n")
    since = gh.line_time("2026-11-23T11:00:00+00:00 x")
    assert [e["code"] for e in gh.parse_kernel_log(text, since=since)] == [94, 63]
    assert [e["code"] for e in gh.parse_kernel_log(text)] == [79, 94, 63]


def test_xid_record_names_node_gpu_rank_and_fix(standin):
    xml = standin("nvidia-smi", "-q", "-x")
    gpus = gh.parse_health_xml(xml)
    kmsg = standin("dmesg", "--time-format", "iso", faults=["xid=79@1"])
    events = gh.parse_kernel_log(kmsg)
    rec = gh.xid_record("node2", {"events": events, "source": "dmesg"}, gpus, {"node_rank": 1, "nproc_per_node": 4})
    assert rec["status"] == "fail"
    assert rec["detail"].startswith("Xid 79 on node2 (node rank 1) GPU 1 (%s), rank 5 (local rank 1)" % gpus[1]["pci"])
    assert "power-cycle" in rec["fix"] and rec["fix"].startswith("Xid 79 on node2")
    assert rec["data"]["xid"][0]["rank"] == 5


def test_xid_record_pass_and_skip():
    ok = gh.xid_record("n", {"events": [], "source": "dmesg"}, [], {})
    assert ok["status"] == "pass"
    skip = gh.xid_record("n", {"skipped": "dmesg: Operation not permitted"}, [], {})
    assert skip["status"] == "skip" and "Operation not permitted" in skip["detail"]


def test_healthy_capture_passes_every_check(standin):
    gpus = gh.parse_health_xml(standin("nvidia-smi", "-q", "-x"))
    assert len(gpus) == 4 and gpus[0]["volatile_uncorrectable"] == 0 and gpus[0]["remap_pending"] == "No"
    assert gh.ecc_record("node1", gpus)["status"] == "pass"
    assert gh.throttle_record("node1", gpus)["status"] == "pass"
    assert gpus[0]["mem_total_mib"] == 143771 and gpus[0]["temp_c"] == 38


def test_ecc_faults_fail_with_the_gpu_and_rank(standin):
    xml = standin("nvidia-smi", "-q", "-x", faults=["ecc=2@3", "remap=pending@3"])
    gpus = gh.parse_health_xml(xml)
    rec = gh.ecc_record("node2", gpus, {"node_rank": 1, "nproc_per_node": 4})
    assert rec["status"] == "fail"
    assert "node2 (node rank 1) GPU 3" in rec["detail"] and "rank 7 (local rank 3)" in rec["detail"]
    assert "row remap pending" in rec["detail"] and "2 uncorrectable ECC errors" in rec["detail"]
    assert "reset the GPU" in rec["fix"]
    assert gh.ecc_record("node2", gh.parse_health_xml(
        standin("nvidia-smi", "-q", "-x", faults=["remap=failure@0"])))["fix"].count("RMA") == 1


def test_throttle_is_a_warning(standin):
    gpus = gh.parse_health_xml(standin("nvidia-smi", "-q", "-x", faults=["throttle=hw_power_brake_slowdown@2"]))
    rec = gh.throttle_record("node3", gpus, {"node_rank": 2, "nproc_per_node": 4})
    assert rec["status"] == "warn" and "GPU 2" in rec["detail"] and "power brake" in rec["detail"]
    assert "rank 10 (local rank 2)" in rec["detail"] and "cooling" in rec["fix"]


def test_old_throttle_tag_names():
    xml = ("<nvidia_smi_log><gpu id=\"00000000:3B:00.0\"><clocks_throttle_reasons>"
           "<clocks_throttle_reason_hw_slowdown>Active</clocks_throttle_reason_hw_slowdown>"
           "</clocks_throttle_reasons></gpu></nvidia_smi_log>")
    (g,) = gh.parse_health_xml(xml)
    assert g["throttle"] == ["hw_slowdown"] and g["pci"] == "0000:3b:00"


def test_not_xml_is_an_error():
    with pytest.raises(ValueError):
        gh.parse_health_xml("NVIDIA-SMI has failed")


def test_health_records_skip_without_nvidia_smi():
    recs = gh.health_records("n", {"kernel": {"events": []}, "smi_error": "nvidia-smi not found"})
    assert [r["status"] for r in recs] == ["pass", "skip", "skip", "skip"]


def test_ranks_on_gpu_with_visible_devices():
    assert gh.ranks_on_gpu(2, 1, 2, visible=[1, 2]) == (3, 1)
    assert gh.ranks_on_gpu(0, 1, 2, visible=[1, 2]) == (None, None)
    assert gh.ranks_on_gpu(3, 0, 2) == (None, None)


def test_read_kernel_log_falls_back_and_skips_with_reason():
    calls = []

    def run(argv):
        calls.append(argv[0])
        if argv[0] == "journalctl":
            return 0, "", ""
        return 1, "", "dmesg: read kernel buffer failed: Operation not permitted"
    r = gh.read_kernel_log(run, "journalctl", "dmesg", since=5)
    assert calls == ["journalctl", "dmesg"] and r["source"] is None
    assert "Operation not permitted" in r["skipped"]

    def run2(argv):
        return 0, "a\n" * 10, ""
    r = gh.read_kernel_log(run2, None, "dmesg", max_bytes=5)
    assert r["truncated"] and r["source"] == "dmesg" and len(r["text"]) <= 5


# nvidia_driver.pcie_link: the real capture (Gen5 x16 on every GPU, idle) and the stand-in's pcie= edits of it.
def test_pcie_link_of_the_real_capture_passes(standin):
    gpus = gh.parse_health_xml(standin("nvidia-smi", "-q", "-x"))
    assert gpus[0]["pcie"] == {"gen_max": 5, "gen_current": 5, "width_max": 16, "width_current": 16}
    assert gpus[0]["idle"] is True
    rec = gh.pcie_link_record("node1", gpus)
    assert rec["status"] == "pass" and "4 GPU(s)" in rec["detail"] and "Gen5 x16" in rec["detail"]


def test_pcie_width_below_max_fails_naming_gpu_rank_and_fix(standin):
    gpus = gh.parse_health_xml(standin("nvidia-smi", "-q", "-x", faults=["pcie=x8@1"]))
    rec = gh.pcie_link_record("node2", gpus, {"node_rank": 1, "nproc_per_node": 4})
    assert rec["status"] == "fail"
    assert "node2 (node rank 1) GPU 1" in rec["detail"] and "rank 5 (local rank 1)" in rec["detail"]
    assert "PCIe Gen5 x8 (max Gen5 x16)" in rec["detail"] and "width" in rec["detail"]
    assert "reseat" in rec["fix"] and "node2" in rec["fix"]


def test_pcie_gen_below_max_is_a_warning_when_idle_and_a_failure_under_load(standin):
    idle = gh.parse_health_xml(standin("nvidia-smi", "-q", "-x", faults=["pcie=gen1@2"]))
    rec = gh.pcie_link_record("node3", idle)
    assert rec["status"] == "warn" and "GPU 2" in rec["detail"] and "idle" in rec["detail"]
    assert "under load" in rec["fix"] or "busy" in rec["fix"]
    # The stand-in's throttle= fault clears gpu_idle (the GPU is working): the same low generation is a fault.
    busy = gh.parse_health_xml(standin("nvidia-smi", "-q", "-x",
                                       faults=["pcie=gen1@2", "throttle=sw_thermal_slowdown@2"]))
    assert busy[2]["idle"] is False
    assert gh.pcie_link_record("node3", busy)["status"] == "fail"
    # Width and generation both low on an idle GPU: the width decides, a failure.
    both = gh.parse_health_xml(standin("nvidia-smi", "-q", "-x", faults=["pcie=gen1@0,x4@0"]))
    assert gh.pcie_link_record("node3", both)["status"] == "fail"


def test_pcie_link_skips_without_link_information():
    xml = ("<nvidia_smi_log><gpu id=\"00000000:3B:00.0\"><pci><pci_gpu_link_info><pcie_gen><max_link_gen>N/A"
           "</max_link_gen><current_link_gen>N/A</current_link_gen></pcie_gen></pci_gpu_link_info></pci></gpu>"
           "</nvidia_smi_log>")
    rec = gh.pcie_link_record("vm1", gh.parse_health_xml(xml))
    assert rec["status"] == "skip" and "no PCIe link information" in rec["detail"]
    assert gh.pcie_link_record("cpu1", [])["status"] == "skip"
    skipped = gh.health_records("cpu1", {"kernel": {"skipped": "no log"}, "gpus": [], "smi_error": "not found"})
    assert [r["status"] for r in skipped if r["check"] == "nvidia_driver.pcie_link"] == ["skip"]
