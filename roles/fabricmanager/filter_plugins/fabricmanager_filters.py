# -*- coding: utf-8 -*-
"""Filters of the fabricmanager role: the node's fabric checks as preflight records.

The logic is in module_utils/nvidia_smi.py (pure, unit-tested in tests/unit/test_nvidia_smi.py).
"""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi


def fabricmanager_records(facts, host, opts):
    """This node's fabricmanager checks (list of preflight records)."""
    return nvidia_smi.fabricmanager_records(host, facts or None, dict(opts or {}))


def fabricmanager_package(driver_version, branch_rename=590):
    """The fabric manager package for a driver: nvidia-fabricmanager-<branch> up to 580, nvidia-fabricmanager
    from branch 590 on (NVIDIA dropped the branch from Ubuntu package names)."""
    branch = int(str(driver_version).split(".")[0])
    return "nvidia-fabricmanager" if branch >= int(branch_rename) else "nvidia-fabricmanager-%d" % branch


class FilterModule:
    def filters(self):
        return {"fabricmanager_records": fabricmanager_records, "fabricmanager_package": fabricmanager_package}
