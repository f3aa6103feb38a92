# -*- coding: utf-8 -*-
"""Read what the fabricmanager role needs of one node (only where the nvidia_driver role's facts do not answer it)
and record the fabric manager checks, or leave them to the task after the install where the node runs the fabric
manager itself."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabricmanager_check
short_description: Read the fabric manager's unit where it matters and record the fabric manager checks
description:
  - Takes the GPU facts of this run (fact C(nvidia_gpu_facts), set by the nvidia_driver role). Runs the module
    nvidia_gpu_facts on the node (with C(service), the fabric manager's unit) only when that fact is not set, or
    where the fabric matters (NVSwitches, or C(fabricmanager_required) always) and systemd may run the node (the
    cluster role's host probe, fact C(trainyard_init)); a failed read counts as no GPU facts.
  - Records every C(fabricmanager.*) check as preflight_check does (C(module_utils/nvidia_smi.py) decides them),
    unless I(install) is set and this node runs the fabric manager itself (C(needed)); then the task after the
    install records them with I(state) and I(after).
  - Reads the role's options from the variables of the node (C(fabricmanager_required),
    C(fabricmanager_service_name)).
  - With I(after) (the nvidia_gpu_facts result read after a (re)start, when that task ran), sets the fact
    C(nvidia_gpu_facts) to those facts.
options:
  install:
    description: Leave the records to the task after the install where this node needs the fabric manager.
    type: bool
    default: false
  state:
    description: This action's own earlier result (the task after the install passes it); nothing is read again.
    type: dict
  after:
    description: With I(state), the nvidia_gpu_facts result read after the fabric manager's (re)start (skipped or
      absent when it did not restart).
    type: dict
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Read what is missing and record the fabric manager checks (after the install where it runs)
  fabricmanager_check:
    install: true
  register: __fabricmanager_state

- name: Record the fabric manager checks after the install
  fabricmanager_check:
    state: "{{ __fabricmanager_state }}"
    after: "{{ __fabricmanager_gpu_after }}"
"""

RETURN = r"""
needed:
  description: This node runs the fabric manager (NVSwitches on it, or C(fabricmanager_required) always).
  returned: always
  type: bool
systemd:
  description: systemd runs the node (the cluster role's host probe, else this read).
  returned: always
  type: bool
nvidia_gpu_facts:
  description: The GPU facts the checks used (this run's fact, else this read's).
  returned: always
  type: dict
service_manager:
  description: The node's service manager, when this action read it.
  returned: when read
  type: str
service:
  description: The fabric manager's unit C({state, status}) under systemd, None when it does not exist (when read).
  returned: when read
  type: dict
preflight_records:
  description: The records appended (none where the task after the install records them).
  returned: always
  type: list
"""

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, gpu_checks


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        host = task_vars.get("inventory_hostname")
        required = str(self.var(task_vars, "fabricmanager_required", "auto"))
        service_name = str(self.var(task_vars, "fabricmanager_service_name", "nvidia-fabricmanager"))
        probe = task_vars.get("trainyard_init")  # the cluster role's host probe, when it ran
        known = "nvidia_gpu_facts" in task_vars
        state = args.get("state")
        if state is None:
            facts = task_vars.get("nvidia_gpu_facts") if known else None
            probed_systemd = probe.get("systemd") if probe is not None else None
            read = {}
            if gpu_checks.fabricmanager_read(known, facts, required, probed_systemd):
                read = self._execute_module(module_name="nvidia_gpu_facts", module_args={"service": service_name},
                                            task_vars=task_vars)
            if not known:
                facts = gpu_checks.facts_of(read)
            state = {key: read[key] for key in ("service_manager", "service") if key in read}
            state["systemd"] = bool(probe.get("systemd")) if probe is not None else \
                read.get("service_manager") == "systemd"
            state["needed"] = gpu_checks.fabricmanager_needs(facts, required)[1]
            state["nvidia_gpu_facts"] = facts
        else:
            state = bases.need_dict(state, "fabricmanager_check: 'state'")
        after = bases.need_dict(args.get("after") or {}, "fabricmanager_check: 'after'")
        renewed = bool(after) and not after.get("skipped")
        facts = gpu_checks.facts_of(after) if renewed else state.get("nvidia_gpu_facts")
        if args.get("state") is None and boolean(args.get("install", False), strict=False) and state["needed"]:
            return dict(state, preflight_records=[])
        records = nvidia_smi.fabricmanager_records(host, facts, gpu_checks.fabricmanager_opts(
            state, required, service_name, probe))
        result = dict(state, **self.record(task_vars, *records))
        if renewed:
            result["ansible_facts"]["nvidia_gpu_facts"] = facts
        return result
