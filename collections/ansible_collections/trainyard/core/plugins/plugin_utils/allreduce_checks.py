# -*- coding: utf-8 -*-
"""Verdicts of the nccl_check role, on the controller: nccl_check.inter_node and nccl_check.intra_node from the
all-reduce benchmark's parsed result (filter trainyard_allreduce_result) against what the hardware should do
(plugin_utils/bandwidth_expect.py) and the role's floors; nccl_check.bisect from the bisection's end state
(plugin_utils/allreduce_bisect.py).

Pure: values in, records out (filter_plugins/nccl_check.py hands them to roles/nccl_check/tasks/measure.yml),
unit-tested in tests/unit/plugin_utils/test_allreduce_checks.py.
"""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.plugin_utils.bandwidth_expect import grade
from ansible_collections.trainyard.core.plugins.plugin_utils.cluster_model import MAX_HOSTS_NAMED, hosts_named

_INTER_FIX_FAILED = ("NCCL could not finish an all-reduce between the nodes: check the network.* results above (data "
                     "interface, MTU, reachability), NCCL_SOCKET_IFNAME in {env_file}, and that port {port} is open "
                     "between the nodes; rerun with NCCL_DEBUG=INFO")
_INTER_FIX_SLOW = ("Inter-node bandwidth is below what the hardware should do or the floor: nccl_check.bisect names "
                   "the slow node or link; check the data NIC and its link speed, the nccl_env profile (tcp: "
                   "NCCL_NSOCKS_PERTHREAD/NCCL_SOCKET_NTHREADS; ib: NCCL_IB_HCA), or lower "
                   "nccl_check_min_inter_busbw_gbps / nccl_check_expect_pass_fraction (docs/bandwidth.md)")
_INTRA_FIX_FAILED = ("The GPUs of this node could not all-reduce: check nvidia_driver.* and fabricmanager.* results "
                     "(fabric state, NVLink), then nvidia-smi topo -m")
_INTRA_FIX_SLOW = ("Intra-node bandwidth is below what the hardware should do or the floor: check NVLink state "
                   "(nvidia-smi nvlink -s), the fabric manager, and NCCL_P2P_DISABLE/NCCL_SHM_DISABLE in the env "
                   "file, or lower nccl_check_min_intra_busbw_gbps / nccl_check_expect_pass_fraction "
                   "(docs/bandwidth.md)")


def job_states(views):
    """Whether the job trains on each node, from what this run knows of it. ``views``: {host: {read, probe, changed}}
    - read: the registered result of the role's torchrun_launch status read (tasks/busy_read.yml; absent where the
      node did not read, skipped where the role wants no answer);
    - probe: the registered result of the cluster role's probe at the start of the run (host_facts; its ``job``,
      {name, state, processes}, is there where the probe was asked, i.e. where the role wants the answer);
    - changed: whether the container role changed the node's training container after that probe (a restart ends a
      job that ran in it, so the probe's answer is stale).
    Returns {host: state}: the read's state, else the probe's (running, stopped, absent), None where the run cannot
    tell (no probe, an unreadable record, a container changed since: the node must be read), "" where the probe was
    not asked (nccl_check off, or nccl_check_while_running: nothing to read)."""
    out = {}
    for host, v in views.items():
        read = v.get("read") if isinstance(v.get("read"), dict) else {}
        probe = v.get("probe") if isinstance(v.get("probe"), dict) else None
        if "state" in read:
            out[host] = read["state"]
        elif read.get("skipped"):  # the read's own conditions: nccl_check off or nccl_check_while_running
            out[host] = ""
        elif probe is None or "time" not in probe:  # no probe in this run, or one that failed
            out[host] = None
        elif "job" not in probe:
            out[host] = ""
        else:
            state = (probe["job"] or {}).get("state") if isinstance(probe["job"], dict) else None
            out[host] = None if state in (None, "unknown") or v.get("changed") else state
    return out


def training_nodes(hosts, states, late=()):
    """The nodes of ``hosts`` where the job trains: ``states`` (job_states), and for the nodes it could not tell the
    reads made later, node by node (``late``: the loop results of busy.yml's read, each with its ``item``, the node)."""
    late_state = {r.get("item"): r.get("state") for r in late or [] if isinstance(r, dict)}
    return [h for h in hosts or [] if (states.get(h) if states.get(h) is not None else late_state.get(h)) == "running"]


