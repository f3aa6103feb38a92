"""The nccl_check role's verdicts (plugin_utils/allreduce_checks.py), as roles/nccl_check/tasks/measure.yml records
them through filter_plugins/nccl_check.py."""

from __future__ import annotations

import json

from helpers import load

from ansible_collections.trainyard.core.plugins.plugin_utils import allreduce_bisect as ab
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
    assert rec["detail"] == ("busbw 12.5 GB/s; no expectation for this hardware, floor 10 GB/s "
                             "(nccl, 16 ranks on 2 nodes)")
    assert rec["data"] == {"busbw_gbps": 12.5, "algbw_gbps": 6.25, "floor_gbps": 10, "expected_gbps": None,
                           "expected_for": None, "expected_source": None, "sizes": [],
                           "drift": {"nccl_inter_busbw_gbps": 12.5}}
    slow = ac.inter_node_record(GOOD, 2, "20.5", 0, None, 29600)
    assert slow["status"] == "fail" and slow["fix"].startswith("Inter-node bandwidth is below what the hardware")
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
    assert rec["detail"] == "busbw 12.5 GB/s; no expectation for this hardware, floor 10 GB/s (nccl, 16 ranks)"
    assert "drift" not in rec["data"]
    assert ac.intra_node_record(GOOD, 100)["fix"].startswith("Intra-node bandwidth is below what the hardware")
    bad = ac.intra_node_record({"ok": False, "error": "exit code 1: NCCL error"}, 10, 1)
    assert (bad["status"], bad["detail"]) == ("fail", "all-reduce within the node did not complete (rc 1): "
                                                      "exit code 1: NCCL error")
    assert bad["fix"].startswith("The GPUs of this node could not all-reduce")
    skip = ac.intra_node_record({"skipped": True}, 10)
    assert (skip["status"], skip["detail"]) == ("skip", "one process per node: no intra-node path to measure")


SWEEP = dict(GOOD, bytes=2**30, sizes=[{"bytes": 2**20 * 4**i, "busbw_gbps": 2.0 * (i + 1)} for i in range(6)])
H200 = {"gbps": 320.0, "hardware": "8x NVIDIA H200, NVLink4 (18 links) through NVSwitch", "source": "s"}


def test_the_verdict_reads_measured_against_expected_at_the_largest_size():
    rec = ac.intra_node_record(dict(SWEEP, busbw_gbps=300.0), 50, 0, H200)
    assert rec["status"] == "pass"
    assert rec["detail"] == ("busbw 300 GB/s = 94% of the 320 GB/s expected for 8x NVIDIA H200, NVLink4 (18 links) "
                             "through NVSwitch, floor 50 GB/s (nccl, 16 ranks, 1 GiB, the largest of 6 sizes from "
                             "1 MiB)")
    assert rec["data"]["expected_gbps"] == 320.0 and rec["data"]["fraction"] == 0.938
    assert [x["bytes"] for x in rec["data"]["sizes"]] == [2**20 * 4**i for i in range(6)]
    assert ac.intra_node_record(dict(SWEEP, busbw_gbps=200.0), 50, 0, H200)["status"] == "warn"
    assert ac.intra_node_record(dict(SWEEP, busbw_gbps=100.0), 50, 0, H200)["status"] == "fail"
    # Fractions are the user's; the floor still fails whatever the expectation.
    assert ac.intra_node_record(dict(SWEEP, busbw_gbps=200.0), 50, 0, H200, ("0.6", "0.3"))["status"] == "pass"
    assert ac.intra_node_record(dict(SWEEP, busbw_gbps=300.0), 310, 0, H200)["status"] == "fail"


def test_sweep_sizes():
    assert ac.sweep_sizes(1024) == [1, 4, 16, 64, 256, 1024]
    assert ac.sweep_sizes(64, 1) == [1, 4, 16, 64]
    assert ac.sweep_sizes(10, 4) == [4, 10]
    assert ac.sweep_sizes(1, 4) == [1]


def bisected(n, slow_node=None, threshold=5.0):
    nodes = [f"node{i}" for i in range(1, n + 1)]
    state = ab.start(nodes, threshold)
    while not state["done"]:
        state = ab.advance(state, {ab.key(g): 1.0 if slow_node in g else 10.0 for g in state["groups"]})
    return nodes, state


