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

Up to ``FULL_MATRIX_MAX`` nodes the page draws every node x node matrix cell by cell, each node x check cell with its
detail, the drift table per node and the launch map per GPU. Above it the page stays small (a few MB at 1,024 nodes;
report.json and report.md hold every record): each node x node matrix becomes its failing pairs (always every one),
the worst links of a numeric metric and per-node aggregates; the node x check cells carry details only where a check
did not pass or skip; the drift table lists each key's majority and every node that differs; the launch map has one
row per node.

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
# Up to this many nodes every node x node matrix is drawn in full (n² cells); above it, summarised.
FULL_MATRIX_MAX = 32
# The lowest values of a numeric node x node metric listed above FULL_MATRIX_MAX.
WORST_LINKS = 20


def _hosts_in_rank_order(report: dict) -> list[str]:
    order = dict.fromkeys(report.get("hosts") or [])
    for rec in report.get("records") or []:
        order.setdefault(rec.get("host"))
    hosts = list(order)
    position = {h: i for i, h in enumerate(hosts)}
    model = report.get("cluster_model") or {}

    def key(h: str) -> tuple:
        rank = (model.get(h) or {}).get("node_rank")
        return (rank if isinstance(rank, int) and not isinstance(rank, bool) else 10**9, position[h])

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
    position = {h: i for i, h in enumerate(hosts)}
    failures = sorted((r for r in report.get("records") or [] if r.get("status") in ("fail", "unreachable")),
                      key=lambda r: (position.get(r.get("host"), 0), r.get("check", "")))
    return {"hosts": hosts, "checks": checks, "cells": cells, "failures": failures}


def pairwise_matrices(report: dict, full_max: int = FULL_MATRIX_MAX) -> list[dict]:
    """One matrix per metric: {metric, hosts, values: {src: {dst: value}}, numeric, max, full}; above ``full_max``
    nodes (full false) also ``summary`` (summarise_pairwise), which the page draws instead of the n² cells."""
    hosts = _hosts_in_rank_order(report)
    metrics: dict[str, dict[str, dict]] = {}
    for rec in report.get("records") or []:
        for metric, row in ((rec.get("data") or {}).get("pairwise") or {}).items():
            if isinstance(row, dict):
                metrics.setdefault(metric, {}).setdefault(rec.get("host"), {}).update(row)
    out = []
    for metric, values in metrics.items():
        flat = [v for row in values.values() for v in row.values() if v is not None]
        numeric = bool(flat) and all(map(_is_number, flat))
        m = {"metric": metric, "hosts": hosts, "values": values, "numeric": numeric,
             "max": max(flat) if numeric and flat else None, "full": len(hosts) <= full_max}
        if not m["full"]:
            m["summary"] = summarise_pairwise(values, hosts, numeric)
        out.append(m)
    return out


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summarise_pairwise(values: dict, hosts: list[str], numeric: bool, worst: int = WORST_LINKS) -> dict:
    """A node x node metric without its n² cells: {pairs (measured), missing (no value), failing: [{src, dst,
    value}] (every pair whose value is false, rank order, never cut), worst: [{src, dst, value}] (a numeric metric's
    ``worst`` lowest values, lowest first), nodes: [{host, out, in, failing_out, failing_in, min, mean}] (every node,
    the ones with failing links first, then the lowest min, then rank; min and mean over the numeric links from or
    to the node)}."""
    position = {h: i for i, h in enumerate(hosts)}
    nodes = {h: {"host": h, "out": 0, "in": 0, "failing_out": 0, "failing_in": 0, "_nums": []} for h in hosts}
    failing, links, missing, pairs = [], [], 0, 0
    for src, row in values.items():
        for dst, value in (row or {}).items():
            if src == dst:
                continue
            for h in (src, dst):
                nodes.setdefault(h, {"host": h, "out": 0, "in": 0, "failing_out": 0, "failing_in": 0, "_nums": []})
            if value is None:
                missing += 1
                continue
            pairs += 1
            nodes[src]["out"] += 1
            nodes[dst]["in"] += 1
            if value is False:
                failing.append({"src": src, "dst": dst, "value": value})
                nodes[src]["failing_out"] += 1
                nodes[dst]["failing_in"] += 1
            elif numeric and _is_number(value):
                links.append({"src": src, "dst": dst, "value": value})
                nodes[src]["_nums"].append(value)
                nodes[dst]["_nums"].append(value)
    def order(host: str) -> int:
        return position.get(host, len(position))

    failing.sort(key=lambda p: (order(p["src"]), order(p["dst"])))
    worst_links = sorted(links, key=lambda p: (p["value"], order(p["src"]), order(p["dst"])))[:max(0, worst)]
    rows = []
    for n in nodes.values():
        nums = n.pop("_nums")
        n["min"] = min(nums) if nums else None
        n["mean"] = sum(nums) / len(nums) if nums else None
        rows.append(n)
    rows.sort(key=lambda n: (-(n["failing_out"] + n["failing_in"]),
                             n["min"] if n["min"] is not None else float("inf"), order(n["host"])))
    return {"pairs": pairs, "missing": missing, "failing": failing, "worst": worst_links, "nodes": rows}


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


def drift_summary(drift: dict) -> list[dict]:
    """The drift table without a row per node: per key {key, majority (the value most nodes have), nodes (how many
    have it), of (how many report the key), odd: [{host, value}] (every node that differs, rank order)}."""
    out = []
    for key in drift["keys"]:
        have = [h for h in drift["hosts"] if key in drift["values"].get(h, {})]
        odd = [{"host": h, "value": drift["values"][h][key]} for h in have if key in drift["odd"].get(h, ())]
        top = next((drift["values"][h][key] for h in have if key not in drift["odd"].get(h, ())), None)
        out.append({"key": key, "majority": top, "nodes": len(have) - len(odd), "of": len(have), "odd": odd})
    return out


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


