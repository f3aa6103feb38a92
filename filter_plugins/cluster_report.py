# -*- coding: utf-8 -*-
"""The preflight report: every host's check records → one report dict, a node x check table, Markdown.

report.json schema (version 1; filter_plugins/health_page.py and later tools read it):

    {
      "schema": 1,
      "run_id": "20261122T214700Z",            # names the run directory
      "generated": "2026-11-22T21:47:00Z",     # UTC, when the report play ran
      "run_dir": "/abs/path/runs/<run_id>",
      "hosts": ["node1", "node2", ...],         # the trainers, rank 0 first
      "cluster_model": {"node1": {...}, ...},   # the cluster_model fact of every trainer (docs/architecture.md)
      "checks": ["cluster.python", ...],        # every check name, in first-seen order
      "records": [                              # one per (host, check)
        {"host": "node1", "check": "network.mtu", "run": "<run_id>",
         "status": "pass|fail|warn|skip|unreachable",
         "detail": "what was seen", "fix": "what to do (empty when passed)", "data": {...}}
      ],
      "summary": {"pass": n, "fail": n, "warn": n, "skip": n, "unreachable": n},
      "failed": true,                           # any fail or unreachable
      "failures": [record, ...]                 # the fail/unreachable records, rank order
    }

A host that recorded nothing (unreachable, or failed before its first check) gets one record
{"check": "host.reachable", "status": "unreachable"}.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Iterable, Mapping

SCHEMA = 1
STATUSES = ("pass", "fail", "warn", "skip", "unreachable")
BAD = ("fail", "unreachable")
MARK = {"pass": "ok", "fail": "FAIL", "warn": "warn", "skip": "skip", "unreachable": "UNREACH", None: "-"}
REACH_CHECK = "host.reachable"


def _plain(value: Any) -> Any:
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None else str(value)


def build_report(results: Mapping[str, Any], hosts: Iterable[str], models: Mapping[str, Any] | None = None,
                 run_id: str = "", run_dir: str = "", generated: str | None = None) -> dict:
    """results: {host: preflight_results list or None}; hosts: the trainers (any order)."""
    models = {h: _plain(m) for h, m in (models or {}).items() if m}
    given = list(hosts)
    hosts = sorted(given, key=lambda h: ((models.get(h) or {}).get("node_rank", 10**9), given.index(h)))
    records: list[dict] = []
    for h in hosts:
        # The fact cache may still hold records of an earlier run: only this run's count.
        recs = [r for r in results.get(h) or [] if isinstance(r, Mapping)
                and (not run_id or "run" not in r or r.get("run") == run_id)]
        if not recs:
            records.append({"host": h, "check": REACH_CHECK, "status": "unreachable",
                            "detail": "no check results from this node: unreachable, or it failed before its first check",
                            "fix": "make the node reachable over SSH (ansible -m ping), look for its error above, rerun",
                            "data": {}})
            continue
        for r in recs:
            rec = _plain(dict(r))
            rec["host"] = h
            rec.setdefault("detail", "")
            rec.setdefault("fix", "")
            rec.setdefault("data", {})
            if rec.get("status") not in STATUSES:
                rec["status"] = "fail"
                rec["detail"] = f"invalid status {r.get('status')!r}: {rec['detail']}"
            records.append(rec)
    checks: list[str] = []
    for rec in records:
        if rec["check"] not in checks:
            checks.append(rec["check"])
    summary = {s: sum(1 for r in records if r["status"] == s) for s in STATUSES}
    failures = [r for r in records if r["status"] in BAD]
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "generated": generated or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run_dir": run_dir,
        "hosts": hosts,
        "cluster_model": models,
        "checks": checks,
        "records": records,
        "summary": summary,
        "failed": bool(failures),
        "failures": failures,
    }


def table(report: Mapping) -> list[str]:
    """Node x check table as text lines (one row per node, one column per check)."""
    hosts = list(report.get("hosts") or [])
    checks = list(report.get("checks") or [])
    cells = {(r["host"], r["check"]): r["status"] for r in report.get("records") or []}
    unreach = {r["host"] for r in report.get("records") or [] if r["status"] == "unreachable"}
    models = report.get("cluster_model") or {}
    head = ["node", "rank", *checks]
    rows = []
    for h in hosts:
        rank = (models.get(h) or {}).get("node_rank", "-")
        row = [h, str(rank)]
        for c in checks:
            st = cells.get((h, c))
            row.append(MARK["unreachable"] if st is None and h in unreach else MARK.get(st, "-"))
        rows.append(row)
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    fmt = lambda row: "  ".join(str(v).ljust(widths[i]) for i, v in enumerate(row)).rstrip()  # noqa: E731
    lines = [fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows)]
    s = report.get("summary") or {}
    lines.append(", ".join(f"{s.get(k, 0)} {k}" for k in STATUSES))
    return lines


def failure_lines(report: Mapping) -> list[str]:
    return [f"{r['host']}: {r['check']} {r['status'].upper()}: {r.get('detail', '')}"
            + (f" | Fix: {r['fix']}" if r.get("fix") else "") for r in report.get("failures") or []]


def warning_lines(report: Mapping) -> list[str]:
    return [f"{r['host']}: {r['check']} warn: {r.get('detail', '')}" for r in report.get("records") or []
            if r["status"] == "warn"]


def markdown(report: Mapping) -> str:
    """The report as Markdown: summary, node x check table, failures with fixes, every record."""
    hosts = list(report.get("hosts") or [])
    checks = list(report.get("checks") or [])
    cells = {(r["host"], r["check"]): r["status"] for r in report.get("records") or []}
    models = report.get("cluster_model") or {}
    esc = lambda t: str(t).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    s = report.get("summary") or {}
    out = [f"# Preflight report {report.get('run_id', '')}", "",
           f"Generated {report.get('generated', '')}; {len(hosts)} nodes; "
           + ", ".join(f"{s.get(k, 0)} {k}" for k in STATUSES)
           + (" — **FAILED**" if report.get("failed") else " — passed"), "",
           "| node | rank | " + " | ".join(checks) + " |",
           "|---|---|" + "---|" * len(checks)]
    for h in hosts:
        rank = (models.get(h) or {}).get("node_rank", "-")
        out.append(f"| {esc(h)} | {rank} | " + " | ".join(MARK.get(cells.get((h, c)), "-") for c in checks) + " |")
    out += ["", "## Failures", ""]
    fails = report.get("failures") or []
    out += [f"- **{esc(r['host'])}** `{r['check']}` {r['status']}: {esc(r.get('detail', ''))}"
            + (f" — fix: {esc(r['fix'])}" if r.get("fix") else "") for r in fails] or ["None."]
    out += ["", "## All checks", "", "| node | check | status | detail | fix |", "|---|---|---|---|---|"]
    out += [f"| {esc(r['host'])} | {r['check']} | {r['status']} | {esc(r.get('detail', ''))} | {esc(r.get('fix', ''))} |"
            for r in report.get("records") or []]
    return "\n".join(out) + "\n"


class FilterModule:
    def filters(self):
        return {
            "trainyard_preflight_report": build_report,
            "trainyard_report_table": table,
            "trainyard_report_failures": failure_lines,
            "trainyard_report_warnings": warning_lines,
            "trainyard_report_markdown": markdown,
        }
