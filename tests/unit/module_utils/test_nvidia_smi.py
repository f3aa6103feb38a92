"""module_utils/nvidia_smi.py on the real H200 x4 capture and on edited copies that show each fault."""

import re

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi as ns
from helpers import NVIDIA_SMI_DATA, by_check, facts_of, xml

REAL = NVIDIA_SMI_DATA / "h200x4"

UUIDS = ["GPU-14e98dc8-5831-1c29-ebc0-83958ef15f98", "GPU-f7ca0a33-dea9-4a73-0f1e-410f732534c3",
         "GPU-b4944e71-d200-f8f0-76f0-b34695a85e00", "GPU-2e6a7c62-1baa-4fc5-583b-58ad093e462c"]


OPTS = {"version": "", "branch": "580", "gpus_per_node": 4, "nproc_per_node": 4, "visible_devices": "",
        "device_order": "PCI_BUS_ID", "device_order_file": "/etc/environment"}


# ----------------------------------------------------------------------------------------- parsing


def test_real_capture_parses_to_the_values_nvidia_smi_printed():
    f = ns.parse_query_xml(xml("nvidia-smi-q.xml"))
    assert (f["driver_version"], f["cuda_version"], f["attached_gpus"]) == ("580.159.04", "13.0", 4)
    assert [g["uuid"] for g in f["gpus"]] == UUIDS
    assert [g["pci_bus_id"] for g in f["gpus"]] == [f"00000000:00:0{i}.0" for i in (6, 7, 8, 9)]
    assert [g["pci_bus_id_normalized"] for g in f["gpus"]] == [f"0000:00:0{i}.0" for i in (6, 7, 8, 9)]
    g0 = f["gpus"][0]
    assert (g0["index"], g0["name"], g0["memory_total_mib"], g0["persistence_mode"], g0["mig_mode"]) == (
        0, "NVIDIA H200", 143771, "Enabled", "Disabled")
    assert all(g["fabric"]["state"] == "Completed" and g["fabric"]["status"] == "Success" for g in f["gpus"])
    assert ns.fabric_applicable(f["gpus"])


def test_parsed_xml_agrees_with_the_csv_and_list_captured_at_the_same_time():
    f = ns.parse_query_xml(xml("nvidia-smi-q.xml"))
    rows = [[c.strip() for c in line.split(",")] for line in (REAL / "nvidia-smi-query-gpu.csv").read_text().splitlines()]
    assert [[str(g["index"]), g["uuid"], g["pci_bus_id"], g["name"], f["driver_version"],
             f"{g['memory_total_mib']} MiB", g["fabric"]["state"], g["fabric"]["status"]] for g in f["gpus"]] == rows
    listed = (REAL / "nvidia-smi-L.txt").read_text().splitlines()
    assert listed == [f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})" for g in f["gpus"]]


def test_nvlink_status_of_the_real_capture():
    links = ns.parse_nvlink_status((REAL / "nvidia-smi-nvlink-s.txt").read_text())
    assert sorted(links) == [0, 1, 2, 3]
    assert all(v["links"] == 18 and v["active"] == 18 and v["inactive"] == 0 for v in links.values())
    assert links[0]["gbps"] == pytest.approx(18 * 26.562)


def test_nvlink_inactive_links_are_counted():
    text = "GPU 0: NVIDIA H200 (UUID: GPU-x)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\nGPU 1: NVIDIA H200 (UUID: GPU-y)\n"
    links = ns.parse_nvlink_status(text)
    assert links[0] == {"links": 2, "active": 1, "inactive": 1, "gbps": 26.562}
    assert links[1]["links"] == 0


@pytest.mark.parametrize("name, message", [
    ("truncated.xml", "well-formed"),
    ("no-uuid.xml", "GPU 1 (00000000:00:07.0) has no UUID"),
])
def test_broken_xml_is_refused_with_what_is_wrong(name, message):
    with pytest.raises(ns.NvidiaSmiParseError, match=re.escape(message)):
        ns.parse_query_xml(xml(name))


