"""roles/nccl_check runs each node's side with that node's job environment: launch_env (here NCCL_HOSTID per node,
as for nodes sharing a machine) reaches the benchmark's processes on top of the env file, as it reaches the job.
Real roles, real torchrun with gloo on the controller (two local "nodes", two processes each)."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import BIN
from helpers import LocalCluster

pytestmark = pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="needs the controller venv (make venv)")


def test_each_nodes_launch_env_reaches_its_side_of_the_check(tmp_path):
    hosts = ["node1", "node2"]
    hostvars = {h: {"launch_env": {"NCCL_HOSTID": f"host-{h}", "GLOO_SOCKET_IFNAME": "lo"},
                    "cluster_model": {"node_rank": r, "nnodes": 2, "nproc_per_node": 2, "world_size": 4,
                                      "head": "node1", "master_addr": "127.0.0.1", "master_port": 39500,
                                      "hosts_by_rank": hosts, "data_address": "127.0.0.1"}}
                for r, h in enumerate(hosts)}
    c = LocalCluster(tmp_path, nodes=2, nproc=2, hostvars=hostvars, nccl_check_runtime="host",
                     nccl_check_python=sys.executable, nccl_check_size_mb=1, nccl_check_iters=2, nccl_check_warmup=1,
                     nccl_check_backend="gloo", nccl_check_port=39611, nccl_check_timeout=240,
                     nccl_check_min_inter_busbw_gbps=0, nccl_check_min_intra_busbw_gbps=0)
    p = c.run(roles=["nccl_check"])
    assert p.returncode == 0, p.stdout[-4000:]
    inter = c.records(p, "nccl_check.inter_node")
    assert {h: r["status"] for h, r in inter.items()} == {"node1": "pass", "node2": "pass"}, inter
    for h in hosts:
        rw = tmp_path / h / "state" / "train" / "job-rw"
        intra = json.loads((rw / "nccl_check_intra.json").read_text())
        assert intra["nccl_env"].get("NCCL_HOSTID") == f"host-{h}", intra["nccl_env"]
        assert "NCCL_HOSTID=host-%s" % h in c.path(h, "nccl_check.env").read_text()
    # rank 0 of the run across nodes is node1's first process: node1's own environment
    across = json.loads((tmp_path / "node1" / "state" / "train" / "job-rw" / "nccl_check_inter.json").read_text())
    assert across["nccl_env"].get("NCCL_HOSTID") == "host-node1"


def test_a_cluster_below_its_floor_runs_the_bisection_rounds_for_real(tmp_path):
    """Three local "nodes", one process each, a floor no run reaches: the bisection's rounds run real all-reduces
    (tasks/bisect_round.yml: groups of the round side by side, each on its own port) until the search has its verdict;
    every pair it measured is in data.pairwise and the sweep's sizes in the inter-node record."""
    hosts = ["node1", "node2", "node3"]
    hostvars = {h: {"launch_env": {"GLOO_SOCKET_IFNAME": "lo"},
                    "cluster_model": {"node_rank": r, "nnodes": 3, "nproc_per_node": 1, "world_size": 3,
                                      "head": "node1", "master_addr": "127.0.0.1", "master_port": 39500,
                                      "hosts_by_rank": hosts, "data_address": "127.0.0.1"}}
                for r, h in enumerate(hosts)}
    c = LocalCluster(tmp_path, nodes=3, nproc=1, hostvars=hostvars, nccl_check_runtime="host",
                     nccl_check_python=sys.executable, nccl_check_sizes=[0.25, 1], nccl_check_iters=2,
                     nccl_check_warmup=1, nccl_check_backend="gloo", nccl_check_port=39621, nccl_check_timeout=240,
                     nccl_check_bisect_size_mb=0.25, nccl_check_bisect_iters=1, nccl_check_bisect_timeout=120,
                     nccl_check_min_inter_busbw_gbps=1000, nccl_check_min_intra_busbw_gbps=0)
    p = c.run(roles=["nccl_check"])
    inter = c.records(p, "nccl_check.inter_node")
    assert {r["status"] for r in inter.values()} == {"fail"}, inter
    assert "the largest of 2 sizes from 0.25 MiB" in inter["node1"]["detail"], inter["node1"]["detail"]
    assert "; no expectation for " in inter["node1"]["detail"]  # this machine's eth1: virtual, or absent
    bisect = c.records(p, "nccl_check.bisect")
    assert set(bisect) == set(hosts), p.stdout[-4000:]
    data = bisect["node1"]["data"]
    assert data["threshold_gbps"] == 1000 and data["rounds"] >= 2 and len(data["groups"]) >= 3, data
    assert all(v is not None for v in data["groups"].values()), data["groups"]  # every round's all-reduce completed
    # Every node is slow against 1000 GB/s: no node measured fine, so a pair is named, with its figures.
    assert {r["status"] for r in bisect.values()} == {"fail", "pass"}, bisect
    named = [h for h, r in bisect.items() if r["status"] == "fail"]
    assert len(named) == 2 and all("is slow" in bisect[h]["detail"] for h in named), bisect
    pairs = bisect[named[0]]["data"]["pairwise"]["allreduce_pair_busbw_gbps"]
    assert pairs and all(v > 0 for v in pairs.values()), pairs
