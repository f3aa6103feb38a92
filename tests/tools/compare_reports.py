#!/usr/bin/env python3
"""Compare two report.json files (filter_plugins/cluster_report.py, schema 1) by what a redesign must keep: the
check ids, each (host, check)'s status, the report's totals and whether it failed. Times, run ids, paths, details,
fixes and data values are ignored: they differ between any two runs.

    python3 tests/tools/compare_reports.py BEFORE.json AFTER.json [--json OUT.json]

Prints one line per difference (or "same: ..."), writes the comparison as JSON with --json, and exits 0 when the
two reports agree, 1 when they differ, 2 on a file that is not a report (one line naming it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


class NotAReport(ValueError):
    pass


def load(path: str | Path) -> dict:
    """The report at path, or NotAReport naming the file and what is wrong."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise NotAReport(f"{path}: not a readable JSON file ({exc}); give a run's report.json (runs/<id>/)") from None
    if not isinstance(report, dict) or report.get("schema") != 1 or not isinstance(report.get("records"), list):
        raise NotAReport(f"{path}: not a report.json of schema 1 (no 'schema': 1 and 'records' list); give a run's "
                         f"report.json (runs/<id>/)")
    return report


def essence(report: dict) -> dict:
    """What the comparison keeps: {"checks": sorted ids, "statuses": {"host check": status}, "summary": {...},
    "failed": bool}."""
    statuses = {}
    for r in report["records"]:
        if isinstance(r, dict):
            statuses[f"{r.get('host')} {r.get('check')}"] = r.get("status")
    checks = report.get("checks") or sorted({r.get("check") for r in report["records"] if isinstance(r, dict)})
    return {"checks": sorted(checks), "statuses": dict(sorted(statuses.items())),
            "summary": dict(sorted((report.get("summary") or {}).items())), "failed": bool(report.get("failed"))}


def compare(before: dict, after: dict) -> dict:
    """{"same": bool, "differences": [lines], "before": essence, "after": essence}."""
    a, b = essence(before), essence(after)
    diff = []
    for check in sorted(set(a["checks"]) - set(b["checks"])):
        diff.append(f"check {check}: only before")
    for check in sorted(set(b["checks"]) - set(a["checks"])):
        diff.append(f"check {check}: only after")
    for key in sorted(set(a["statuses"]) | set(b["statuses"])):
        sa, sb = a["statuses"].get(key, "-"), b["statuses"].get(key, "-")
        if sa != sb:
            diff.append(f"record {key}: {sa} before, {sb} after")
    for key in sorted(set(a["summary"]) | set(b["summary"])):
        na, nb = a["summary"].get(key, 0), b["summary"].get(key, 0)
        if na != nb:
            diff.append(f"total {key}: {na} before, {nb} after")
    if a["failed"] != b["failed"]:
        diff.append(f"failed: {a['failed']} before, {b['failed']} after")
    return {"same": not diff, "differences": diff, "before": a, "after": b}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args(argv)
    try:
        result = compare(load(args.before), load(args.after))
    except NotAReport as exc:
        print(f"compare_reports: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if result["same"]:
        a = result["after"]
        print(f"same: {len(a['checks'])} check ids, {len(a['statuses'])} records, totals {a['summary']}, "
              f"failed {a['failed']}")
    for line in result["differences"]:
        print(line)
    return 0 if result["same"] else 1


if __name__ == "__main__":
    sys.exit(main())
