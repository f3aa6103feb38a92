"""The cluster health page: one self-contained HTML file built from the preflight report.

Input is the preflight report as the report play writes it (report.json):

    {"run_id": "...", "generated": "...", "hosts": ["node1", ...],
     "records": [{"host", "check", "status": "pass|fail|warn|skip|pending|unreachable", "detail", "fix", "data"}],
     "cluster_model": {"node1": {"node_rank": 0, "data_address": "...", ...}, ...},
     "check_mode": true, "plan": {"node1": [{"task", "kind", "summary", "diff", "digest"}]}}   # a plan run only

A check-mode run (site.yml --check, playbooks/plan.yml) also gets the plan section: per node what the run would
change (files with their diff, packages and holds, image pulls with the digest, containers, the job) and the
checks left pending on those changes.

Conventions in a record's ``data`` that the page understands (any role may use them):

* ``pairwise``: ``{metric: {peer_host: value}}`` — one row of a node x node matrix per metric
  (bool: path works or not; number: e.g. bandwidth in GB/s), drawn as a heatmap.
* ``drift``: ``{key: value}`` — a column of the drift table (driver, fabric manager, image digest, env hash...);
  a node whose value differs from the majority is highlighted.
* ``gpu_map``: ``[{"local_rank", "index", "pci_bus_id", "uuid"}]`` — the local rank to GPU map of the node.

Used as a filter (``report | trainyard_health_page``) by the report play, and importable by tests.
"""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
TEMPLATE = "health_page.html.j2"
STATUS_ORDER = {"fail": 0, "unreachable": 1, "warn": 2, "pending": 3, "skip": 4, "pass": 5}


def _hosts_in_rank_order(report: dict) -> list[str]:
    hosts = list(report.get("hosts") or [])
    for rec in report.get("records") or []:
        if rec.get("host") not in hosts:
            hosts.append(rec.get("host"))
    model = report.get("cluster_model") or {}

    def key(h: str) -> tuple:
        rank = (model.get(h) or {}).get("node_rank")
        return (rank if isinstance(rank, int) else 10**9, hosts.index(h))

    return sorted(hosts, key=key)


def node_check_matrix(report: dict) -> dict:
    """{checks: [...], hosts: [...], cells: {host: {check: record}}, failures: [record]}."""
    hosts = _hosts_in_rank_order(report)
    checks: list[str] = []
    cells: dict[str, dict[str, dict]] = {h: {} for h in hosts}
    for rec in report.get("records") or []:
        check = rec.get("check", "?")
        if check not in checks:
            checks.append(check)
        cells.setdefault(rec.get("host"), {})[check] = rec
    failures = sorted((r for r in report.get("records") or [] if r.get("status") in ("fail", "unreachable")),
                      key=lambda r: (hosts.index(r["host"]) if r.get("host") in hosts else 0, r.get("check", "")))
    return {"hosts": hosts, "checks": checks, "cells": cells, "failures": failures}


def pairwise_matrices(report: dict) -> list[dict]:
    """One matrix per metric: {metric, hosts, values: {src: {dst: value}}, numeric, max}."""
    hosts = _hosts_in_rank_order(report)
    metrics: dict[str, dict[str, dict]] = {}
    for rec in report.get("records") or []:
        for metric, row in ((rec.get("data") or {}).get("pairwise") or {}).items():
            if isinstance(row, dict):
                metrics.setdefault(metric, {}).setdefault(rec.get("host"), {}).update(row)
    out = []
    for metric, values in metrics.items():
        flat = [v for row in values.values() for v in row.values() if v is not None]
        numeric = bool(flat) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat)
        out.append({"metric": metric, "hosts": hosts, "values": values, "numeric": numeric,
                    "max": max(flat) if numeric and flat else None})
    return out


def heat_color(value, vmax) -> str:
    """Cell colour: bools green/red; numbers from red (0) to green (vmax); missing grey."""
    if value is None:
        return "#d9d9d9"
    if isinstance(value, bool):
        return "#2e9e4f" if value else "#d6392f"
    if not vmax:
        return "#d6392f"
    frac = max(0.0, min(1.0, float(value) / float(vmax)))
    red, green = int(214 - frac * (214 - 46)), int(57 + frac * (158 - 57))
    return f"#{red:02x}{green:02x}{int(47 + frac * 32):02x}"


