# -*- coding: utf-8 -*-
"""A node's check records of the run, the host variable ``preflight_results``: where they are kept and how a task's new
records join the earlier ones.

The recording actions (``preflight_check`` and every action that records through ``bases.ControllerAction.record``)
return a task's new records as ``preflight_records``. The callback ``callback_plugins/preflight_records.py`` merges
them, in ansible-playbook's own process, into the node's ``preflight_results``, a variable set like ``set_fact`` sets
one. Kept that way, the records are not facts: Ansible copies a host's whole fact cache, deeply, each time it computes
the host's variables (once per node and task, and once per ``hostvars[node]`` read), and each result carrying the
whole list was copied again for every callback and sent from the worker. Without the callback (an ``ansible.cfg``
without this project's ``callback_plugins``) the action returns the merged list as the fact ``preflight_results``, as
before: the records are never lost. A ``no_log`` task's result reaches the callbacks censored: its new records go
through the fact ``HIDDEN``, which the callback reads for that task.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

VAR = "preflight_results"  # the host variable every reader uses (the report, the exclusion, recover, nccl_check)
RESULT_KEY = "preflight_records"  # a recording task's new records, in its result
CALLBACK_ENV = "TRAINYARD_RECORDS_CALLBACK"  # the PID of the ansible-playbook whose callback keeps the records
# A no_log task's new records, as a fact: Ansible hands the callbacks a no_log result censored, but stores its facts
# first. The fact stays until the next no_log recording task: Keeper.hidden takes only what it does not hold yet.
HIDDEN = "_preflight_records_no_log"


def callback_keeps_records() -> bool:
    """True in a worker of an ansible-playbook whose callback preflight_records is loaded: the callback set
    CALLBACK_ENV to that process's PID before the workers were forked (an inherited value of another process does
    not count)."""
    return os.environ.get(CALLBACK_ENV, "") == str(os.getppid())


def merge(previous, new, run) -> list:
    """previous with new appended: a record of a check in new replaces the earlier one; records of another run
    (a fact cache kept between runs) and anything that is not a record are dropped."""
    names = {r.get("check") for r in new}
    kept = [r for r in previous or []
            if isinstance(r, Mapping) and r.get("check") not in names and r.get("run") == run]
    return kept + list(new)


def is_record(value) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("check"), str) and "status" in value and "run" in value


def of_result(result) -> list:
    """The new records of one task result (each item's for a loop), [] when it recorded none."""
    if not isinstance(result, Mapping):
        return []
    items = result.get("results") if isinstance(result.get("results"), list) else [result]
    out = []
    for item in items:
        recs = item.get(RESULT_KEY) if isinstance(item, Mapping) else None
        if isinstance(recs, list):
            out.extend(r for r in recs if is_record(r))
    return out


class Keeper:
    """The records of every node of this run, as the callback merges them: {host: records}."""

    def __init__(self):
        self.by_host: dict[str, list] = {}

    def add(self, default_host: str, records) -> dict[str, list]:
        """Merge records (each under its own 'host', else default_host); returns {host: merged list} of the hosts
        it changed, to set as their preflight_results."""
        changed: dict[str, list] = {}
        for rec in records:
            host = rec.get("host") if isinstance(rec.get("host"), str) and rec.get("host") else default_host
            current = changed.get(host, self.by_host.get(host))
            changed[host] = merge(current, [rec], rec.get("run"))
        self.by_host.update(changed)
        return changed

    def hidden(self, host: str, facts) -> list:
        """The records of the fact HIDDEN in facts (a node's facts) that are new to host's list: none it holds
        already (the fact outlives its task), none of another run than the one it holds (a fact cache kept between
        runs)."""
        value = facts.get(HIDDEN) if isinstance(facts, Mapping) else None
        held = self.by_host.get(host) or []
        runs = {r.get("run") for r in held}
        return [r for r in value if is_record(r) and r not in held and (not runs or r.get("run") in runs)] \
            if isinstance(value, list) else []

