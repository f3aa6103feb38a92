# -*- coding: utf-8 -*-
"""Filters of the render play (roles nccl_env, train_args; deepspeed_config builds in plugin_utils/ds_config.py). Pure functions, importable by tests."""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars
# The pure functions of the checks live in plugin_utils/render_checks.py (the roles' actions use them too).
from ansible_collections.trainyard.core.plugins.plugin_utils.render_checks import (  # noqa: F401 - filters and tests use them
    nccl_fabric, nccl_fabric_probe, socket_ifaces, written_text)


def env_consistency(hosts, hostvars, per_node=nccl_vars.PER_NODE, expected_envs=None,
                    registered_var="__nccl_env_write", path_var="nccl_env_file"):
    """hosts (rank order) → {host: {consistent, missing, digest, reference, reference_hosts, diff}} of each host's
    env file (its registered job_files result); expected_envs (hosts' order) is each host's env, for per-node lines."""
    hosts = list(hosts)
    files = {h: written_text(hostvars[h].get(registered_var), hostvars[h].get(path_var)) for h in hosts}
    expected = dict(zip(hosts, expected_envs or []))
    return nccl_vars.consistency(files, list(per_node), expected)


def argv(options, extra=None):
    """An argument list from an ordered {"--option": value} dict and the user's extra list.

    None or False leave an option out, True writes the bare flag, lists become comma-joined, everything else
    str(). An option the user's extra list also gives (as --opt or --opt=value) is left to the user's.
    """
    extra = [str(a) for a in (extra or [])]
    given = {a.split("=", 1)[0] for a in extra if a.startswith("-")}
    out: list[str] = []
    for option, value in (options or {}).items():
        if option in given or value is None or value is False:
            continue
        if value is True:
            out.append(option)
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        out.extend([option, str(value)])
    return out + extra


class FilterModule:
    def filters(self):
        return {
            "trainyard_env_consistency": env_consistency,
            "trainyard_argv": argv,
            "trainyard_nccl_fabric": nccl_fabric,
            "trainyard_nccl_fabric_probe": nccl_fabric_probe,
            "trainyard_written_text": written_text,
        }