def rank_map_by_node(rows: list[dict]) -> list[dict]:
    """The launch map with one row per node: {node_rank, host, data_address, master, gpus: "local rank→GPU (PCI
    bus id), ..."} (the UUIDs stay in report.json)."""
    out: dict[str, dict] = {}
    for r in rows:
        node = out.setdefault(r["host"], {k: r[k] for k in ("node_rank", "host", "data_address", "master")}
                              | {"gpus": []})
        if r["gpu"] != "" or r["local_rank"] != "":
            node["gpus"].append(f"{r['local_rank']}→{r['gpu']}" + (f" ({r['pci_bus_id']})" if r["pci_bus_id"] else ""))
    return [dict(n, count=len(n["gpus"]), gpus=", ".join(n["gpus"])) for n in out.values()]


# ---------------------------------------------------------------------------------------- the all-reduce section
ALLREDUCE_CHECKS = ("nccl_check.inter_node", "nccl_check.intra_node")


def allreduce_section(report: dict) -> dict | None:
    """Measured against expected bus bandwidth (role nccl_check, docs/bandwidth.md): {rows: [{host, check, status,
    measured, expected, fraction, hardware, floor, sizes}] (rank order; the inter-node figure once, it is the
    cluster's), findings: [text] (the bisection's, once), bisect: {host: record}}; None without nccl_check records."""
    hosts = _hosts_in_rank_order(report)
    position = {h: i for i, h in enumerate(hosts)}
    rows, findings, bisect, inter_seen = [], [], {}, False
    for rec in sorted(report.get("records") or [], key=lambda r: (position.get(r.get("host"), 0), r.get("check", ""))):
        check, data = rec.get("check"), rec.get("data") or {}
        if check == "nccl_check.bisect":
            bisect[rec.get("host")] = rec
            for f in data.get("findings") or []:
                if f.get("text") not in findings:
                    findings.append(f.get("text"))
            continue
        if check not in ALLREDUCE_CHECKS or data.get("busbw_gbps") is None:
            continue
        if check == "nccl_check.inter_node":
            if inter_seen:
                continue
            inter_seen = True
        rows.append({"host": "all nodes" if check == "nccl_check.inter_node" else rec.get("host"),
                     "check": check, "status": rec.get("status"), "measured": data.get("busbw_gbps"),
                     "expected": data.get("expected_gbps"), "fraction": data.get("fraction"),
                     "hardware": data.get("expected_for") or "", "floor": data.get("floor_gbps"),
                     "sizes": [(_mib(x.get("bytes")), x.get("busbw_gbps")) for x in data.get("sizes") or []]})
    if not rows and not bisect:
        return None
    return {"rows": rows, "findings": findings, "bisect": bisect}


# ------------------------------------------------------------------------------------------ the exclusion section
def exclusion_section(report: dict) -> dict | None:
    """The nodes left out (cluster_node_failure_policy exclude) or remembered, from the report's ``exclusion``
    (plugin_utils/bad_machines.report_view): {policy, summary, excluded: [{host, id, reason, checks, failing:
    [record]}] (rank order), remembered, notes, record_path, machines (the record's entries)}; None without it."""
    ex = report.get("exclusion") or {}
    if not ex:
        return None
    position = {h: i for i, h in enumerate(_hosts_in_rank_order(report))}
    failing: dict[str, list] = {}
    for rec in report.get("records") or []:
        if rec.get("status") in ("fail", "unreachable"):
            failing.setdefault(rec.get("host"), []).append(rec)
    excluded = [dict(e, failing=sorted(failing.get(e.get("host"), []), key=lambda r: r.get("check", "")))
                for e in sorted(ex.get("excluded") or [], key=lambda e: position.get(e.get("host"), 10**9))]
    return {"policy": ex.get("policy") or "", "summary": ex.get("summary") or "", "excluded": excluded,
            "hosts": [e["host"] for e in excluded], "remembered": list(ex.get("remembered") or []),
            "notes": list(ex.get("notes") or []), "record_path": ex.get("record_path") or "",
            "machines": list(ex.get("machines") or [])}


def _mib(nbytes) -> str:
    mib = float(nbytes or 0) / 2**20
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


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


def render(report: dict, full_matrix_max: int = FULL_MATRIX_MAX) -> str:
    """The page; above ``full_matrix_max`` nodes its node x node matrices, drift table and launch map summarised."""
    env = Environment(loader=FileSystemLoader(str(TEMPLATE_DIR)), autoescape=select_autoescape(["html", "j2"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["heat"] = lambda v, vmax=None: heat_color(v, vmax)
    matrix = node_check_matrix(report)
    full = len(matrix["hosts"]) <= full_matrix_max
    drift = drift_table(report)
    ranks = rank_map(report)
    return env.get_template(TEMPLATE).render(
        report=report, matrix=matrix, pairwise=pairwise_matrices(report, full_matrix_max), full=full,
        full_matrix_max=full_matrix_max, drift=drift, drift_summary=None if full else drift_summary(drift),
        ranks=ranks if full else rank_map_by_node(ranks), summary=summary(report), plan=plan_section(report),
        allreduce=allreduce_section(report), exclusion=exclusion_section(report),
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
