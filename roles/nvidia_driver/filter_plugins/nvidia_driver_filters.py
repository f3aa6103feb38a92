# -*- coding: utf-8 -*-
"""Filters of the nvidia_driver role: the node's checks as preflight records, from every node's GPU facts.

The logic is in module_utils/nvidia_smi.py (pure, unit-tested in tests/unit/test_nvidia_smi.py); this file
only hands it the play's host variables.
"""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.module_utils import gpu_health, nvidia_smi


def _facts_of(hosts, hostvars) -> dict:
    out = {}
    for h in hosts:
        try:
            out[h] = hostvars[h].get("nvidia_gpu_facts") or None
        except (KeyError, AttributeError):
            out[h] = None
    return out


def nvidia_driver_records(host, play_hosts, hostvars, opts):
    """This node's nvidia_driver checks (list of preflight records) given every play host's nvidia_gpu_facts."""
    all_facts = _facts_of(play_hosts, hostvars)
    return nvidia_smi.driver_records(host, all_facts.get(host), all_facts, dict(opts or {}))


def nvidia_driver_health_records(host, result, opts):
    """The nvidia_driver.xid, .ecc and .throttle records of one node from the health of its nvidia_gpu_facts result."""
    return gpu_health.health_records(host, result, dict(opts or {}))


class FilterModule:
    def filters(self):
        return {
            "nvidia_driver_records": nvidia_driver_records,
            "nvidia_driver_health_records": nvidia_driver_health_records,
        }
