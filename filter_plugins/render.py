# -*- coding: utf-8 -*-
"""Filters of the render play (train_args' argument list, the text a job_files answer wrote or read). Pure functions,
importable by tests; the roles' checks are built in plugin_utils/render_checks.py, nccl_vars.py and ds_config.py."""

from __future__ import annotations

# The pure functions of the checks live in plugin_utils/render_checks.py (the roles' actions use them too).
from ansible_collections.trainyard.core.plugins.plugin_utils.render_checks import written_text


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
            "trainyard_argv": argv,
            "trainyard_written_text": written_text,
        }