@pytest.mark.parametrize("text", ["", "   ", "No devices were found", "<foo/>",
                                  "<nvidia_smi_log><attached_gpus>1</attached_gpus></nvidia_smi_log>"])
def test_not_an_nvidia_smi_log_is_refused(text):
    with pytest.raises(ns.NvidiaSmiParseError):
        ns.parse_query_xml(text)


def test_pci_normalization_and_order():
    assert ns.normalize_pci("00000000:1B:00.0") == "0000:1b:00.0"
    assert ns.normalize_pci("0000:1b:00.0") == "0000:1b:00.0"
    assert ns.normalize_pci("1b:00.0") == "0000:1b:00.0"
    with pytest.raises(ns.NvidiaSmiParseError):
        ns.normalize_pci("GPU-1234")
    ids = ["00000000:C1:00.0", "00000000:1B:00.0", "00000001:03:00.0", "00000000:9A:00.0"]
    assert sorted(ids, key=ns.pci_sort_key) == ["00000000:1B:00.0", "00000000:9A:00.0", "00000000:C1:00.0",
                                                "00000001:03:00.0"]


def test_proc_version_and_fabric_manager_version_and_package():
    proc = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
            "(dvs-builder@U22-I3-AE18-23-3)  Thu Oct 30 2026\nGCC version:  gcc version 12.3.0\n")
    assert ns.parse_driver_proc_version(proc) == "580.159.04"
    assert ns.parse_driver_proc_version("") is None
    assert ns.parse_fabricmanager_version("Fabric Manager version is : 580.159.04\n") == "580.159.04"
    assert ns.parse_fabricmanager_version("nothing") is None
    dpkg = ("nvidia-fabricmanager-dev-580 580.159.04-1 ii \nnvidia-fabricmanager-575 575.57.08-1 rc \n"
            "nvidia-fabricmanager-580 580.159.04-1 hi \n")
    assert ns.parse_fabricmanager_package(dpkg) == ("nvidia-fabricmanager-580", "580.159.04")
    assert ns.parse_fabricmanager_package("nvidia-fabricmanager-575 575.57.08-1 rc \n") == (None, None)


def test_unit_state_as_service_facts_names_it():
    show = "LoadState=loaded\nActiveState=active\nSubState=running\nUnitFileState=enabled\n"
    assert ns.parse_unit_show(show) == {"state": "running", "status": "enabled"}
    show = "LoadState=loaded\nActiveState=failed\nSubState=failed\nUnitFileState=enabled\n"
    assert ns.parse_unit_show(show) == {"state": "stopped", "status": "failed"}
    show = "LoadState=loaded\nActiveState=inactive\nSubState=dead\nUnitFileState=disabled\n"
    assert ns.parse_unit_show(show) == {"state": "stopped", "status": "disabled"}
    assert ns.parse_unit_show("LoadState=not-found\nActiveState=inactive\nSubState=dead\nUnitFileState=\n") is None


def test_nvswitch_devices_from_a_proc_listing():
    assert ns.nvswitch_devices([]) == []
    assert ns.nvswitch_devices((REAL / "nvswitch-devices.txt").read_text().splitlines()) == []
    assert ns.nvswitch_devices(["0000:05:00.0", "0000:06:00.0\n", "junk"]) == ["0000:05:00.0", "0000:06:00.0"]


def test_pcie_gpus_have_no_fabric():
    f = ns.parse_query_xml(xml("pcie-no-fabric.xml"))
    assert not ns.fabric_applicable(f["gpus"])


@pytest.mark.parametrize("rc, output, word", [
    (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "kernel module"),
    (18, "Failed to initialize NVML: Driver/library version mismatch", "reboot"),
    (6, "No devices were found", "no GPU"),
    (4, "Failed to initialize NVML: Insufficient Permissions", "permission"),
    (124, "", "hung"),
    (3, "something new", "exit 3"),
])
def test_failures_are_classified(rc, output, word):
    cause, fix = ns.classify_failure(rc, output)
    assert word.lower() in (cause + " " + fix).lower()
    assert fix


