"""Filters of the nccl_check role: the benchmark's result line, the expected bandwidth
(plugin_utils/bandwidth_expect.py), the bisection's rounds (plugin_utils/allreduce_bisect.py), the role's records (plugin_utils/allreduce_checks.py) and the
built-in GPU stress's (plugin_utils/gpu_stress_checks.py)."""

from __future__ import annotations

import json

from ansible_collections.trainyard.core.plugins.plugin_utils import allreduce_bisect, bandwidth_expect, gpu_stress_checks
from ansible_collections.trainyard.core.plugins.plugin_utils.allreduce_checks import (
    bisect_record, busy_nodes, inter_node_record, intra_node_record, sweep_sizes)
from ansible_collections.trainyard.core.plugins.plugin_utils import allreduce_checks

PREFIX = "trainyard-allreduce: "


def allreduce_result(registered):
    """Parse a registered benchmark run into {ok, busbw_gbps, algbw_gbps, backend, world_size, error}.

    Skipped runs give {ok: False, skipped: True}. A run that printed no result line is not ok, with the
    last lines of its output as the error.
    """
    registered = registered or {}
    if registered.get("skipped"):
        return {"ok": False, "skipped": True, "error": "skipped"}
    stdout = registered.get("stdout") or ""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PREFIX):
            try:
                data = json.loads(line[len(PREFIX):])
            except ValueError:
                break
            data["ok"] = registered.get("rc", 0) == 0
            data.setdefault("error", "" if data["ok"] else f"exit code {registered.get('rc')}")
            return data
    rc = registered.get("rc")
    tail = (registered.get("stderr") or stdout or "").strip().splitlines()[-6:]
    reason = "timed out (hang)" if rc in (124, 137) else f"exit code {rc}"
    return {"ok": False, "error": f"{reason}: " + " | ".join(tail) if tail else reason}


def expect_inter(registered_by_host, profile, nproc=1):
    """The cluster's inter-node expectation from every node's run across the nodes ({host: registered result}, each
    with the node's data NIC): the slowest node's, with ``per_host``."""
    results = {h: allreduce_result(r) for h, r in (registered_by_host or {}).items()}
    per_host = {h: bandwidth_expect.nic_expectation(r.get("nic"), profile, int(nproc or 1)) for h, r in results.items()}
    ran = next((r for _, r in sorted(results.items()) if r.get("ok")), {})
    # The busbw a hierarchical all-reduce (a tree on 2 nodes) reaches is above the NICs' rate: the expectation for it.
    expect = bandwidth_expect.convert_for_nics(bandwidth_expect.group_expectation(per_host), ran.get("nnodes"),
                                               ran.get("world_size"), ran.get("nccl_env"))
    return dict(expect, per_host=per_host)


def bisect_start(nodes, expect, floor, pass_fraction, inter_record, enabled=True):
    """The bisection's first state: run only when the cluster's inter-node record is not a pass."""
    status = (inter_record or {}).get("status")
    reason = ("" if status in ("warn", "fail") and (inter_record or {}).get("data", {}).get("busbw_gbps") is not None
              else "the inter-node all-reduce did not complete: nothing to compare" if status == "fail"
              else f"the cluster's all-reduce is a {status}: nothing to locate")
    if not enabled:
        reason = "nccl_check_bisect is false"
    return allreduce_bisect.start(nodes, bandwidth_expect.threshold(expect, floor, float(pass_fraction)), reason)


def bisect_advance(state, registered_by_host):
    """The state after a round: each group's figure from its first node's run (a run that did not complete: None)."""
    measured = {}
    for g in (state or {}).get("groups") or []:
        res = allreduce_result((registered_by_host or {}).get(g[0]))
        measured[allreduce_bisect.key(g)] = res.get("busbw_gbps") if res.get("ok") else None
    return allreduce_bisect.advance(state, measured)


def _views(hosts, hostvars):
    """What the run knows of whether the job trains on each node (allreduce_checks.job_states): one look at each."""
    out = {}
    for h in hosts or []:
        if h in hostvars:
            v = hostvars[h]
            out[h] = {"read": v.get("__nccl_check_job"), "probe": v.get("__cluster_host"),
                      "changed": bool((v.get("__container_run") or {}).get("changed"))}
    return out


def unread_nodes(hosts, hostvars):
    """The nodes of ``hosts`` where this run cannot tell yet whether the job trains (they must be read)."""
    states = allreduce_checks.job_states(_views(hosts, hostvars))
    return [h for h in hosts or [] if h in states and states[h] is None]


def training_nodes(hosts, hostvars, late=()):
    """The nodes of ``hosts`` where the job trains (allreduce_checks.training_nodes)."""
    return allreduce_checks.training_nodes(hosts, allreduce_checks.job_states(_views(hosts, hostvars)), late)


class FilterModule:
    def filters(self):
        return {"trainyard_allreduce_result": allreduce_result,
                "trainyard_allreduce_inter_record": inter_node_record,
                "trainyard_allreduce_intra_record": intra_node_record,
                "trainyard_allreduce_expect_inter": expect_inter,
                "trainyard_allreduce_expect_intra": bandwidth_expect.intra_expectation,
                "trainyard_allreduce_bisect_start": bisect_start,
                "trainyard_allreduce_bisect_advance": bisect_advance,
                "trainyard_allreduce_bisect_group": allreduce_bisect.group_of,
                "trainyard_allreduce_bisect_rounds": allreduce_bisect.max_rounds,
                "trainyard_allreduce_bisect_record": bisect_record,
                "trainyard_allreduce_sweep": sweep_sizes,
                "trainyard_busy_nodes": busy_nodes,
                "trainyard_training_nodes": training_nodes,
                "trainyard_unread_nodes": unread_nodes,
                "trainyard_gpu_stress_skip": gpu_stress_checks.skip_reason,
                "trainyard_gpu_stress_records": gpu_stress_checks.records_of,
                "trainyard_gpu_stress_env": gpu_stress_checks.env_args,
                "trainyard_gpu_stress_recorded": gpu_stress_checks.recorded}