def test_the_bisection_record_fails_the_node_it_names_with_its_numbers():
    nodes, state = bisected(5, "node4")
    rec = ac.bisect_record("node4", state, {"gbps": 6.25, "hardware": "TCP over ens5 at 100 Gb/s"})
    assert rec["check"] == "nccl_check.bisect" and rec["status"] == "fail"
    assert rec["detail"].startswith("node4 is slow: 1 GB/s with node") and rec["detail"].endswith("(below 5 GB/s)")
    assert set(rec["data"]["pairwise"]["allreduce_pair_busbw_gbps"].values()) == {1.0}
    other = ac.bisect_record("node1", state)
    assert other["status"] == "pass" and "the bisection named: node4 is slow" in other["detail"]


def test_the_bisection_record_skips_with_its_reason():
    rec = ac.bisect_record("node1", ab.start(["node1", "node2"], 5.0, "the cluster's all-reduce is a pass: nothing "
                                                                      "to locate"))
    assert (rec["status"], rec["detail"]) == ("skip", "no bisection: the cluster's all-reduce is a pass: nothing to "
                                                      "locate")
    assert ac.bisect_record("node1", ab.start(["node1", "node2"], 0))["detail"].endswith("nothing tells slow from fine")
    unfinished = dict(ab.start(["a", "b", "c"], 5.0), rounds=2)
    assert ac.bisect_record("a", unfinished)["status"] == "warn"


def test_the_filters_start_the_bisection_only_below_expectation():
    below = {"status": "warn", "data": {"busbw_gbps": 3.0}}
    state = flt.bisect_start(["n1", "n2", "n3"], {"gbps": 10.0}, 1.0, 0.8, below)
    assert state["threshold_gbps"] == 8.0 and not state["done"] and state["groups"] == [["n2", "n3"]]
    assert flt.bisect_start(["n1", "n2"], None, 1.0, 0.8, {"status": "pass", "data": {}})["reason"] == \
        "the cluster's all-reduce is a pass: nothing to locate"
    assert flt.bisect_start(["n1", "n2"], None, 1.0, 0.8, below, False)["reason"] == "nccl_check_bisect is false"
    line = 'trainyard-allreduce: {"busbw_gbps": 9.0}'
    nxt = flt.bisect_advance(state, {"n2": {"rc": 0, "stdout": line}})
    assert nxt["history"] == {"n2,n3": 9.0} and nxt["rounds"] == 1
    assert flt.bisect_advance(state, {"n2": {"rc": 124, "stdout": ""}})["history"] == {"n2,n3": None}


def test_the_cluster_expectation_comes_from_every_nodes_nic():
    line = 'trainyard-allreduce: {"busbw_gbps": 1.0, "nic": {"iface": "ens5", "speed_mbps": %d}}'
    e = flt.expect_inter({"n1": {"rc": 0, "stdout": line % 100000}, "n2": {"rc": 0, "stdout": line % 25000}}, "tcp")
    assert e["gbps"] == 1.875 and e["hardware"] == "TCP over ens5 at 25 Gb/s on n2"
    assert set(e["per_host"]) == {"n1", "n2"}
    none = flt.expect_inter({"n1": {"skipped": True}}, "tcp")
    assert none["gbps"] is None and "reported no NIC here" in none["reason"]


def test_a_gloo_run_is_not_held_to_the_gpu_table():
    rec = ac.intra_node_record(dict(SWEEP, busbw_gbps=0.8, backend="gloo"), 0.05, 0, H200)
    assert rec["status"] == "pass" and rec["data"]["expected_gbps"] is None
    assert rec["detail"].startswith("busbw 0.8 GB/s; no expectation for 8x NVIDIA H200, NVLink4 (18 links) through "
                                    "NVSwitch (measured with gloo; the table is NCCL's), floor 0.05 GB/s (gloo,")


