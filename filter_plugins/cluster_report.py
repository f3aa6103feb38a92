# -*- coding: utf-8 -*-
"""The preflight report: every host's check records → one report dict, a node x check table, Markdown.

report.json schema (version 1; filter_plugins/health_page.py and later tools read it):

    {
      "schema": 1,
      "run_id": "20261122T214700Z",            # names the run directory
      "generated": "2026-11-22T21:47:00Z",     # UTC, when the report play ran
      "run_dir": "/abs/path/runs/<run_id>",
      "hosts": ["node1", "node2", ...],         # the trainers, rank 0 first
      "cluster_model": {"node1": {...}, ...},   # the cluster_model fact of every trainer (docs/architecture.md),
                                                # without hosts_by_rank where it is "hosts" (n² names otherwise)
      "checks": ["cluster.python", ...],        # every check name, in first-seen order
      "records": [                              # one per (host, check)
        {"host": "node1", "check": "network.mtu",    # "run" only where it is not the report's run_id
         "status": "pass|fail|warn|skip|pending|unreachable",
         "detail": "what was seen", "fix": "what to do (empty when passed)", "data": {...}}
      ],
      "summary": {"pass": n, "fail": n, "warn": n, "skip": n, "pending": n, "unreachable": n},  # pending: check mode
      "failed": true,                           # any fail or unreachable
      "failures": [record, ...],                # the fail/unreachable records, rank order
      "check_mode": true,                       # the run was a plan (--check, playbooks/plan.yml)
      "plan": {                                 # check mode only: what the run would change, per node
        "node1": [{"task": "nvidia_driver : Configure ...", "kind": "file|package|hold|image|container|job|other",
                   "action": "lineinfile", "summary": "write /etc/environment", "diff": "unified diff text",
                   "digest": "sha256:... (image pulls, from the registry)", "job": {...} (torchrun_launch's plan)}]
      },
      "pending": [record, ...]                  # the pending records: settled by the run, each names its task
    }

A record is "pending" only in check mode: the check reads state that a task of the same run would change
(action plugin preflight_check, pending_on); its fix names that task. Pending is neither a pass nor a failure.

A host that recorded nothing (unreachable, or failed before its first check) gets one record
{"check": "host.reachable", "status": "unreachable"}.

What is the same on every node is written once, so that report.json grows with the records only (under 20 MB at
1,024 nodes, tests/bench/health.py): each record's "run" stamp is the report's run_id, each node's hosts_by_rank is
the report's hosts.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from functools import partial
from typing import Any, Iterable, Mapping

from ansible_collections.trainyard.core.plugins.plugin_utils import cluster_model

SCHEMA = 1
STATUSES = ("pass", "fail", "warn", "skip", "pending", "unreachable")
BAD = ("fail", "unreachable")
MARK = {"pass": "ok", "fail": "FAIL", "warn": "warn", "skip": "skip", "pending": "pend", "unreachable": "UNREACH",
        None: "-"}
REACH_CHECK = "host.reachable"


# Ansible's tagged types as plain JSON values.
_plain = partial(cluster_model._plain, json_safe=True)


def plan_of(plans: Mapping[str, Any] | None, hosts: list[str], records: list[dict]) -> dict:
    """{host: plan entries} for every host (empty list: nothing would change); image pulls get the digest their
    node's container.image_digest record read from the registry (data.registry_digest)."""
    out = {}
    digests: dict[str, Any] = {}  # one pass over the records (not one per host: n² at 1,024 nodes)
    for r in records:
        if isinstance(r.get("data"), dict) and r["data"].get("registry_digest"):
            digests.setdefault(r["host"], r["data"]["registry_digest"])
    for h in hosts:
        digest = digests.get(h)
        entries = []
        for e in (plans or {}).get(h) or []:
            if not isinstance(e, Mapping):
                continue
            e = _plain(dict(e))
            e.setdefault("kind", "other")
            e.setdefault("summary", "")
            e.setdefault("diff", "")
            if e["kind"] == "image" and digest:
                e["digest"] = digest
            entries.append(e)
        out[h] = entries
    return out


def shared_model_keys_out(model: Any, hosts: list[str]) -> Any:
    """A node's cluster_model for the report: without hosts_by_rank where it is the report's hosts (1,024 names
    on each of 1,024 nodes would be half of report.json)."""
    if isinstance(model, dict) and model.get("hosts_by_rank") == hosts:
        return {k: v for k, v in model.items() if k != "hosts_by_rank"}
    return model


def report_models(models: Mapping[str, Any], hosts: list[str]) -> dict:
    """{host: cluster_model} without hosts_by_rank where it is hosts (the validate play's cluster_hosts_by_rank):
    the report play reduces the models before a sharded run's exchange, so no shard writes or reads n x n names."""
    hosts = list(hosts)
    return {h: shared_model_keys_out(m, hosts) for h, m in dict(models or {}).items()}