def busy_nodes(busy_hosts, play_hosts=None, limit=MAX_HOSTS_NAMED):
    """Where the job trains, for a record's detail: at most ``limit`` nodes named, the rest counted
    (cluster_model.hosts_named), so that every node's record stays the same size at any cluster size (each node's
    record would otherwise name every node: O(n) a node, O(n^2) in report.json). 'node1, node2' /
    'all 64 nodes (node1, ... node8 and 56 more)' / '3 of 64 nodes (node1, node2, node3)'."""
    busy = [str(h) for h in busy_hosts or []]
    total = len(play_hosts) if play_hosts is not None else len(busy)
    named = hosts_named(busy, limit)
    if len(busy) <= limit and (play_hosts is None or len(busy) == total):
        return named
    count = f"all {total} nodes" if len(busy) == total else f"{len(busy)} of {total} nodes"
    return f"{count} ({named})"


def _record(check, result, floor, details, fixes, expect, fractions):
    """One record: details and fixes are (skipped, failed, where) and (failed, measured)."""
    if (expect or {}).get("gbps") and result.get("backend") not in (None, "nccl"):
        # The table is NCCL's on GPUs: a gloo run on CPUs (the simulated cluster) is not held to it.
        expect = dict(expect, gbps=None, reason=f"measured with {result.get('backend')}; the table is NCCL's")
    data = {"busbw_gbps": result.get("busbw_gbps"), "algbw_gbps": result.get("algbw_gbps"), "floor_gbps": floor,
            "expected_gbps": (expect or {}).get("gbps"), "expected_for": (expect or {}).get("hardware"),
            "expected_source": (expect or {}).get("source"),
            "sizes": [{"bytes": x.get("bytes"), "busbw_gbps": x.get("busbw_gbps")} for x in result.get("sizes") or []]}
    if result.get("skipped"):
        status, detail = "skip", details[0]
    elif not result.get("ok"):
        status, detail = "fail", details[1]
    else:
        status, text = grade(result.get("busbw_gbps") or 0, expect, floor, *map(float, fractions))
        if data["expected_gbps"]:
            data["fraction"] = round(float(result.get("busbw_gbps") or 0) / float(data["expected_gbps"]), 3)
        detail = f"busbw {text} ({result.get('backend')}, {result.get('world_size')} ranks{details[2]}{_sweep(result)})"
    return {"check": check, "status": status, "detail": detail,
            "fix": fixes[1] if result.get("ok") else fixes[0], "data": data}


def _mib(nbytes) -> str:
    mib = float(nbytes or 0) / 2**20
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


def _sweep(result) -> str:
    """", 1 GiB, the largest of 6 sizes from 1 MiB": the size the verdict reads (busbw of the largest message, as
    people compare nccl-tests' large-message busbw, not its "Avg bus bandwidth" over every size)."""
    sizes = result.get("sizes") or []
    if len(sizes) < 2:
        return f", {_mib(result.get('bytes'))}" if result.get("bytes") else ""
    return f", {_mib(sizes[-1].get('bytes'))}, the largest of {len(sizes)} sizes from {_mib(sizes[0].get('bytes'))}"


def inter_node_record(result, nnodes, floor, rc=None, env_file=None, port=None, expect=None, fractions=(0.8, 0.5)):
    """nccl_check.inter_node: result, the parsed all-reduce across every node ({skipped: true} on one node); nnodes;
    floor, nccl_check_min_inter_busbw_gbps; rc, the run's exit code; env_file (None: not rendered), port; expect,
    the cluster's expectation (filter trainyard_allreduce_expect_inter); fractions, (pass, warn)."""
    result = result or {}
    rec = _record("nccl_check.inter_node", result, floor, (
        "one node: no inter-node path to measure",
        f"all-reduce across {nnodes} nodes did not complete (rc {rc}): {result.get('error')}",
        f" on {nnodes} nodes",
    ), (_INTER_FIX_FAILED.format(env_file="the env file" if env_file is None else env_file, port=port),
        _INTER_FIX_SLOW), expect, fractions)
    rec["data"]["drift"] = {"nccl_inter_busbw_gbps": result.get("busbw_gbps")}
    rel = (expect or {}).get("relation") or {}
    if rel.get("algorithm") and result.get("ok") and result.get("busbw_gbps") is not None:
        # What each NIC carried (bandwidth_expect.nic_relation): the ring's busbw / NICs, a tree's busbw x (k-1)/(n-1).
        per_nic = round(float(result["busbw_gbps"]) * rel["per_nic_factor"], 3)
        rec["data"].update(per_nic_gbps=per_nic, nic_relation=rel)
        rec["detail"] += f"; per NIC {per_nic:g} GB/s over {rel['nics']} NIC(s) per node ({rel['text']})"
    return rec


