# -*- coding: utf-8 -*-
"""Pure helpers of the reset role's summary on the controller (tests/unit/filters/test_reset_filters.py)."""

from __future__ import annotations


def summary_line(summary):
    """One node's line of reset.yml's summary from its reset_summary fact ({} or none: the node never recorded
    one)."""
    s = summary if isinstance(summary, dict) else {}
    if not s:
        return "UNREACHABLE or failed before cleaning: not reset"
    line = f"found {s.get('found')} | cleaned: {s.get('cleaned')}"
    if s.get("port_report"):
        line += f" | port: {s['port_report']}"
    if s.get("kept"):
        line += f" | kept {len(s['kept'])} matching files of others"
    if s.get("errors"):
        line += " | ERRORS: " + "; ".join(str(e) for e in s["errors"])
    return line


def not_reset(hosts, summaries):
    """The nodes not fully reset, each with why: no reset_summary (unreachable, or failed before its record), or a
    summary that recorded errors. summaries: {host: reset_summary} of the nodes that have one."""
    summaries = summaries if isinstance(summaries, dict) else {}
    out = [f"{h}: unreachable or not reset" for h in hosts if h not in summaries]
    return out + [f"{h}: errors (see summary)" for h in hosts if (summaries.get(h) or {}).get("errors")]


class FilterModule:
    def filters(self):
        return {"reset_summary_line": summary_line, "reset_not_reset": not_reset}