def build_report(results: Mapping[str, Any], hosts: Iterable[str], models: Mapping[str, Any] | None = None,
                 run_id: str = "", run_dir: str = "", generated: str | None = None,
                 plans: Mapping[str, Any] | None = None, check_mode: bool = False) -> dict:
    """results: {host: preflight_results list or None}; hosts: the trainers (any order); plans: {host: the
    trainyard_plan fact} of a check-mode run (callback_plugins/trainyard_plan.py)."""
    models = {h: _plain(m) for h, m in (models or {}).items() if m}
    given = list(hosts)
    position = {h: i for i, h in enumerate(given)}
    hosts = sorted(given, key=lambda h: ((models.get(h) or {}).get("node_rank", 10**9), position[h]))
    models = {h: shared_model_keys_out(m, hosts) for h, m in models.items()}
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
            if run_id and rec.get("run") == run_id:
                del rec["run"]
            rec.setdefault("detail", "")
            rec.setdefault("fix", "")
            rec.setdefault("data", {})
            if rec.get("status") not in STATUSES:
                rec["status"] = "fail"
                rec["detail"] = f"invalid status {r.get('status')!r}: {rec['detail']}"
            records.append(rec)
    extra = {}
    if check_mode:
        extra = {"plan": plan_of(plans, hosts, records)}
        # A launch that would stop the run (the job runs with another command) fails the plan, named like a check.
        for h in hosts:
            for e in extra["plan"][h]:
                job = e.get("job") if isinstance(e.get("job"), Mapping) else {}
                if job.get("action") == "blocked":
                    records.append({"host": h, "check": "launch.plan", "status": "fail",
                                    "detail": f"the launch would stop the run: {job.get('reason', '')}",
                                    "fix": "stop the running job first: ansible-playbook reset.yml -e reset_confirm=true,"
                                           " or go back to the command it runs with", "data": {}})
        extra["pending"] = [r for r in records if r["status"] == "pending"]
    checks: list[str] = []
    for rec in records:
        if rec["check"] not in checks:
            checks.append(rec["check"])
    # "pending" exists in check mode only (a plan); other runs keep the five counts.
    summary = {s: sum(1 for r in records if r["status"] == s) for s in STATUSES if s != "pending" or check_mode}
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
        "check_mode": bool(check_mode),
        **extra,
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
    lines.append(", ".join(f"{s.get(k, 0)} {k}" for k in STATUSES if k in s))
    return lines


def failure_lines(report: Mapping) -> list[str]:
    return [f"{r['host']}: {r['check']} {r['status'].upper()}: {r.get('detail', '')}"
            + (f" | Fix: {r['fix']}" if r.get("fix") else "") for r in report.get("failures") or []]


def pending_lines(report: Mapping) -> list[str]:
    return [f"{r['host']}: {r['check']} pending: {r.get('detail', '')} | {r.get('fix', '')}"
            for r in report.get("pending") or []]


def plan_lines(report: Mapping, diffs: bool = False) -> list[str]:
    """The plan per node as text lines (with each file's diff when diffs)."""
    if not report.get("check_mode"):
        return []
    plan = report.get("plan") or {}
    out = []
    for h in report.get("hosts") or []:
        entries = plan.get(h) or []
        changes = [e for e in entries if e.get("changed", True)]
        out.append(f"{h}: {len(changes)} change(s)" if changes else f"{h}: no change")
        for e in entries:
            out.append(f"  {e['kind']}: {e['summary']}" + ("" if e.get("changed", True) else " (no change)") + (f" [{e['digest']}]" if e.get("digest") else "")
                       + f" (task: {e.get('task', '?')})")
            if diffs and e.get("diff"):
                out.extend("    " + line for line in str(e["diff"]).rstrip("\n").splitlines())
    return out


def plan_verdict(report: Mapping) -> str:
    """One line for the end of a plan: how many changes, pending checks and failures that would remain."""
    plan = report.get("plan") or {}
    changes = sum(1 for v in plan.values() for e in v if e.get("changed", True))
    nodes = sum(1 for v in plan.values() if any(e.get("changed", True) for e in v))
    s = report.get("summary") or {}
    return (f"Plan: {changes} change(s) on {nodes} of {len(report.get('hosts') or [])} node(s), "
            f"{s.get('pending', 0)} check(s) pending on them, "
            + (f"{len(report.get('failures') or [])} failure(s) the run would not fix"
               if report.get("failed") else "nothing that would still fail"))


def warning_lines(report: Mapping) -> list[str]:
    return [f"{r['host']}: {r['check']} warn: {r.get('detail', '')}" for r in report.get("records") or []
            if r["status"] == "warn"]


