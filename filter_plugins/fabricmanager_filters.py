# -*- coding: utf-8 -*-
"""Filters of the fabricmanager role: the package name of the fabric manager for a driver version.

The checks are recorded by action_plugins/fabricmanager_check.py (module_utils/nvidia_smi.py decides them).
"""

from __future__ import annotations


def fabricmanager_package(driver_version, branch_rename=590):
    """The fabric manager package for a driver: nvidia-fabricmanager-<branch> up to 580, nvidia-fabricmanager
    from branch 590 on (NVIDIA dropped the branch from Ubuntu package names)."""
    branch = int(str(driver_version).split(".")[0])
    return "nvidia-fabricmanager" if branch >= int(branch_rename) else "nvidia-fabricmanager-%d" % branch


class FilterModule:
    def filters(self):
        return {"fabricmanager_package": fabricmanager_package}