def test_the_inter_node_record_gives_the_per_nic_rate():
    ib = {"iface": "ib0", "rdma": [{"device": f"mlx5_{i}", "port": 1, "rate_gbps": 200, "link_layer": "InfiniBand",
                                    "state": "4: ACTIVE"} for i in range(8)]}
    line = ('trainyard-allreduce: {"busbw_gbps": 300.0, "backend": "nccl", "world_size": 16, "nnodes": 2, '
            '"nccl_env": {}, "nic": %s}' % json.dumps(ib))
    runs = {"n1": {"rc": 0, "stdout": line}, "n2": {"rc": 0, "stdout": line}}
    expect = flt.expect_inter(runs, "ib", 8)
    assert expect["gbps"] == 337.5 and expect["relation"]["algorithm"] == "tree"
    rec = ac.inter_node_record(flt.allreduce_result(runs["n1"]), 2, 1.0, 0, None, 39511, expect, (0.8, 0.5))
    assert rec["status"] == "pass" and "300 GB/s = 89% of the 337.5 GB/s expected" in rec["detail"]
    assert rec["data"]["per_nic_gbps"] == 20.0
    assert "per NIC 20 GB/s over 8 NIC(s) per node (NCCL picks a tree" in rec["detail"]


def test_where_the_job_trains_is_named_for_a_few_nodes_and_counted_past_eight():
    f = flt.FilterModule().filters()
    assert f["trainyard_busy_nodes"] is ac.busy_nodes
    assert ac.busy_nodes(["n1", "n2"], ["n1", "n2"]) == "n1, n2"
    assert ac.busy_nodes(["n1"], ["n1", "n2", "n3"]) == "1 of 3 nodes (n1)"
    hosts = [f"gpu-node{i}" for i in range(1024)]
    many = ac.busy_nodes(hosts, hosts)
    assert many == "all 1024 nodes (" + ", ".join(hosts[:8]) + " and 1016 more)"
    assert ac.busy_nodes(hosts[:10], hosts).startswith("10 of 1024 nodes (gpu-node0, ")


def test_a_node_record_of_the_busy_skip_is_the_same_size_at_any_cluster_size():
    """Each node's record names where the job trains: naming every node would make every node's record O(n) and
    report.json O(n^2) in the usual converged re-run (the job trains on every node)."""
    sizes = []
    for n in (16, 256, 1024):
        hosts = [f"gpu-node{i}" for i in range(n)]
        sizes.append(len(ac.busy_nodes(hosts, hosts)))
    assert max(sizes) - min(sizes) <= 6  # the digits of the count and of the "more" figure


def test_whether_the_job_trains_comes_from_the_nodes_read_else_the_probe_unless_the_container_changed_since():
    """A node's own status read wins; else the cluster role's probe where it was asked (no job key: the role wants no
    answer) and the container was not changed after it; a node the run cannot tell about (no probe, a failed probe, an
    unreadable record, a changed container) is None: it must be read, and its later read decides."""
    probe = {"time": 1.0, "job": {"state": "running"}}
    views = {"probed": {"probe": probe},
             "changed": {"probe": probe, "changed": True},
             "reread": {"read": {"state": "stopped"}, "probe": probe, "changed": True},
             "no-probe": {},
             "not-asked": {"probe": {"time": 1.0}},
             "probe-failed": {"probe": {"msg": "the node's Python cannot run it"}},
             "not-wanted": {"read": {"skipped": True, "changed": False}},
             "unreadable": {"probe": {"time": 1.0, "job": {"state": "unknown", "error": "torn"}}},
             "stopped": {"probe": {"time": 1.0, "job": {"state": "stopped"}}}}
    states = ac.job_states(views)
    assert states == {"probed": "running", "changed": None, "reread": "stopped", "no-probe": None, "not-asked": "",
                      "probe-failed": None, "not-wanted": "", "unreadable": None, "stopped": "stopped"}
    late = [{"item": "changed", "state": "running"}, {"item": "no-probe", "state": "absent"}]
    assert ac.training_nodes(list(views), states, late) == ["probed", "changed"]
    assert ac.training_nodes(list(views), states) == ["probed"]
    hostvars = {"n1": {"__cluster_host": probe},
                "n2": {"__cluster_host": probe, "__container_run": {"changed": True}},
                "n3": {"__cluster_host": probe, "__container_run": {"changed": True},
                       "__nccl_check_job": {"state": "absent"}},
                "n4": {}}
    f = flt.FilterModule().filters()
    assert f["trainyard_unread_nodes"](["n1", "n2", "n3", "n4", "gone"], hostvars) == ["n2", "n4"]
    assert f["trainyard_training_nodes"](["n1", "n2", "n3", "n4", "gone"], hostvars,
                                         [{"item": "n2", "state": "running"}]) == ["n1", "n2"]
