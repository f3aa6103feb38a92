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
import secrets
from collections.abc import Mapping

VAR = "preflight_results"  # the host variable every reader uses (the report, the exclusion, recover, nccl_check)
RESULT_KEY = "preflight_records"  # a recording task's new records, in its result
CALLBACK_ENV = "TRAINYARD_RECORDS_CALLBACK"  # the PID of the ansible-playbook whose callback keeps the records
# A no_log task's new records, as a fact: Ansible hands the callbacks a no_log result censored, but stores its facts
# first. The fact stays until the next no_log recording task: Keeper.hidden takes only what it does not hold yet.
HIDDEN = "_preflight_records_no_log"


# The values a task publishes for later tasks (network_iface, nvidia_gpu_facts, nccl_env_file, train_args_argv, ...),
# kept out of the fact cache the same way: the project's ansible.cfg sets inject_facts_as_vars = False (ansible-core
# 2.20 deprecates the injection, and injecting costs a copy of the host's facts at each computation of its
# variables), so a value left a fact would be only ansible_facts.<name>. An action publishes through publish(): with
# the callback, as PUBLISH_KEY, which the callback sets as host variables (as set_fact sets them); without it (an
# ansible.cfg without the project's callback_plugins, where Ansible's default injects facts) as ansible_facts. Either
# way every reader reads the top-level name.
# {"hosts": [names], "vars": {name: value}} in a task's result; a task run once for every node that gives each its own
# values says {"by_host": {name: {var: value}}} (callback only: without it a run-once task's facts reach every node).
PUBLISH_KEY = "trainyard_vars"
# A no_log task's published values, as a fact ({"nonce": str, "vars": {...}}): the callbacks see its result censored.
# The nonce tells the callback a value it has already set from a value it has not.
HIDDEN_VARS = "_trainyard_vars_no_log"


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
        self.nonces: set = set()  # the HIDDEN_VARS values already set

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

    def hidden_vars(self, host: str, facts) -> dict:
        """{host: values} of the fact HIDDEN_VARS in facts (a node's facts), when this run has not set them yet (the
        fact outlives its task: a later no_log task of another module finds it still there)."""
        value = facts.get(HIDDEN_VARS) if isinstance(facts, Mapping) else None
        if not isinstance(value, Mapping) or not isinstance(value.get("vars"), Mapping) \
                or value.get("nonce") in self.nonces:
            return {}
        self.nonces.add(value.get("nonce"))
        return {host: dict(value["vars"])}


def publish(result: dict, task_hosts, no_log: bool) -> dict:
    """result with its ansible_facts (but this module's own facts: HIDDEN, and VAR, the records' fallback) handed to
    the callback as PUBLISH_KEY for task_hosts (the task's node; every node of the play for a run_once task, as
    Ansible gives a run_once task's facts to them all). Unchanged without the callback."""
    facts = result.get("ansible_facts")
    if not isinstance(facts, Mapping) or not callback_keeps_records():
        return result
    values = {k: v for k, v in facts.items() if k not in (VAR, HIDDEN)}
    kept = {k: v for k, v in facts.items() if k in (VAR, HIDDEN)}
    if values and no_log:
        kept[HIDDEN_VARS] = {"nonce": secrets.token_hex(8), "vars": values}
    elif values:
        result[PUBLISH_KEY] = {"hosts": [str(h) for h in task_hosts], "vars": values}
    if kept:
        result["ansible_facts"] = kept
    else:
        result.pop("ansible_facts", None)  # not even an empty entry in the fact cache
    return result


def task_hosts(task, task_vars) -> list:
    """The nodes a task's facts would go to, as Ansible chooses them: the delegated node for delegate_facts, every
    active node of the play for a run_once task, else the task's own node."""
    if task.delegate_to and task.delegate_facts:
        return list(task_vars.get("ansible_delegated_vars") or [task.delegate_to])[:1]
    if task.run_once:
        return list(task_vars.get("ansible_play_hosts") or [task_vars.get("inventory_hostname")])
    return [task_vars.get("inventory_hostname")]


def publish_task_result(result: dict, task, task_vars) -> dict:
    """publish() for one task's result: the nodes Ansible would give its facts to, and its no_log."""
    return publish(result, task_hosts(task, task_vars or {}), bool(task.no_log))


def published(result) -> dict:
    """{host: {name: value}} that one task result publishes (each loop item's), {} when none."""
    if not isinstance(result, Mapping):
        return {}
    items = result.get("results") if isinstance(result.get("results"), list) else [result]
    out: dict = {}
    for item in items:
        pub = item.get(PUBLISH_KEY) if isinstance(item, Mapping) else None
        if isinstance(pub, Mapping) and isinstance(pub.get("vars"), Mapping):
            for host in pub.get("hosts") or []:
                out.setdefault(str(host), {}).update(pub["vars"])
        if isinstance(pub, Mapping) and isinstance(pub.get("by_host"), Mapping):
            for host, named in pub["by_host"].items():
                if isinstance(named, Mapping):
                    out.setdefault(str(host), {}).update(named)
    return out
