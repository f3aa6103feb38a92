# -*- coding: utf-8 -*-
"""Filter of the network role: whether every worker reached the head's probe listener (read once per play by the
task that stops the listener). The records are built in plugin_utils/netrecords.py of the collection."""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.plugin_utils import netrecords


def network_workers_reached(hostvars, hosts, head):
    """Every node but the head connected to the rendezvous port (its network_checks result, __network_checks)."""
    return netrecords.workers_reached(head, {h: hostvars[h].get("__network_checks") for h in hosts if h in hostvars})


class FilterModule(object):
    def filters(self):
        return {"network_workers_reached": network_workers_reached}