def intra_node_record(result, floor, rc=None, expect=None, fractions=(0.8, 0.5)):
    """nccl_check.intra_node: result, the parsed all-reduce within the node ({skipped: true} with one process per
    node); floor, nccl_check_min_intra_busbw_gbps; rc, the run's exit code; expect, this node's expectation (filter
    trainyard_allreduce_expect_intra); fractions, (pass, warn)."""
    result = result or {}
    return _record("nccl_check.intra_node", result, floor, (
        "one process per node: no intra-node path to measure",
        f"all-reduce within the node did not complete (rc {rc}): {result.get('error')}",
        "",
    ), (_INTRA_FIX_FAILED, _INTRA_FIX_SLOW), expect, fractions)


_BISECT_FIX = ("Fix or leave out the node named (its NIC, cable, switch port: ethtool, ip -s link, ibstat), or the "
               "link between the two nodes named; rerun ansible-playbook playbooks/nccl_check.yml to confirm")


def bisect_record(host, state, expect=None):
    """nccl_check.bisect of one node: the end state of the bisection (plugin_utils/allreduce_bisect.py start/advance)
    and the cluster's inter-node expectation. Fail on a node a finding names; its pairs' figures in data.pairwise
    (a pair that did not complete: 0)."""
    state = state or {}
    limit = state.get("threshold_gbps")
    pairs = {}
    for k, v in (state.get("history") or {}).items():
        members = k.split(",")
        if len(members) == 2 and host in members:
            pairs[members[1 - members.index(host)]] = 0.0 if v is None else v
    data = {"pairwise": {"allreduce_pair_busbw_gbps": pairs}, "threshold_gbps": limit,
            "expected_gbps": (expect or {}).get("gbps"), "expected_for": (expect or {}).get("hardware"),
            "groups": state.get("history") or {}, "rounds": state.get("rounds", 0),
            "findings": state.get("findings") or []}
    rec = {"check": "nccl_check.bisect", "data": data, "fix": ""}
    if state.get("reason"):
        return dict(rec, status="skip", detail=f"no bisection: {state['reason']}")
    if not state.get("done"):
        return dict(rec, status="warn", fix=_BISECT_FIX,
                    detail=f"the bisection stopped after {state.get('rounds')} rounds without a verdict "
                           f"(nccl_check_bisect_max_rounds); groups measured: {len(data['groups'])}")
    findings = state.get("findings") or []
    mine = [f for f in findings if host in f.get("nodes", []) and f.get("kind") != "none"]
    below = f"below {limit:g} GB/s" if limit else "slow"
    if mine:
        return dict(rec, status="fail", fix=_BISECT_FIX, detail="; ".join(f["text"] for f in mine) + f" ({below})")
    named = [f for f in findings if f.get("kind") != "none"]
    if named:
        return dict(rec, status="pass",
                    detail=f"not named; the bisection named: {'; '.join(f['text'] for f in named)} ({below})")
    return dict(rec, status="warn", fix=_BISECT_FIX,
                detail="no node or link named: " + ("; ".join(f["text"] for f in findings)
                                                    or "every group measured fine") + f" ({below})")


def sweep_sizes(largest_mb, smallest_mb=1):
    """The sweep's sizes in MiB, x4 apart from ``smallest_mb`` up to ``largest_mb`` (always the last): 1, 4, 16, 64,
    256, 1024 by default (nccl-tests sweeps x2; x4 keeps the run short with the same span)."""
    largest, size = float(largest_mb), float(smallest_mb)
    if size <= 0 or largest <= 0:
        raise ValueError(f"nccl_check_size_mb {largest_mb} and nccl_check_sweep_min_mb {smallest_mb}: both above 0")
    sizes = []
    while size < largest:
        sizes.append(size)
        size *= 4
    return sizes + [largest]
