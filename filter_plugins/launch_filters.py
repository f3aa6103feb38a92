# -*- coding: utf-8 -*-
"""Pure helpers of the launch role: the per-node job states the torchrun_launch module reports (state=status)
folded into one cluster view with the first failing node and rank (tests/unit/filters/test_launch_filters.py)."""

from __future__ import annotations

import math
import signal

_BIG = 1e18


def _num(value, default=_BIG):
    """A finite number from a record the job could write (an exit record's ended_at), else default: "x", True,
    NaN or a list never raise out of status.yml."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return default
    return float(value)


def _key(failure):
    key = failure.get("sort_key")
    if isinstance(key, (list, tuple)) and key:
        return tuple(_num(k) for k in key)
    return (1.0, _num(failure.get("time_epoch")), _num(failure.get("node_rank"), 0.0), 0.0)


def _node_state(res):
    if not isinstance(res, dict):
        return "unknown"
    if res.get("unreachable"):
        return "unreachable"
    if res.get("failed") and "state" not in res:
        return "error"
    return res.get("state") or "unknown"


_TEARDOWN = (2, 15)  # SIGINT, SIGTERM: torchrun or a user tearing the job down, not a cause


def _agent_failure(node, res):
    """A node whose torchrun agent itself died (no per-rank report in its log), as a failure to rank with the
    others: killed by a signal from outside (OOM killer, kill -9) it is a cause, ordered by when it ended."""
    exit_info = res.get("exit") or {}
    rc = exit_info.get("returncode")
    sig = -rc if isinstance(rc, int) and rc < 0 else None
    # stopped by the fail-fast watcher because another node failed (module_utils/failfast.py): a consequence
    klass = 3 if sig in _TEARDOWN or exit_info.get("peer_stop") else 0 if sig else 1
    try:
        name = signal.Signals(sig).name if sig else None
    except ValueError:
        name = "signal %d" % sig
    ended = exit_info.get("ended_at")
    return {"node": node, "node_rank": res.get("node_rank"), "rank": None, "local_rank": None,
            "exitcode": rc, "signal": name, "log": res.get("log"), "log_tail": res.get("log_tail", ""),
            "traceback": "no torchrun failure report in the log (the agent itself died?)",
            "sort_key": [klass, _num(ended), _num(res.get("node_rank")), _BIG]}


def first_failure(results):
    """results: {node: module result}. The failure to name first (with its node added), or None. Nodes whose
    agent died without a torchrun report compete too: an agent killed from outside is a cause, and the
    connection errors it leaves on the other nodes are its consequences."""
    fails = []
    for node, res in results.items():
        if not isinstance(res, dict):
            continue
        if isinstance(res.get("failure"), dict):
            f = dict(res["failure"])
            f["node"] = node
            f.setdefault("node_rank", res.get("node_rank"))
            f["log"] = res.get("log")
            f["log_tail"] = res.get("log_tail", "")
            fails.append(f)
        elif _node_state(res) == "failed":
            fails.append(_agent_failure(node, res))
    return min(fails, key=_key) if fails else None


def describe_failure(f):
    if not f:
        return ""
    what = "exit code %s" % f.get("exitcode")
    if f.get("signal"):
        what += " (%s)" % f["signal"]
    rank = "rank %s (local rank %s)" % (f.get("rank"), f.get("local_rank")) if f.get("rank") is not None \
        else "its torchrun agent"
    text = "first failure: node %s (node rank %s), %s, %s%s" % (
        f.get("node"), f.get("node_rank"), rank, what, " at %s" % f["time"] if f.get("time") else "")
    tb = (f.get("traceback") or "").strip().splitlines()
    if tb:
        text += "\n  cause: %s" % tb[-1][:300]
    text += "\n  log %s:%s" % (f.get("log"), f.get("node"))
    tail = (f.get("log_tail") or "").strip()
    if tail:
        text += "\n" + "\n".join("  | " + line for line in tail.splitlines())
    return text


def _why(res):
    """Why a node's job ended when the fail-fast watcher stopped it (launch.exit.json's peer_stop), else ''."""
    if not isinstance(res, dict) or _node_state(res) != "failed":
        return ""
    peer = (res.get("exit") or {}).get("peer_stop")
    return str(peer.get("reason") or "")[:300] if isinstance(peer, dict) else ""


def status_summary(hostvars, hosts, reachable=None, var="__job_status"):
    """Fold every node's status into {state, nodes, first_failure, failure_text, lines}.

    state: running (all running), finished (all finished), failed (any failed), partial (a mix without
    failures, e.g. some nodes never launched), unreachable (a node did not answer), absent (no job)."""
    reachable = set(reachable if reachable is not None else hosts)
    results, nodes = {}, []
    for host in hosts:
        res = (hostvars.get(host) or {}).get(var) if host in reachable else {"unreachable": True}
        if res is None:
            res = {"unreachable": True}
        results[host] = res
        nodes.append({"node": host, "node_rank": res.get("node_rank"), "state": _node_state(res),
                      "pid": res.get("pid"), "last_log_line": (res.get("last_log_line") or "")[-200:],
                      "log": res.get("log"), "workers": res.get("workers"), "why": _why(res)})
    states = {n["state"] for n in nodes}
    if "failed" in states:
        overall = "failed"
    elif "unreachable" in states or "error" in states:
        overall = "unreachable"
    elif states == {"running"}:
        overall = "running"
    elif states == {"finished"}:
        overall = "finished"
    elif states == {"absent"}:
        overall = "absent"
    else:
        overall = "partial"
    ff = first_failure({h: r for h, r in results.items() if _node_state(r) == "failed"})
    lines = ["%-24s rank %-4s %-11s %s" % (n["node"], n["node_rank"] if n["node_rank"] is not None else "-",
                                            n["state"], n["why"] or n["last_log_line"]) for n in nodes]
    text = describe_failure(ff)
    if text:
        lines.append(text)
    return {"state": overall, "nodes": nodes, "first_failure": ff, "failure_text": text, "lines": lines}


class FilterModule(object):
    def filters(self):
        return {"launch_status_summary": status_summary}
