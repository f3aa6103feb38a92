"""The nccl_check role's verdicts (plugin_utils/allreduce_checks.py), as roles/nccl_check/tasks/measure.yml records
them through filter_plugins/nccl_check.py."""

from __future__ import annotations

from helpers import load

from ansible_collections.trainyard.core.plugins.plugin_utils import allreduce_checks as ac

flt = load("filter_plugins/nccl_check.py", "nccl_check_filters")
GOOD = {"ok": True, "busbw_gbps": 12.5, "algbw_gbps": 6.25, "backend": "nccl", "world_size": 16, "error": ""}


def test_the_filters_are_these_functions():
    f = flt.FilterModule().filters()
    assert f["trainyard_allreduce_inter_record"] is ac.inter_node_record
    assert f["trainyard_allreduce_intra_record"] is ac.intra_node_record


def test_inter_pass_and_below_the_floor():
    rec = ac.inter_node_record(GOOD, 2, 10, 0, "/var/lib/trainyard/job/nccl.env", 29600)
    assert (rec["check"], rec["status"]) == ("nccl_check.inter_node", "pass")
    assert rec["detail"] == "busbw 12.5 GB/s (nccl, 16 ranks on 2 nodes, floor 10 GB/s)"
    assert rec["data"] == {"busbw_gbps": 12.5, "algbw_gbps": 6.25, "floor_gbps": 10,
                           "drift": {"nccl_inter_busbw_gbps": 12.5}}
    slow = ac.inter_node_record(GOOD, 2, "20.5", 0, None, 29600)
    assert slow["status"] == "fail" and slow["fix"].startswith("Inter-node bandwidth is below the floor")
    assert "or lower nccl_check_min_inter_busbw_gbps" in slow["fix"]


def test_inter_fail_names_the_env_file_and_port():
    bad = {"ok": False, "error": "timed out (hang): x"}
    rec = ac.inter_node_record(bad, 3, 10, 124, "/srv/nccl.env", 29600)
    assert rec["status"] == "fail"
    assert rec["detail"] == "all-reduce across 3 nodes did not complete (rc 124): timed out (hang): x"
    assert "NCCL_SOCKET_IFNAME in /srv/nccl.env, and that port 29600 is open between the nodes" in rec["fix"]
    assert "NCCL_SOCKET_IFNAME in the env file," in ac.inter_node_record(bad, 3, 10, 1, None, 1)["fix"]


def test_inter_skip_on_one_node():
    rec = ac.inter_node_record({"ok": False, "skipped": True, "error": "skipped"}, 1, 10)
    assert (rec["status"], rec["detail"]) == ("skip", "one node: no inter-node path to measure")
    assert rec["data"]["busbw_gbps"] is None


def test_intra_pass_fail_skip():
    rec = ac.intra_node_record(GOOD, 10, 0)
    assert (rec["check"], rec["status"]) == ("nccl_check.intra_node", "pass")
    assert rec["detail"] == "busbw 12.5 GB/s (nccl, 16 ranks, floor 10 GB/s)"
    assert "drift" not in rec["data"]
    assert ac.intra_node_record(GOOD, 100)["fix"].startswith("Intra-node bandwidth is below the floor")
    bad = ac.intra_node_record({"ok": False, "error": "exit code 1: NCCL error"}, 10, 1)
    assert (bad["status"], bad["detail"]) == ("fail", "all-reduce within the node did not complete (rc 1): "
                                                      "exit code 1: NCCL error")
    assert bad["fix"].startswith("The GPUs of this node could not all-reduce")
    skip = ac.intra_node_record({"skipped": True}, 10)
    assert (skip["status"], skip["detail"]) == ("skip", "one process per node: no intra-node path to measure")