def test_missing_nvidia_smi_is_named():
    cause, fix = ns.classify_failure(None, "", missing=True)
    assert "not installed" in cause and "nvidia_driver_install" in fix


# ----------------------------------------------------------------------------------------- gpu map


def test_gpu_map_follows_pci_order_not_the_listing_order():
    gpus = [{"index": 0, "pci_bus_id": "00000000:C1:00.0", "uuid": "GPU-c"},
            {"index": 1, "pci_bus_id": "00000000:1B:00.0", "uuid": "GPU-a"}]
    assert [m["uuid"] for m in ns.gpu_map(gpus)] == ["GPU-a", "GPU-c"]
    assert [m["local_rank"] for m in ns.gpu_map(gpus)] == [0, 1]


def test_gpu_map_honours_visible_devices_by_index_and_uuid():
    gpus = ns.parse_query_xml(xml("nvidia-smi-q.xml"))["gpus"]
    assert [m["index"] for m in ns.gpu_map(gpus, "2,3")] == [2, 3]
    assert [m["index"] for m in ns.gpu_map(gpus, [UUIDS[3], "GPU-14e98dc8"])] == [3, 0]
    with pytest.raises(ValueError, match="only 4 GPUs"):
        ns.gpu_map(gpus, "0,7")
    with pytest.raises(ValueError, match="no GPU"):
        ns.gpu_map(gpus, "GPU-ffff")


def test_version_drift_names_the_odd_node():
    d = ns.version_drift({"n1": "580.159.04", "n2": "570.86.15", "n3": "580.159.04", "n4": None})
    assert d == {"majority": "580.159.04", "odd": {"n2": "570.86.15"}, "missing": ["n4"]}
    assert ns.version_drift({"n1": "1.0"})["odd"] == {}


# ----------------------------------------------------------------------------------------- driver records


def records_for(host_facts: dict, host="n2", **opts):
    return by_check(ns.driver_records(host, host_facts[host], host_facts, dict(OPTS, **opts)))


def healthy_cluster():
    out = {}
    for i, h in enumerate(["n1", "n2", "n3"]):
        f = facts_of()
        for g in f["gpus"]:
            g["uuid"] = g["uuid"][:-1] + str(i)
        out[h] = f
    return out


def test_healthy_node_passes_every_driver_check_and_records_the_rank_map():
    recs = records_for(healthy_cluster())
    assert {k: r["status"] for k, r in recs.items()} == {k: "pass" for k in recs}
    assert set(recs) == {"nvidia_driver." + n for n in ("smi", "version", "drift", "gpu_count", "pci_unique",
                                                         "uuid_unique", "gpu_map", "mig", "device_order")}
    gmap = recs["nvidia_driver.gpu_map"]["data"]["gpu_map"]
    assert [(m["local_rank"], m["index"], m["pci_bus_id"]) for m in gmap] == [
        (i, i, f"00000000:00:0{6 + i}.0") for i in range(4)]
    assert recs["nvidia_driver.smi"]["data"]["drift"]["driver"] == "580.159.04"


def test_driver_drift_fails_on_the_odd_node_only():
    c = healthy_cluster()
    c["n2"] = facts_of("driver-570.xml")
    odd = records_for(c, "n2")["nvidia_driver.drift"]
    assert odd["status"] == "fail" and "570.86.15 on n2" in odd["detail"] and "580.159.04" in odd["detail"]
    assert "n2" in odd["fix"]
    assert records_for(c, "n1")["nvidia_driver.drift"]["status"] == "pass"
    assert records_for(c, "n2")["nvidia_driver.version"]["status"] == "fail"