def drift_table(report: dict) -> dict:
    """{keys, hosts, values: {host: {key: value}}, odd: {host: {key}}, majority: {key: value}}."""
    hosts = _hosts_in_rank_order(report)
    values: dict[str, dict[str, object]] = {h: {} for h in hosts}
    keys: list[str] = []
    for rec in report.get("records") or []:
        for key, value in ((rec.get("data") or {}).get("drift") or {}).items():
            if key not in keys:
                keys.append(key)
            values.setdefault(rec.get("host"), {})[key] = value
    odd: dict[str, set] = {h: set() for h in values}
    majority: dict[str, object] = {}
    for key in keys:
        seen = Counter(repr(values[h].get(key)) for h in values if key in values[h])
        if not seen:
            continue
        top, _ = seen.most_common(1)[0]
        majority[key] = top
        if len(seen) > 1:
            for h in values:
                if key in values[h] and repr(values[h][key]) != top:
                    odd[h].add(key)
    return {"keys": keys, "hosts": hosts, "values": values, "odd": odd, "majority": majority}


def rank_map(report: dict) -> list[dict]:
    """Rows: node rank → host → data address → local rank → GPU (PCI bus id)."""
    model = report.get("cluster_model") or {}
    gpu_maps: dict[str, list] = {}
    for rec in report.get("records") or []:
        gm = (rec.get("data") or {}).get("gpu_map")
        if isinstance(gm, list):
            gpu_maps[rec.get("host")] = gm
    rows = []
    for host in _hosts_in_rank_order(report):
        m = model.get(host) or {}
        gpus = gpu_maps.get(host) or []
        base = {"node_rank": m.get("node_rank"), "host": host,
                "data_address": m.get("data_address", ""), "master": m.get("master_addr", "")}
        if not gpus:
            rows.append(dict(base, local_rank="", gpu="", pci_bus_id="", uuid=""))
        for g in gpus:
            rows.append(dict(base, local_rank=g.get("local_rank", ""), gpu=g.get("index", ""),
                             pci_bus_id=g.get("pci_bus_id", ""), uuid=g.get("uuid", "")))
    return rows


def summary(report: dict) -> dict:
    counts = Counter(r.get("status") for r in report.get("records") or [])
    return {s: counts.get(s, 0) for s in ("pass", "fail", "warn", "skip", "pending", "unreachable")}


def plan_section(report: dict) -> dict | None:
    """The plan of a check-mode run: {nodes: [{host, entries, pending}], changes, pending}; None otherwise."""
    if not report.get("check_mode"):
        return None
    plan = report.get("plan") or {}
    pending: dict[str, list] = {}
    for rec in report.get("records") or []:
        if rec.get("status") == "pending":
            pending.setdefault(rec.get("host"), []).append(rec)
    nodes = [{"host": h, "entries": list(plan.get(h) or []), "pending": pending.get(h, [])}
             for h in _hosts_in_rank_order(report)]
    for n in nodes:
        n["changes"] = [e for e in n["entries"] if e.get("changed", True)]
    return {"nodes": nodes, "changes": sum(len(n["changes"]) for n in nodes),
            "pending": sum(len(n["pending"]) for n in nodes)}


def render(report: dict) -> str:
    env = Environment(loader=FileSystemLoader(str(TEMPLATE_DIR)), autoescape=select_autoescape(["html", "j2"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["heat"] = lambda v, vmax=None: heat_color(v, vmax)
    return env.get_template(TEMPLATE).render(
        report=report, matrix=node_check_matrix(report), pairwise=pairwise_matrices(report),
        drift=drift_table(report), ranks=rank_map(report), summary=summary(report), plan=plan_section(report),
        status_order=STATUS_ORDER, esc=html.escape)


class FilterModule:
    def filters(self):
        return {"trainyard_health_page": render}


def main(argv: list[str] | None = None) -> int:
    """python3 filter_plugins/health_page.py REPORT.json OUT.html — render a page from a saved report."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    report = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    Path(args[1]).write_text(render(report), encoding="utf-8")
    print(args[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
