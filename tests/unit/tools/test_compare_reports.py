"""tests/tools/compare_reports.py: two report.json files agree on check ids, statuses and totals, whatever their
times, run ids and values; every kind of difference is named; a file that is not a report is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import REPO, load

cr = load("tests/tools/compare_reports.py", "compare_reports")
TOOL = [sys.executable, str(REPO / "tests/tools/compare_reports.py")]


def report(**over):
    r = {"schema": 1, "run_id": "20261127T060000Z", "generated": "2026-11-27T06:00:00Z", "run_dir": "/a/runs/x",
         "hosts": ["node1", "node2"], "checks": ["network.mtu", "cluster.python"],
         "records": [{"host": "node1", "check": "network.mtu", "status": "pass", "detail": "9000", "data": {"s": 1}},
                     {"host": "node2", "check": "network.mtu", "status": "pass", "detail": "9000"},
                     {"host": "node1", "check": "cluster.python", "status": "warn", "detail": "3.10"},
                     {"host": "node2", "check": "cluster.python", "status": "pass", "detail": "3.12"}],
         "summary": {"pass": 3, "fail": 0, "warn": 1, "skip": 0, "pending": 0, "unreachable": 0}, "failed": False}
    r.update(over)
    return r


def test_times_ids_details_and_values_are_ignored():
    after = report(run_id="20261127T070000Z", generated="2026-11-27T07:00:00Z", run_dir="/b/runs/y")
    after["records"] = [dict(r, detail="other", data={"s": 2}) for r in reversed(after["records"])]
    assert cr.compare(report(), after) == {"same": True, "differences": [], "before": cr.essence(report()),
                                           "after": cr.essence(after)}


def test_every_kind_of_difference_is_named():
    after = report(checks=["network.mtu", "gpu.count"], failed=True,
                   summary={"pass": 2, "fail": 1, "warn": 1, "skip": 0, "pending": 0, "unreachable": 0})
    after["records"] = [r for r in after["records"] if r["check"] != "cluster.python"]
    after["records"][1] = dict(after["records"][1], status="fail")
    after["records"].append({"host": "node1", "check": "gpu.count", "status": "warn"})
    assert cr.compare(report(), after)["differences"] == [
        "check cluster.python: only before", "check gpu.count: only after",
        "record node1 cluster.python: warn before, - after", "record node1 gpu.count: - before, warn after",
        "record node2 cluster.python: pass before, - after", "record node2 network.mtu: pass before, fail after",
        "total fail: 0 before, 1 after", "total pass: 3 before, 2 after", "failed: False before, True after"]


def test_the_command_exits_by_the_verdict_and_writes_the_comparison(tmp_path):
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "cmp.json"
    a.write_text(json.dumps(report()))
    b.write_text(json.dumps(report(generated="later")))
    p = subprocess.run([*TOOL, str(a), str(b), "--json", str(out)], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("same: 2 check ids, 4 records"), p.stdout + p.stderr
    assert json.loads(out.read_text())["same"] is True
    b.write_text(json.dumps(report(failed=True)))
    p = subprocess.run([*TOOL, str(a), str(b)], capture_output=True, text=True)
    assert p.returncode == 1 and p.stdout == "failed: False before, True after\n"


def test_a_file_that_is_not_a_report_is_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{\"schema\": 2}")
    for path in (bad, tmp_path / "missing.json"):
        p = subprocess.run([*TOOL, str(path), str(path)], capture_output=True, text=True)
        assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert str(path) in p.stderr and "report.json" in p.stderr
