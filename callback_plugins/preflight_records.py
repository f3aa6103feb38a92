# -*- coding: utf-8 -*-
"""Keep every node's check records of the run as its host variable preflight_results, and set the values tasks publish as
host variables (plugin_utils/check_records.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: preflight_records
type: aggregate
short_description: Merge each task's check records into the node's preflight_results, set the values tasks publish
description:
  - "Loaded without being enabled (the project's ansible.cfg names C(callback_plugins/)); it prints nothing."
  - "A recording task (the action C(preflight_check), and every action that records its checks itself) returns its
    new records as C(preflight_records). This callback merges them, in ansible-playbook's own process, into the
    node's C(preflight_results) (a later record of a check replaces the earlier one), a variable set as C(set_fact)
    sets one: every reader (the report, the exclusion, recover, nccl_check) reads C(preflight_results) as before."
  - "Why not a fact: Ansible copies a host's whole fact cache, deeply, each time it computes the host's variables, once
    per node and task in ansible-playbook's own process and once per C(hostvars[node]) read, and the records are most
    of a node's facts (about 60 records, 19 kB of JSON on the default simulated cluster)."
  - "The values an action publishes for later tasks (C(network_iface), C(nvidia_gpu_facts), C(nccl_env_file),
    C(train_args_argv), ...) come as C(trainyard_vars) and are set the same way, on the nodes it names (every node of
    the play for a C(run_once) task): not facts, which the project's ansible.cfg does not inject as variables
    (C(inject_facts_as_vars = False))."
  - "Each record goes to the node its C(host) names (the task's node otherwise). Only results that are not failures
    count, as for facts."
  - "Without this callback (an ansible.cfg without the project's C(callback_plugins)) the action returns the records
    as the fact C(preflight_results) instead. A C(no_log) task's result reaches the callbacks censored: its records
    come through the fact C(_preflight_records_no_log) of its node, its published values through
    C(_trainyard_vars_no_log)."
"""

import os

from ansible_collections.trainyard.core.plugins.plugin_utils import bases, check_records


class CallbackModule(bases.AlwaysLoadedCallback):
    CALLBACK_NAME = "preflight_records"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The workers forked later find this process's PID here: the records of their results are kept.
        os.environ[check_records.CALLBACK_ENV] = str(os.getpid())
        self._vm = None
        self._keeper = check_records.Keeper()

    def v2_playbook_on_play_start(self, play):
        self._vm = play.get_variable_manager()

    def v2_runner_on_ok(self, result):
        if self._vm is None:
            return
        if result.task.no_log:
            # Censored for the callbacks; Ansible stored the task's facts before this call. Reading them costs a
            # computation of the node's variables, for a no_log task only.
            facts = self._vm.get_vars(host=result.host).get("ansible_facts")
            records = self._keeper.hidden(result.host.get_name(), facts)
            values = self._keeper.hidden_vars(result.host.get_name(), facts)
        else:
            records = check_records.of_result(result.result)
            values = check_records.published(result.result)
        for host, named in values.items():
            self._vm.set_nonpersistent_facts(host, named)
        if not records:
            return
        for host, merged in self._keeper.add(result.host.get_name(), records).items():
            self._vm.set_nonpersistent_facts(host, {check_records.VAR: merged})
