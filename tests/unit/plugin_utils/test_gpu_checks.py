"""plugin_utils/gpu_checks.py: what the nvidia_driver and fabricmanager actions hand to the verdicts, from the
nodes' nvidia_gpu_facts results (the real H200 x4 capture and edited copies)."""

from ansible_collections.trainyard.core.plugins.module_utils import gpu_health
from ansible_collections.trainyard.core.plugins.plugin_utils import gpu_checks as gc
from helpers import by_check, facts_of, xml

OPTS = {"version": "", "branch": "580", "gpus_per_node": 4, "nproc_per_node": 4, "gpu_ranks": True,
        "visible_devices": "", "shared_gpus_ok": False, "device_order_file": "/etc/environment"}
HEALTH = {"node_rank": 1, "nproc_per_node": 4, "visible": "", "since": 0}
KERNEL = {"source": "journalctl -k", "text": "", "truncated": False, "skipped": ""}


def result(facts, order="PCI_BUS_ID", **extra):
    """A registered nvidia_gpu_facts result as the module returns it (with health)."""
    r = {"changed": False, "device_order": order, "nvidia_gpu_facts": facts,
         "health": {"kernel": KERNEL, "gpus": gpu_health.parse_health_xml(xml("nvidia-smi-q.xml")), "smi_error": ""}}
    r.update(extra)
    return r


def peers(c, visible=None):
    """gpu_checks.peers_of over a cluster {host: result} (the run_once call), visible: {host: visible devices}."""
    hosts = list(c)
    return gc.peers_of(hosts, [gc.facts_of(c[h]) for h in hosts], [(visible or {}).get(h, "") for h in hosts])


def records(host, c, opts=OPTS, visible=None, health=None):
    """The records of `host` as its action builds them: its own result and the peers taken once."""
    return gc.driver_records(host, c[host], peers(c, visible), opts, health)


def cluster(n=3):
    """n nodes with their own GPU UUIDs."""
    out = {}
    for i in range(n):
        f = facts_of()
        for g in f["gpus"]:
            g["uuid"] = g["uuid"][:-1] + str(i)
        out["n%d" % (i + 1)] = result(f)
    return out


def test_healthy_node_passes_every_driver_and_health_check():
    recs = by_check(records("n2", cluster(), health=HEALTH))
    assert {k: r["status"] for k, r in recs.items()} == dict.fromkeys(recs, "pass")
    assert set(recs) == {"nvidia_driver." + n for n in ("smi", "version", "drift", "gpu_count", "pci_unique",
                                                         "uuid_unique", "gpu_map", "mig", "device_order", "xid",
                                                         "ecc", "throttle", "pcie_link")}
    assert recs["nvidia_driver.drift"]["detail"] == "driver 580.159.04 on all 3 node(s)"
    assert recs["nvidia_driver.device_order"]["detail"] == "CUDA_DEVICE_ORDER=PCI_BUS_ID in /etc/environment"


def test_without_health_no_health_records():
    assert "nvidia_driver.xid" not in by_check(records("n2", cluster()))


def test_failed_nvidia_smi_fails_smi_with_the_modules_message_and_skips_the_rest():
    c = cluster()
    c["n2"] = {"failed": True, "msg": "n2: the driver is not loaded", "device_order": None,
               "health": {"kernel": KERNEL, "gpus": [], "smi_error": "the driver is not loaded"}}
    recs = by_check(records("n2", c, health=HEALTH))
    assert recs["nvidia_driver.smi"]["status"] == "fail"
    assert recs["nvidia_driver.smi"]["detail"] == "n2: the driver is not loaded"
    assert recs["nvidia_driver.smi"]["fix"] == "Fix the driver on n2 (see the cause above), then rerun preflight"
    assert recs["nvidia_driver.drift"]["status"] == "skip"
    assert recs["nvidia_driver.device_order"]["status"] == "fail"
    assert recs["nvidia_driver.ecc"]["status"] == "skip" and "the driver is not loaded" in recs["nvidia_driver.ecc"][
        "detail"]
    # The other nodes count n2 as missing, not as odd.
    assert by_check(records("n1", c))["nvidia_driver.drift"]["status"] == "pass"


def test_cpu_only_cluster_skips_every_gpu_check():
    c = {"n1": {"failed": True, "msg": "nvidia-smi not found"}}
    recs = records("n1", c, dict(OPTS, gpus_per_node=0))
    assert {r["status"] for r in recs} == {"skip"} and "cluster_gpus_per_node: 0" in recs[0]["detail"]