def test_pinned_version_mismatch_and_unloaded_module():
    c = healthy_cluster()
    r = records_for(c, version="580.95.05")["nvidia_driver.version"]
    assert r["status"] == "fail" and "pinned 580.95.05" in r["detail"]
    c["n2"]["kernel_module_version"] = "580.95.05"
    r = records_for(c)["nvidia_driver.version"]
    assert r["status"] == "fail" and "kernel module 580.95.05" in r["detail"] and "Reboot n2" in r["fix"]


def test_fewer_gpus_than_configured():
    c = healthy_cluster()
    c["n2"] = facts_of("gpus-3.xml", gpu_count=3)
    r = records_for(c)["nvidia_driver.gpu_count"]
    assert r["status"] == "fail" and r["detail"].startswith("3 GPU(s), cluster_gpus_per_node 4")
    assert "4 attached" in r["detail"] and "n2" in r["fix"]
    # the rank map now has 3 GPUs for 4 local ranks: two ranks would share one GPU
    assert records_for(c)["nvidia_driver.gpu_map"]["status"] == "fail"


def test_duplicate_pci_bus_id_within_a_node():
    c = healthy_cluster()
    c["n2"] = facts_of("duplicate-pci.xml")
    r = records_for(c)["nvidia_driver.pci_unique"]
    assert r["status"] == "fail" and "0000:00:06.0" in r["detail"] and "GPUs 0, 1" in r["detail"]


def test_same_uuids_on_two_nodes():
    c = healthy_cluster()
    c["n3"]["gpus"] = [dict(g) for g in c["n2"]["gpus"]]
    r = records_for(c, "n3")["nvidia_driver.uuid_unique"]
    assert r["status"] == "fail" and "n2, n3" in r["detail"]
    assert records_for(c, "n1")["nvidia_driver.uuid_unique"]["status"] == "pass"


def test_two_entries_on_one_machine_pass_only_when_their_visible_devices_split_the_gpus():
    c = healthy_cluster()
    c["n3"]["gpus"] = [dict(g) for g in c["n2"]["gpus"]]  # n2 and n3 are one machine with 4 GPUs
    split = {"n1": "", "n2": "0,1", "n3": "2,3"}
    r = records_for(c, "n3", visible_by_host=split)["nvidia_driver.uuid_unique"]
    assert r["status"] == "pass" and "the 2 in use (visible devices 2,3)" in r["detail"]
    overlap = {"n1": "", "n2": "0,1", "n3": "1,2"}
    r = records_for(c, "n3", visible_by_host=overlap)["nvidia_driver.uuid_unique"]
    shared = c["n2"]["gpus"][1]["uuid"]
    assert r["status"] == "fail" and r["detail"] == f"GPU UUID seen more than once: {shared} on n2, n3"
    by_uuid = {"n2": c["n2"]["gpus"][0]["uuid"], "n3": c["n2"]["gpus"][3]["uuid"][:12]}
    assert records_for(c, "n3", visible_by_host=by_uuid)["nvidia_driver.uuid_unique"]["status"] == "pass"
    # only one side partitions: the other still uses every GPU, so they share
    assert records_for(c, "n3", visible_by_host={"n3": "2,3"})["nvidia_driver.uuid_unique"]["status"] == "fail"


def test_failed_nvidia_smi_fails_one_check_and_skips_the_rest():
    c = healthy_cluster()
    c["n2"] = None
    recs = records_for(c, error="n2: the NVIDIA kernel module is not loaded")
    assert recs["nvidia_driver.smi"]["status"] == "fail" and "n2" in recs["nvidia_driver.smi"]["detail"]
    assert {recs[k]["status"] for k in recs if k not in ("nvidia_driver.smi", "nvidia_driver.device_order")} == {"skip"}
    # the other nodes are not blamed for drift by a node without facts
    assert records_for(c, "n1")["nvidia_driver.drift"]["status"] == "pass"


