# -*- coding: utf-8 -*-
"""Record the fabric manager checks of every node whose facts this run already has, once for all of them (I(nodes)),
or read what the fabricmanager role needs of one node (only where the nvidia_driver role's facts do not answer it)
and record its checks, or leave them to the task after the install where the node runs the fabric manager itself."""

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
  - "With I(nodes) (run once for the play's hosts): records, in this one task, every node of I(nodes) that needs
    nothing of its own: no read of the node (the rule above) and, with I(install), no fabric manager to run. Each
    node's facts (C(nvidia_gpu_facts), C(trainyard_init)) come from its host variables, its options from I(kept)
    (what the cluster role's host probe kept of them: every source of the node's variables), else what its
    inventory or the extra vars set, else this task's value (the role's default or the play's). The others
    are returned in C(own): the role's per-node steps run on them only. Without the records callback (records for
    other nodes cannot be kept) every node is returned in C(own)."
options:
  nodes:
    description: The play's hosts (C(ansible_play_hosts)), for the record of every node at once (run_once).
    type: list
    elements: str
  kept:
    description: With I(nodes), what the cluster role's host probe kept of each node (its C(kept)), in I(nodes)'
      order; C(fabricmanager_required) and C(fabricmanager_service_name) are read from it.
    type: list
    elements: dict
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
- name: Record the fabric manager checks of every node that needs no step of its own, once
  fabricmanager_check:
    nodes: "{{ ansible_play_hosts }}"
    kept: "{{ ansible_play_hosts | map('extract', hostvars) | map(attribute='__cluster_host', default={})
              | map(attribute='kept', default={}) | list }}"
    install: true
  register: __fabricmanager_once
  run_once: true

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
own:
  description: With I(nodes), the nodes not recorded here, in I(nodes)' order (a read or the install of their own).
  returned: with nodes
  type: list
needed:
  description: This node runs the fabric manager (NVSwitches on it, or C(fabricmanager_required) always).
  returned: without nodes
  type: bool
systemd:
  description: systemd runs the node (the cluster role's host probe, else this read).
  returned: without nodes
  type: bool
nvidia_gpu_facts:
  description: The GPU facts the checks used (this run's fact, else this read's).
  returned: without nodes
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

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, check_records, gpu_checks

_OPTIONS = (("fabricmanager_required", "auto"), ("fabricmanager_service_name", "nvidia-fabricmanager"))


class ActionModule(bases.ControllerAction):
    def once(self, nodes, kept, install, task_vars):
        """The records of every node of `nodes` that needs nothing of its own, and the others as `own`."""
        if not isinstance(nodes, list):
            raise AnsibleActionFail("fabricmanager_check: 'nodes' must be the play's hosts, a list "
                                    "(\"{{ ansible_play_hosts }}\"); got %s" % type(nodes).__name__)
        kept = [] if kept is None else kept
        if not isinstance(kept, list) or len(kept) not in (0, len(nodes)):
            raise AnsibleActionFail("fabricmanager_check: 'kept' must list what the cluster role's probe kept of each "
                                    "node of 'nodes', in its order (or be left out); got %s" % (
                                        "%d entries for %d nodes" % (len(kept), len(nodes)) if isinstance(kept, list)
                                        else type(kept).__name__))
        kept_of = {str(n): k if isinstance(k, dict) else {} for n, k in zip(nodes, kept)}
        if not check_records.callback_keeps_records():  # records for other nodes need the callback
            return {"own": [str(n) for n in nodes], "preflight_records": []}
        mine = {name: str(self.var(task_vars, name, default)) for name, default in _OPTIONS}
        hostvars = task_vars.get("hostvars") or {}
        own, records = [], []
        for host in (str(n) for n in nodes):
            hv = hostvars[host] if host in hostvars else {}  # one read of the host's variables, templated as its own
            its = kept_of.get(host) or {}
            required, service_name = (str(its[name] if name in its else hv[name] if name in hv else mine[name])
                                      for name, _ in _OPTIONS)
            probe = hv["trainyard_init"] if "trainyard_init" in hv else None
            known = "nvidia_gpu_facts" in hv
            facts = hv["nvidia_gpu_facts"] if known else None
            systemd = probe.get("systemd") if probe is not None else None
            if gpu_checks.fabricmanager_read(known, facts, required, systemd) \
                    or (install and gpu_checks.fabricmanager_needs(facts, required)[1]):
                own.append(host)
                continue
            for rec in nvidia_smi.fabricmanager_records(host, facts, gpu_checks.fabricmanager_opts(
                    {}, required, service_name, probe)):
                records.append(dict(rec, host=rec.get("host") or host))
        return dict(self.record(task_vars, *records), own=own)

    def decide(self, args, task_vars):
        install = boolean(args.get("install", False), strict=False)
        if args.get("nodes") is not None:
            return self.once(args["nodes"], args.get("kept"), install, task_vars)
        host = task_vars.get("inventory_hostname")
        required, service_name = (str(self.var(task_vars, name, default)) for name, default in _OPTIONS)
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
        if args.get("state") is None and install and state["needed"]:
            return dict(state, preflight_records=[])
        records = nvidia_smi.fabricmanager_records(host, facts, gpu_checks.fabricmanager_opts(
            state, required, service_name, probe))
        result = dict(state, **self.record(task_vars, *records))
        if renewed:
            result["ansible_facts"]["nvidia_gpu_facts"] = facts
        return result
