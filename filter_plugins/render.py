# -*- coding: utf-8 -*-
"""Filters of the render play (roles nccl_env, deepspeed_config, train_args). Pure functions, importable by tests."""

from __future__ import annotations

import base64
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils"))
import nccl_vars  # noqa: E402  (module_utils/ of this repository, found through the path above)


def _slurped_text(registered):
    """The text of a registered slurp result, or None when the file could not be read."""
    if not isinstance(registered, dict) or registered.get("failed") or "content" not in registered:
        return None
    return base64.b64decode(registered["content"]).decode("utf-8", errors="replace")


def env_consistency(hosts, hostvars, per_node=nccl_vars.PER_NODE, expected_envs=None,
                    slurp_var="__nccl_env_slurp"):
    """hosts (rank order) → {host: {consistent, missing, digest, reference, reference_hosts, diff}}.

    Reads each host's registered slurp of its env file from hostvars; expected_envs is the list (same order as
    hosts) of each host's rendered env, for the per-node lines.
    """
    hosts = list(hosts)
    files = {h: _slurped_text(hostvars[h].get(slurp_var)) for h in hosts}
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


def dict_diff_paths(base, other, prefix=""):
    """Dotted paths where two nested dicts differ (for naming the host whose config differs)."""
    paths: list[str] = []
    if isinstance(base, dict) and isinstance(other, dict):
        for key in sorted(set(base) | set(other), key=str):
            paths += dict_diff_paths(base.get(key, "<absent>"), other.get(key, "<absent>"),
                                     f"{prefix}.{key}" if prefix else str(key))
    elif base != other:
        paths.append(prefix or "<root>")
    return paths


class FilterModule:
    def filters(self):
        return {
            "trainyard_env_consistency": env_consistency,
            "trainyard_argv": argv,
            "trainyard_dict_diff_paths": dict_diff_paths,
        }