def test_cpu_only_cluster_skips_every_gpu_check():
    c = {"n1": None}
    recs = by_check(ns.driver_records("n1", None, c, dict(OPTS, gpus_per_node=0)))
    assert {r["status"] for r in recs.values()} == {"skip"}


def test_device_order_missing_or_wrong():
    c = healthy_cluster()
    assert records_for(c, device_order=None)["nvidia_driver.device_order"]["status"] == "fail"
    r = records_for(c, device_order="FASTEST_FIRST")["nvidia_driver.device_order"]
    assert r["status"] == "fail" and "FASTEST_FIRST" in r["detail"]


def test_bad_visible_devices_fail_the_map():
    r = records_for(healthy_cluster(), visible_devices="0,9")["nvidia_driver.gpu_map"]
    assert r["status"] == "fail" and "0,9" in r["detail"]


# ----------------------------------------------------------------------------------------- fabric records


FM_OPTS = {"required": "auto", "service_name": "nvidia-fabricmanager", "service_manager": "systemd",
           "service": {"state": "running", "status": "enabled"}}


def fm_records(facts, **opts):
    return by_check(ns.fabricmanager_records("n2", facts, dict(FM_OPTS, **opts)))


def test_healthy_fabric_passes():
    recs = fm_records(facts_of())
    assert {k: r["status"] for k, r in recs.items()} == {k: "pass" for k in recs}


@pytest.mark.parametrize("name, expect", [
    ("fabric-in-progress.xml", ["GPU 0 (00000000:00:06.0): state In Progress, status N/A",
                                "GPU 3 (00000000:00:09.0): state In Progress"]),
    ("fabric-failure-gpu2.xml", ["GPU 2 (00000000:00:08.0): state Completed, status Failure"]),
])
def test_fabric_not_completed_names_the_gpu_and_the_fix(name, expect):
    r = fm_records(facts_of(name))["fabricmanager.fabric"]
    assert r["status"] == "fail"
    for e in expect:
        assert e in r["detail"]
    assert "GPU 1" not in r["detail"] if name == "fabric-failure-gpu2.xml" else True
    assert "restart nvidia-fabricmanager on n2" in r["fix"] and "replace it" in r["fix"]


def test_fabric_manager_version_must_equal_the_driver():
    r = fm_records(facts_of(fabricmanager_version="580.95.05"))["fabricmanager.version"]
    assert r["status"] == "fail" and "580.95.05" in r["detail"] and "580.159.04" in r["detail"]
    assert r["data"]["drift"]["fabricmanager"] == "580.95.05"


def test_nvswitch_node_without_fabric_manager_fails_and_vm_without_it_skips():
    local = {"present": True, "local": True, "devices": ["0000:05:00.0"], "source": "proc"}
    recs = fm_records(facts_of(fabricmanager_version=None, nvswitch=local), service=None)
    assert recs["fabricmanager.version"]["status"] == "fail"
    assert recs["fabricmanager.service"]["status"] == "fail"
    vm = fm_records(facts_of(fabricmanager_version=None))
    assert vm["fabricmanager.version"]["status"] == "skip" and vm["fabricmanager.service"]["status"] == "skip"
    assert vm["fabricmanager.fabric"]["status"] == "pass"


def test_service_stopped_fails_and_no_systemd_is_not_verifiable():
    r = fm_records(facts_of(), service={"state": "stopped", "status": "enabled"})["fabricmanager.service"]
    assert r["status"] == "fail" and "stopped" in r["detail"]
    r = fm_records(facts_of(), service={"state": "running", "status": "disabled"})["fabricmanager.service"]
    assert r["status"] == "fail" and "systemctl enable" in r["fix"]
    r = fm_records(facts_of(), service_manager="sshd", service=None)["fabricmanager.service"]
    assert r["status"] == "skip" and "not verifiable" in r["detail"]


