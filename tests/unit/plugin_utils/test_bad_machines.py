"""plugin_utils/bad_machines.py: machine identities, the record of bad machines and the node failure policy
(docs/burn-in.md); the action node_exclusion's file handling; the report view."""

import json
from pathlib import Path

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi
from ansible_collections.trainyard.core.plugins.plugin_utils import bad_machines as bm
from ansible_collections.trainyard.core.plugins.plugin_utils import gpu_checks

REPO = Path(__file__).resolve().parents[3]
CAPTURE = (REPO / "tests/data/nvidia-smi/h200x4/nvidia-smi-q.xml").read_text()
HOSTS = ["node1", "node2", "node3"]


def ident(n, machine_id=None):
    """Node n's identity from the real capture, its GPU UUIDs made its own (as the stand-in does)."""
    facts = nvidia_smi.parse_query_xml(CAPTURE)
    for g in facts["gpus"]:
        g["uuid"] = g["uuid"][:-2] + "%02d" % n
    return gpu_checks.identity_of({"nvidia_gpu_facts": facts, "machine_id": machine_id})


IDS = {h: ident(i + 1) for i, h in enumerate(HOSTS)}


def decide(failed, record=None, policy="exclude", min_nodes=1, ids=IDS):
    return bm.decide(HOSTS, failed, ids, record or bm.load(""), policy, min_nodes, now="2026-11-27T07:00:00Z",
                     run_id="r1", nproc_per_node=4, data_addresses={h: "10.0.0.%d" % i for i, h in enumerate(HOSTS)})


def test_identity_is_gpus_and_machine_id_never_the_address():
    a = ident(1)
    assert a["gpu_serials"] == ["1654924120994", "1654924122085", "1654924159004", "1655024000441"]
    assert len(a["gpu_uuids"]) == 4 and a["id"].startswith("m-")
    assert ident(1)["id"] == a["id"] and ident(2)["id"] != a["id"]
    assert bm.identity(None, None) is None
    only_mid = bm.identity(None, "abc")
    # nvidia-smi failed on the node: the machine id alone matches the entry of the same machine with its GPUs.
    assert bm.same_machine(only_mid, ident(1, "abc")) and not bm.same_machine(ident(1, "abc"), ident(2, "abc"))


def test_exclude_leaves_the_failing_node_out_with_contiguous_ranks_and_remembers_it():
    out = decide({"node2": ["nvidia_driver.pcie_link: GPU 1 x8"]})
    assert out["kept"] == ["node1", "node3"]
    assert [(e["host"], e["reason"]) for e in out["excluded"]] == [("node2", "failed")]
    assert out["models"]["node3"]["node_rank"] == 1 and out["models"]["node3"]["world_size"] == 8
    assert out["models"]["node1"]["hosts_by_rank"] == ["node1", "node3"]
    (m,) = out["record"]["machines"]
    assert m["id"] == IDS["node2"]["id"] and m["last_host"] == "node2" and m["failures"] == 1
    assert m["checks"] == ["nvidia_driver.pcie_link: GPU 1 x8"] and "node2" in out["summary"]


def test_next_run_skips_the_remembered_machine_under_exclude_and_warns_under_fail():
    record = decide({"node2": ["nvidia_driver.ecc: remap pending"]})["record"]
    again = decide({}, record=record)
    assert [(e["host"], e["reason"]) for e in again["excluded"]] == [("node2", "remembered")]
    assert again["kept"] == ["node1", "node3"] and "cluster_clear_bad_machines" in again["notes"][0]
    # The same machine behind another name (a rented address reused): still remembered.
    moved = dict(IDS, node3=IDS["node2"], node2=IDS["node3"])
    assert [e["host"] for e in decide({}, record=record, ids=moved)["excluded"]] == ["node3"]
    warned = decide({}, record=record, policy="fail")
    assert warned["excluded"] == [] and warned["kept"] == HOSTS and warned["models"] == {}
    assert "node2" in warned["notes"][0] and "watch it" in warned["notes"][0]


def test_policy_fail_still_records_the_machine():
    out = decide({"node1": ["nvidia_driver.xid: Xid 79"]}, policy="fail")
    assert out["excluded"] == [] and [m["last_host"] for m in out["record"]["machines"]] == ["node1"]


def test_too_few_nodes_left_stops_naming_them_and_the_fix():
    with pytest.raises(bm.BadMachinesError) as e:
        decide({"node1": ["a: x"], "node2": ["b: y"]}, min_nodes=2)
    msg = str(e.value)
    assert "node1" in msg and "node2" in msg and "cluster_min_nodes" in msg and "Traceback" not in msg


def test_bad_policy_and_bad_record_are_one_line_errors():
    with pytest.raises(bm.BadMachinesError, match="cluster_node_failure_policy is 'skip'. Fix"):
        decide({}, policy="skip")
    with pytest.raises(bm.BadMachinesError, match="runs/bad_machines.json is not JSON"):
        bm.load("{", "runs/bad_machines.json")
    with pytest.raises(bm.BadMachinesError, match="not a trainyard bad-machines record"):
        bm.load(json.dumps({"machines": [1]}), "x")


def test_clear_by_id_node_or_all():
    record = decide({"node2": ["a: x"], "node3": ["b: y"]})["record"]
    left, gone = bm.clear(record, IDS["node2"]["id"])
    assert gone == [IDS["node2"]["id"]] and [m["last_host"] for m in left["machines"]] == ["node3"]
    assert bm.clear(record, "node3")[1] == [IDS["node3"]["id"]]
    assert bm.clear(record, "all")[0]["machines"] == []
    with pytest.raises(bm.BadMachinesError, match="names no machine of the record"):
        bm.clear(record, "node9")


def test_report_view_moves_the_left_out_failures_and_keeps_the_rest():
    report = {"failures": [{"host": "node2", "check": "a", "status": "fail"}], "failed": True, "records": []}
    ex = decide({"node2": ["a: x"]})
    view = bm.report_view(report, ex)
    assert view["failed"] is False and view["excluded_failures"][0]["host"] == "node2"
    assert view["exclusion"]["excluded"][0]["host"] == "node2"
    assert bm.report_view(report, None) is report
    assert bm.report_view(report, decide({"node2": ["a: x"]}, policy="fail"))["failed"] is True
