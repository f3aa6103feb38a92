# -*- coding: utf-8 -*-
"""Verdicts of the nccl_check role, on the controller: nccl_check.inter_node and nccl_check.intra_node from the
all-reduce benchmark's parsed result (filter trainyard_allreduce_result) against the role's floors.

Pure: values in, records out (filter_plugins/nccl_check.py hands them to roles/nccl_check/tasks/measure.yml),
unit-tested in tests/unit/plugin_utils/test_allreduce_checks.py.
"""

from __future__ import annotations

_INTER_FIX_FAILED = ("NCCL could not finish an all-reduce between the nodes: check the network.* results above (data "
                     "interface, MTU, reachability), NCCL_SOCKET_IFNAME in {env_file}, and that port {port} is open "
                     "between the nodes; rerun with NCCL_DEBUG=INFO")
_INTER_FIX_SLOW = ("Inter-node bandwidth is below the floor: check the data NIC and its link speed, the nccl_env "
                   "profile (tcp: NCCL_NSOCKS_PERTHREAD/NCCL_SOCKET_NTHREADS; ib: NCCL_IB_HCA), or lower "
                   "nccl_check_min_inter_busbw_gbps")
_INTRA_FIX_FAILED = ("The GPUs of this node could not all-reduce: check nvidia_driver.* and fabricmanager.* results "
                     "(fabric state, NVLink), then nvidia-smi topo -m")
_INTRA_FIX_SLOW = ("Intra-node bandwidth is below the floor: check NVLink state (nvidia-smi nvlink -s), the fabric "
                   "manager, and NCCL_P2P_DISABLE/NCCL_SHM_DISABLE in the env file, or lower "
                   "nccl_check_min_intra_busbw_gbps")


def _record(check, result, floor, details, fixes):
    """One record: details and fixes are (skipped, failed, measured) and (failed, measured)."""
    if result.get("skipped"):
        status, detail = "skip", details[0]
    elif not result.get("ok"):
        status, detail = "fail", details[1]
    else:
        status = "fail" if float(result.get("busbw_gbps") or 0) < float(floor) else "pass"
        detail = details[2]
    return {"check": check, "status": status, "detail": detail, "fix": fixes[1] if result.get("ok") else fixes[0],
            "data": {"busbw_gbps": result.get("busbw_gbps"), "algbw_gbps": result.get("algbw_gbps"),
                     "floor_gbps": floor}}


def _measured(result, where, floor):
    return (f"busbw {result.get('busbw_gbps')} GB/s ({result.get('backend')}, {result.get('world_size')} ranks"
            f"{where}, floor {floor} GB/s)")


def inter_node_record(result, nnodes, floor, rc=None, env_file=None, port=None):
    """nccl_check.inter_node: result, the parsed all-reduce across every node ({skipped: true} on one node); nnodes;
    floor, nccl_check_min_inter_busbw_gbps; rc, the run's exit code; env_file (None: not rendered), port."""
    result = result or {}
    rec = _record("nccl_check.inter_node", result, floor, (
        "one node: no inter-node path to measure",
        f"all-reduce across {nnodes} nodes did not complete (rc {rc}): {result.get('error')}",
        _measured(result, f" on {nnodes} nodes", floor),
    ), (_INTER_FIX_FAILED.format(env_file="the env file" if env_file is None else env_file, port=port),
        _INTER_FIX_SLOW))
    rec["data"]["drift"] = {"nccl_inter_busbw_gbps": result.get("busbw_gbps")}
    return rec


def intra_node_record(result, floor, rc=None):
    """nccl_check.intra_node: result, the parsed all-reduce within the node ({skipped: true} with one process per
    node); floor, nccl_check_min_intra_busbw_gbps; rc, the run's exit code."""
    result = result or {}
    return _record("nccl_check.intra_node", result, floor, (
        "one process per node: no intra-node path to measure",
        f"all-reduce within the node did not complete (rc {rc}): {result.get('error')}",
        _measured(result, "", floor),
    ), (_INTRA_FIX_FAILED, _INTRA_FIX_SLOW))