def test_a_gpu_on_two_nodes_fails_both_and_the_peers_carry_only_the_shared_uuids():
    c = cluster()
    c["n3"] = result(facts_of())
    c["n1"] = result(facts_of())
    p = peers(c)
    shared = [g["uuid"] for g in facts_of()["gpus"]]
    assert p == {"n1": {"driver": "580.159.04", "uuids": shared}, "n2": {"driver": "580.159.04", "uuids": []},
                 "n3": {"driver": "580.159.04", "uuids": shared}}
    recs = by_check(records("n1", c))
    assert recs["nvidia_driver.uuid_unique"]["status"] == "fail"
    assert "n1, n3" in recs["nvidia_driver.uuid_unique"]["detail"]
    assert by_check(records("n2", c))["nvidia_driver.uuid_unique"]["status"] == "pass"


def test_a_node_without_gpu_facts_is_none_among_the_peers_and_missing_from_the_drift():
    c = cluster()
    c["n3"] = {"failed": True, "msg": "nvidia-smi not found"}
    assert peers(c)["n3"] is None
    drift = by_check(records("n1", c))["nvidia_driver.drift"]
    assert drift["status"] == "pass" and drift["detail"] == "driver 580.159.04 on all 2 node(s)"


def test_an_odd_driver_fails_drift_on_that_node_only():
    c = cluster()
    c["n3"]["nvidia_gpu_facts"]["driver_version"] = "570.1"
    assert by_check(records("n3", c))["nvidia_driver.drift"]["status"] == "fail"
    recs = by_check(records("n1", c))
    assert recs["nvidia_driver.drift"]["detail"] == "driver 580.159.04 here; differs on n3 (570.1)"


def test_nodes_that_split_a_machines_gpus_by_visible_devices_pass():
    c = {"a": result(facts_of()), "b": result(facts_of())}
    visible = {"a": "0,1", "b": "2,3"}
    recs = by_check(records("a", c, dict(OPTS, visible_devices="0,1", nproc_per_node=2), visible))
    assert recs["nvidia_driver.uuid_unique"]["status"] == "pass"
    assert recs["nvidia_driver.uuid_unique"]["detail"] == \
        "4 GPU UUIDs, the 2 in use (visible devices 0,1) used by no other node"
    # Overlapping visible devices: the GPUs both use are on two nodes.
    recs = by_check(records("a", c, dict(OPTS, visible_devices="0,1", nproc_per_node=2), {"a": "0,1", "b": "1,2"}))
    assert recs["nvidia_driver.uuid_unique"]["status"] == "fail"


def test_the_device_order_comes_from_the_nodes_result():
    c = cluster()
    c["n2"]["device_order"] = None
    rec = by_check(records("n2", c))["nvidia_driver.device_order"]
    assert rec["status"] == "fail" and rec["detail"] == "CUDA_DEVICE_ORDER is not set in /etc/environment"


def test_fabricmanager_needs_and_reads():
    local = facts_of(nvswitch={"present": True, "local": True, "devices": ["a"]})
    vm = facts_of(nvswitch={"present": True, "local": False, "devices": []})
    pcie = facts_of(nvswitch={"present": False, "local": False, "devices": []})
    assert gc.fabricmanager_needs(local, "auto") == (True, True)
    assert gc.fabricmanager_needs(vm, "auto") == (True, False)
    assert gc.fabricmanager_needs(pcie, "auto") == (False, False)
    assert gc.fabricmanager_needs(pcie, "always") == (True, True)
    assert gc.fabricmanager_needs(local, "never") == (False, False)
    assert gc.fabricmanager_needs(None, "always") == (False, False)
    # Read when the driver role did not read the GPUs, or for the unit where a fabric matters and systemd may run.
    assert gc.fabricmanager_read(False, None, "auto", None)
    assert not gc.fabricmanager_read(True, pcie, "auto", True)
    assert gc.fabricmanager_read(True, vm, "auto", True) and gc.fabricmanager_read(True, vm, "auto", None)
    assert not gc.fabricmanager_read(True, vm, "auto", False)
    assert not gc.fabricmanager_read(True, None, "auto", True)


def test_fabricmanager_service_manager_from_the_read_else_the_host_probe():
    unit = {"state": "running", "status": "enabled"}
    assert gc.fabricmanager_opts({"service_manager": "systemd", "service": unit}, "auto", "fm", None) == {
        "required": "auto", "service_name": "fm", "service_manager": "systemd", "service": unit}
    assert gc.fabricmanager_opts({}, "auto", "fm", {"systemd": False, "pid1": "tini"})["service_manager"] == "tini"
    assert gc.fabricmanager_opts({}, "auto", "fm", {"systemd": True, "pid1": "systemd"})["service_manager"] == \
        "systemd"
    opts = gc.fabricmanager_opts(None, "auto", "fm", None)
    assert opts["service_manager"] is None and opts["service"] is None