def _md_cell(text) -> str:
    """A value for a Markdown table cell: pipes escaped, one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(report: Mapping) -> str:
    """The report as Markdown: summary, node x check table, failures with fixes, every record."""
    hosts = list(report.get("hosts") or [])
    checks = list(report.get("checks") or [])
    cells = {(r["host"], r["check"]): r["status"] for r in report.get("records") or []}
    models = report.get("cluster_model") or {}
    esc = _md_cell
    s = report.get("summary") or {}
    out = [f"# Preflight report {report.get('run_id', '')}", "",
           f"Generated {report.get('generated', '')}; {len(hosts)} nodes; "
           + ", ".join(f"{s.get(k, 0)} {k}" for k in STATUSES if k in s)
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
    if report.get("check_mode"):
        out += ["", "## Plan (check mode: nothing was changed)", "", plan_verdict(report), ""]
        plan = report.get("plan") or {}
        for h in hosts:
            entries = plan.get(h) or []
            out.append(f"### {esc(h)}")
            out.append("")
            if not any(e.get("changed", True) for e in entries):
                out += ["No change.", ""]
            for e in entries:
                out.append(f"- **{e['kind']}** {esc(e['summary'])}" + ("" if e.get("changed", True) else " (no change)")
                           + (f" — digest `{e['digest']}`" if e.get("digest") else "")
                           + f" (task `{esc(e.get('task', '?'))}`)")
                if e.get("diff"):
                    out += ["", "  ```diff", *("  " + line for line in str(e["diff"]).rstrip("\n").splitlines()),
                            "  ```"]
            out.append("")
        out += ["### Pending checks", ""]
        out += [f"- **{esc(r['host'])}** `{r['check']}`: {esc(r.get('detail', ''))} — {esc(r.get('fix', ''))}"
                for r in report.get("pending") or []] or ["None."]
    if report.get("recover"):
        out += recover_markdown(report["recover"])
    out += ["", "## All checks", "", "| node | check | status | detail | fix |", "|---|---|---|---|---|"]
    out += [f"| {esc(r['host'])} | {r['check']} | {r['status']} | {esc(r.get('detail', ''))} | {esc(r.get('fix', ''))} |"
            for r in report.get("records") or []]
    return "\n".join(out) + "\n"


def recover_markdown(section: Mapping) -> list[str]:
    """The "recover" section of a playbooks/recover.yml run (module_utils/recover.py report_section) as Markdown:
    the dropped nodes and why, the new rank map (head marked), the world sizes, the checkpoint and how it resumes."""
    esc = _md_cell
    head = section.get("head", "")
    moved = (f"moved from {section.get('old_head', '')}" if section.get("head_moved") else "unchanged")
    out = ["", "## Recover", "", esc(section.get("summary", "")), "",
           f"World size {section.get('world_size_before')} -> {section.get('world_size')}; head {esc(head)} ({moved}).",
           "", "### Dropped nodes", ""]
    dropped = section.get("dropped") or []
    if dropped:
        out += ["| node | old rank | why | detail |", "|---|---|---|---|"]
        out += [f"| {esc(d.get('host'))} | {d.get('old_rank')} | "
                + (f"failed preflight: {esc(', '.join(d['checks']))}" if d.get("checks") else esc(d.get("why", "")))
                + f" | {esc(d.get('detail', ''))} |" for d in dropped]
    else:
        out.append("None: every node answered and passed its preflight.")
    out += ["", "### Rank map", "", "| node | node rank | old rank |", "|---|---|---|"]
    out += [f"| {esc(r.get('host'))}{' (head)' if r.get('head') else ''} | {r.get('node_rank')} | {r.get('old_rank')} |"
            for r in section.get("ranks") or []]
    resume = section.get("resume") or {}
    out += ["", "### Checkpoint", "",
            f"- checkpoint: `{esc(section.get('checkpoint') or 'none')}`",
            f"- resume: {resume.get('mode', '')}: {esc(resume.get('how', ''))}"]
    if resume.get("optimizer") == "fresh":
        out.append("- the optimizer starts fresh (weights only, chosen with launch_recover_resume=weights)")
    return out


_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def cluster_latest(inventory_dir: str | None) -> str:
    """The name of this cluster's newest-run link under runs/: latest-<cluster>, after the inventory directory
    (inventory/<cluster>/, the layout the docs use), or latest (the newest run of any inventory) when that
    directory's name is not a plain file name."""
    cluster = os.path.basename(str(inventory_dir or "").rstrip("/"))
    return "latest-" + cluster if _CLUSTER_NAME.match(cluster) and cluster not in (".", "..") else "latest"


def run_links(run_path: str, inventory_dir: str | None = None) -> list[dict]:
    """The links a run's report directory gets under runs/ (job_files' links): runs/latest, the newest run of any
    inventory, and runs/latest-<cluster> (cluster_latest), the newest of this cluster: what playbooks/export.yml
    reads, so that a run on another cluster from the same checkout does not take its place. None outside runs/ (a
    cluster_run_dir of the user's)."""
    parent, name = os.path.split(str(run_path).rstrip("/"))
    if os.path.basename(parent) != "runs":
        return []
    names = dict.fromkeys(["latest", cluster_latest(inventory_dir)])
    return [{"path": parent + "/" + link, "target": name} for link in names]


class FilterModule:
    def filters(self):
        return {
            "trainyard_preflight_report": build_report,
            "trainyard_report_models": report_models,
            "trainyard_report_table": table,
            "trainyard_report_failures": failure_lines,
            "trainyard_report_warnings": warning_lines,
            "trainyard_report_markdown": markdown,
            "trainyard_report_plan": plan_lines,
            "trainyard_report_pending": pending_lines,
            "trainyard_report_plan_verdict": plan_verdict,
            "trainyard_run_links": run_links,
            "trainyard_cluster_latest": cluster_latest,
        }
