# -*- coding: utf-8 -*-
"""Filters of the burn-in (docs/burn-in.md): the report with the nodes playbooks/exclude.yml left out and its lines
(plugin_utils/bad_machines.py), and how long the chosen tier takes on the cluster (module_utils/burnin.py), which
playbooks/plan.yml prints."""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.module_utils import burnin
from ansible_collections.trainyard.core.plugins.plugin_utils import bad_machines as bm


def exclusion_lines(report):
    """The exclusion as lines for the screen and report.md: the summary, each left-out node with its failing check,
    the remembered machines, where the record is."""
    ex = (report or {}).get("exclusion") or {}
    if not ex:
        return []
    lines = [ex.get("summary") or ""]
    lines += ["left out: %s (machine %s, %s): %s" % (e["host"], e.get("id") or "unknown", e["reason"],
                                                     "; ".join(e.get("checks") or []))
              for e in ex.get("excluded") or []]
    lines += list(ex.get("notes") or [])
    if ex.get("record_path"):
        lines.append("record of bad machines: %s (clear: -e cluster_clear_bad_machines=<id|node|all>)"
                     % ex["record_path"])
    return [line for line in lines if line]


class FilterModule:
    def filters(self):
        return {"trainyard_report_exclusion": bm.report_view, "trainyard_report_exclusion_lines": exclusion_lines,
                "trainyard_burnin_estimate": burnin.estimate}