def test_no_nvswitch_skips_with_a_reason():
    f = facts_of("pcie-no-fabric.xml", nvswitch={"present": False, "local": False, "devices": [], "source": None})
    recs = fm_records(f)
    assert {r["status"] for r in recs.values()} == {"skip"}
    assert "no NVSwitch" in recs["fabricmanager.nvswitch"]["detail"]


def test_inactive_nvlinks_fail():
    f = facts_of()
    f["gpus"][1]["nvlink"] = {"links": 18, "active": 0, "inactive": 18, "gbps": 0.0}
    r = fm_records(f)["fabricmanager.nvlink"]
    assert r["status"] == "fail" and "GPU 1 (00000000:00:07.0): 18 of 18 NVLinks inactive" in r["detail"]


# ----------------------------------------------------------------------------------------------- MIG
def test_mig_mode_is_parsed_with_its_devices():
    gpus = ns.parse_query_xml(xml("mig-enabled-gpu1.xml"))["gpus"]
    assert [(g["mig_mode"], g["mig_pending"], g["mig_devices"]) for g in gpus] == [
        ("Disabled", "Disabled", 0), ("Enabled", "Enabled", 1), ("Disabled", "Disabled", 0),
        ("Disabled", "Disabled", 0)]


def test_mig_enabled_gpu_fails_the_node_with_the_command_that_turns_it_off():
    c = healthy_cluster()
    c["n2"] = facts_of("mig-enabled-gpu1.xml")
    recs = records_for(c)
    mig = recs["nvidia_driver.mig"]
    assert mig["status"] == "fail" and "GPU 1 (00000000:00:07.0): MIG Enabled (1 MIG device)" in mig["detail"]
    assert "nvidia-smi -i 1 -mig 0" in mig["fix"] and "n2" in mig["fix"]
    # The rank map assigns whole GPUs: it is not a valid map on this node.
    assert recs["nvidia_driver.gpu_map"]["status"] == "fail"
    assert "MIG" in recs["nvidia_driver.gpu_map"]["detail"]
    assert records_for(c, "n1")["nvidia_driver.mig"]["status"] == "pass"


def test_pending_mig_mode_fails_too():
    c = healthy_cluster()
    c["n2"]["gpus"][3]["mig_pending"] = "Enabled"
    mig = records_for(c)["nvidia_driver.mig"]
    assert mig["status"] == "fail" and "GPU 3" in mig["detail"] and "pending" in mig["detail"]
    assert "nvidia-smi -i 3 -mig 0" in mig["fix"]


def test_gpus_without_mig_support_pass():
    c = healthy_cluster()
    for g in c["n2"]["gpus"]:
        g["mig_mode"] = g["mig_pending"] = None
    assert records_for(c)["nvidia_driver.mig"]["status"] == "pass"


def test_non_utf8_bytes_in_the_xml_are_replaced_not_fatal():
    raw = xml("nvidia-smi-q.xml").replace("NVIDIA H200", "NVIDIA H200 \udcff\udcfe", 1)
    f = ns.parse_query_xml(raw)
    assert f["gpus"][0]["name"].startswith("NVIDIA H200 ") and len(f["gpus"]) == 4


def test_shared_gpu_is_a_warning_only_when_allowed():
    c = healthy_cluster()
    c["n3"]["gpus"] = [dict(g) for g in c["n2"]["gpus"]]  # two "nodes" on one machine, both on every GPU
    r = records_for(c, "n3", shared_gpus_ok=True)["nvidia_driver.uuid_unique"]
    assert r["status"] == "warn" and "allowed by nvidia_driver_allow_shared_gpus" in r["detail"]
    assert "n2, n3" in r["detail"]
    assert records_for(c, "n3", shared_gpus_ok=False)["nvidia_driver.uuid_unique"]["status"] == "fail"
    # a UUID twice within one node stays a failure
    c["n3"]["gpus"][1] = dict(c["n3"]["gpus"][0])
    assert records_for(c, "n3", shared_gpus_ok=True)["nvidia_driver.uuid_unique"]["status"] == "fail"
