# -*- coding: utf-8 -*-
"""Filter of the network role: whether every worker reached the head's probe listener (read once per play by the
task that stops the listener). The records are built in plugin_utils/netrecords.py of the collection."""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.plugin_utils import netrecords


def network_workers_reached(hostvars, hosts, head):
    """Every node but the head connected to the rendezvous port (its network_checks result, __network_checks)."""
    return netrecords.workers_reached(head, {h: hostvars[h].get("__network_checks") for h in hosts if h in hostvars})


def network_reset_summary(result):
    """The port's line of reset's summary from port_check's stop_job_holders result (skipped: not the head)."""
    r = result if isinstance(result, dict) else {}
    if r.get("skipped"):
        return "not the head: no rendezvous port here"
    verdict = r.get("verdict") or {}
    detail = str(verdict.get("detail", ""))
    if r.get("stopped"):
        return f"{detail} after stopping PID {', '.join(str(p) for p in r['stopped'])} of this tool's job"
    if verdict.get("state") == "other":
        return f"{detail} (left alone: not this tool's job; {verdict.get('fix', '')})"
    return detail


class FilterModule(object):
    def filters(self):
        return {"network_workers_reached": network_workers_reached, "network_reset_summary": network_reset_summary}
