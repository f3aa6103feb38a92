# -*- coding: utf-8 -*-
"""Record the nvidia_driver role's checks of one node from every node's nvidia_gpu_facts result (controller side,
no round trip), and keep this node's GPU facts as the fact nvidia_gpu_facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_check
short_description: Record the driver, GPU and GPU health checks of a node and keep its GPU facts
description:
  - Runs on the controller only, after the nvidia_gpu_facts task of the role ran on every node of the play.
  - Reads the result that task registered under I(result) for this node and, for the checks across nodes (the same
    driver everywhere, no GPU UUID on two nodes), for every node of the play; records every C(nvidia_driver.*) check
    as preflight_check does (C(module_utils/nvidia_smi.py) and C(module_utils/gpu_health.py) decide them,
    C(plugin_utils/gpu_checks.py) hands them their inputs).
  - Reads the role's options from the variables of the node, not from arguments (C(nvidia_driver_version),
    C(nvidia_driver_branch), C(nvidia_driver_visible_devices), C(nvidia_driver_allow_shared_gpus),
    C(nvidia_driver_environment_file), C(nvidia_driver_health_checks), C(nvidia_driver_xid_since),
    C(cluster_gpus_per_node), C(cluster_nproc_per_node), C(cluster_model)); another node's
    C(nvidia_driver_visible_devices) only where that node lists one of this node's GPU UUIDs.
  - Sets the fact C(nvidia_gpu_facts) (None when nvidia-smi failed) for the roles after it, and C(nvidia_gpu_identity)
    (the machine's GPU UUIDs and serials and machine id, plugin_utils/bad_machines.py; None when unknown) for the
    record of bad machines.
  - In check mode C(nvidia_driver.device_order) is C(pending) on I(result_task) when that task would write the device
    order.
options:
  result:
    description: The name the nvidia_gpu_facts task registered its result under (on every node).
    type: str
    required: true
  result_task:
    description: "That task's name as the report names it (C(<role> : <name>)), for the pending device order."
    type: str
    required: true
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Configure CUDA_DEVICE_ORDER=PCI_BUS_ID and read the GPU facts and health
  nvidia_gpu_facts:
    environment_file: /etc/environment
    set_device_order: true
    health: true
  register: __nvidia_driver_gpu
  failed_when: false

- name: Record the driver, GPU and GPU health checks
  nvidia_driver_check:
    result: __nvidia_driver_gpu
    result_task: "nvidia_driver : Configure CUDA_DEVICE_ORDER=PCI_BUS_ID and read the GPU facts and health"
"""

RETURN = r"""
preflight_records:
  description: Every record appended (as preflight_check returns them).
  returned: always
  type: list
ansible_facts:
  description: C(preflight_results) with the records, C(nvidia_gpu_facts) and C(nvidia_gpu_identity) of this node.
  returned: always
  type: dict
"""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, gpu_checks


def registered(task_vars, host, name):
    """The result `host` registered under `name`, None when it has none: this host's from its own task_vars, a
    peer's through the public hostvars mapping."""
    if host == task_vars.get("inventory_hostname"):
        return task_vars.get(name)
    try:
        return task_vars.get("hostvars")[host].get(name)
    except (KeyError, TypeError, AttributeError):
        return None


def _int(value):
    """value as Jinja's int filter reads it (0 for what is not a number)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        name, task = args.get("result"), args.get("result_task")
        if not name or not isinstance(name, str) or not task or not isinstance(task, str):
            raise AnsibleActionFail("nvidia_driver_check: give 'result' (the registered name of the nvidia_gpu_facts "
                                    "task) and 'result_task' (that task's name)")
        host = task_vars.get("inventory_hostname")
        hostvars = task_vars.get("hostvars")
        results = {h: registered(task_vars, h, name) for h in task_vars.get("ansible_play_hosts") or [host]}
        results[host] = task_vars.get(name)
        model = task_vars.get("cluster_model") or {}
        gpus_per_node = self.var(task_vars, "cluster_gpus_per_node")
        visible = self.var(task_vars, "nvidia_driver_visible_devices", "")
        opts = {
            "version": self.var(task_vars, "nvidia_driver_version", ""),
            "branch": str(self.var(task_vars, "nvidia_driver_branch", "")),
            "gpus_per_node": gpus_per_node,
            "nproc_per_node": model.get("nproc_per_node", self.var(task_vars, "cluster_nproc_per_node")),
            "gpu_ranks": _int(1 if gpus_per_node is None else gpus_per_node) > 0,
            "visible_devices": visible,
            "shared_gpus_ok": boolean(self.var(task_vars, "nvidia_driver_allow_shared_gpus", False), strict=False),
            "device_order_file": self.var(task_vars, "nvidia_driver_environment_file"),
        }

        def visible_of(peer):
            try:
                return hostvars[peer].get("nvidia_driver_visible_devices") or ""
            except (KeyError, TypeError, AttributeError):
                return ""

        health = None
        if boolean(self.var(task_vars, "nvidia_driver_health_checks", True), strict=False):
            health = {"node_rank": model.get("node_rank"), "nproc_per_node": model.get("nproc_per_node"),
                      "visible": visible, "since": self.var(task_vars, "nvidia_driver_xid_since", 0)}
        records = gpu_checks.driver_records(host, results, opts, visible_of, health)
        # Check mode: the device order the nvidia_gpu_facts task would write is pending on it, not a failure.
        for rec in records:
            if rec["check"] == "nvidia_driver.device_order":
                rec["pending_on"] = {task: results[host] or {}}
        result = self.record(task_vars, *records)
        result["ansible_facts"]["nvidia_gpu_facts"] = gpu_checks.facts_of(results[host])
        result["ansible_facts"]["nvidia_gpu_identity"] = gpu_checks.identity_of(results[host])
        return result
