# -*- coding: utf-8 -*-
"""Filters of the job role's status entry point: per-node progress (steps, speed, ETA, GPUs), stragglers and the
ranks' Python stacks as one table. The logic is in module_utils/job_collect.py (tests/unit/module_utils/test_job_collect.py);
this file hands it the play's host variables (tests/unit/filters/test_launch_progress.py)."""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.module_utils import job_collect


def _res(hostvars, host, key):
    try:
        v = hostvars[host].get(key)
    except (KeyError, AttributeError):
        return {}
    return v if isinstance(v, dict) else {}


def launch_progress_summary(hostvars, hosts, stall_s=300, straggler_ratio=1.3):
    """{nodes, stragglers, stalled, reporting, gpus: {host: [...]}, gpu_skipped: {host: why}} from every node's
    job_progress result (registered as __job_progress)."""
    per_node, gpus, skipped, now = {}, {}, {}, 0.0
    for i, h in enumerate(hosts):
        r = _res(hostvars, h, "__job_progress")
        model = _res(hostvars, h, "cluster_model")
        job = _res(hostvars, h, "__job_status")
        per_node[h] = {"node_rank": model.get("node_rank", i), "ranks": r.get("progress") or [],
                       "state": job.get("state"), "started_at": job.get("started_at"), "now": r.get("now"),
                       "log_mtime": r.get("log_mtime")}
        gpus[h] = r.get("gpus") or []
        skipped[h] = r.get("gpu_skipped") or ("" if r else "no result from the node")
        now = max(now, float(r.get("now") or 0))
    out = job_collect.progress_summary(per_node, now, float(stall_s), float(straggler_ratio))
    out["gpus"], out["gpu_skipped"] = gpus, skipped
    return out


def _fmt(v, spec, empty="-"):
    return empty if v is None else spec % v


def launch_progress_lines(summary, states=None):
    """The status table: one line per node, then the stragglers and a stalled warning."""
    states = states or {}
    rows = [("node", "rank", "state", "step", "steps/s", "ETA", "compute s", "GPU util", "GPU mem", "temp",
             "throttle")]
    for n in summary["nodes"]:
        g = summary["gpus"].get(n["host"]) or []
        if g:
            util = "/".join(_fmt(x.get("util_pct"), "%d%%") for x in g)
            mem = "/".join(_fmt(x.get("mem_used_mib"), "%d") for x in g) + " MiB"
            temp = "/".join(_fmt(x.get("temp_c"), "%dC") for x in g)
            thr = ",".join(sorted({t for x in g for t in (x.get("throttle") or []) if t != "gpu_idle"})) or "none"
        else:
            util = mem = temp = thr = "skip: " + (summary["gpu_skipped"].get(n["host"]) or "no GPU")
            mem = temp = thr = ""
        eta = n.get("eta_s")
        rows.append((n["host"], str(n.get("node_rank")), states.get(n["host"], "?"), _fmt(n.get("last_step"), "%d"),
                     _fmt(n.get("steps_per_s"), "%.2f"),
                     "-" if eta is None else "%dh%02dm%02ds" % (eta // 3600, eta % 3600 // 60, eta % 60),
                     _fmt(n.get("compute_s"), "%.3f"), util, mem, temp, thr))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for s in summary["stragglers"]:
        lines.append("STRAGGLER " + s["text"] + ". fix: " + s["fix"])
    if summary["stalled"]:
        quiet = {n["host"] for n in summary["nodes"] if n.get("no_step")}
        lines.append("STALLED: no progress on %s for at least the stall time: every rank's stack follows"
                     % ", ".join(h + (" (no step recorded and its log silent)" if h in quiet else "")
                                 for h in summary["stalled"]))
    if not summary["reporting"]:
        lines.append("no progress files: the entry point writes none (the example trainers write "
                     "$TRAINYARD_PROGRESS_DIR/rank_<rank>.json)")
    return lines


def launch_stack_lines(hostvars, hosts):
    """Which ranks sit in which call, from every node's stack dumps (registered as __job_stacks)."""
    return job_collect.stack_lines({h: _res(hostvars, h, "__job_stacks").get("stacks") or [] for h in hosts})


def launch_watch_more(status):
    """-e status_watch: refresh again while the job runs on some node and has neither failed nor lost a node (a node
    that finished a moment before the others leaves the job 'partial', not ended)."""
    status = status if isinstance(status, dict) else {}
    return status.get("state") in ("running", "partial") and any(
        n.get("state") == "running" for n in status.get("nodes") or [])


class FilterModule:
    def filters(self):
        return {"launch_progress_summary": launch_progress_summary, "launch_progress_lines": launch_progress_lines,
                "launch_stack_lines": launch_stack_lines, "launch_watch_more": launch_watch_more}
