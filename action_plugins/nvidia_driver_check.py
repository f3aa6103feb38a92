# -*- coding: utf-8 -*-
"""Record the nvidia_driver role's checks of one node from its nvidia_gpu_facts result and what every node's checks
compare (taken once per play by the same action), controller side, no round trip; keep this node's GPU facts as the
fact nvidia_gpu_facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_check
short_description: Record the driver, GPU and GPU health checks of a node and keep its GPU facts
description:
  - Runs on the controller only, after the nvidia_gpu_facts task of the role ran on every node of the play.
  - "With I(peers_of) (once, C(run_once: true)) it records nothing: it returns I(peers), what the checks across nodes
    compare (each node's driver version and the UUIDs of the GPUs it uses that another node lists too), built once
    over every node's GPU facts, O(n) in all (C(plugin_utils/gpu_checks.py) C(peers_of))."
  - "Without it, records every C(nvidia_driver.*) check of this node as preflight_check does from I(result) (this
    node's registered nvidia_gpu_facts result) and I(peers) (the driver drift, no GPU UUID on two nodes):
    C(module_utils/nvidia_smi.py) and C(module_utils/gpu_health.py) decide them, C(plugin_utils/gpu_checks.py) hands
    them their inputs."
  - Reads the role's options from the variables of the node, not from arguments (C(nvidia_driver_version),
    C(nvidia_driver_branch), C(nvidia_driver_visible_devices), C(nvidia_driver_allow_shared_gpus),
    C(nvidia_driver_environment_file), C(nvidia_driver_health_checks), C(nvidia_driver_xid_since),
    C(cluster_gpus_per_node), C(cluster_nproc_per_node), C(cluster_model)).
  - Sets the fact C(nvidia_gpu_facts) (None when nvidia-smi failed) for the roles after it, and C(nvidia_gpu_identity)
    (the machine's GPU UUIDs and serials and machine id, plugin_utils/bad_machines.py; None when unknown) for the
    record of bad machines.
  - In check mode C(nvidia_driver.device_order) is C(pending) when I(result) says the task would write the device
    order (the record's fix names that task).
options:
  peers_of:
    description:
      - "Every node of the play: C(hosts) (their names), C(facts) (each one's nvidia_gpu_facts, C({}) or None when
        nvidia-smi failed) and C(visible) (each one's C(nvidia_driver_visible_devices)), three lists in one order.
        Given, the action returns I(peers) and records nothing."
    type: dict
  result:
    description: This node's registered nvidia_gpu_facts result (the value, not its name).
    type: dict
  peers:
    description: The I(peers) the I(peers_of) call returned.
    type: dict
  records:
    description:
      - More records of the role's node to record in the same task, after its checks (each a dict as preflight_check's
        I(records) takes them), e.g. the C(nvidia_driver.burnin) record C(gpu_burnin) returns. One task records them
        all.
    type: list
    elements: dict
    default: []
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

- name: Take what the GPU checks compare across nodes (once, over every node's GPU facts)
  nvidia_driver_check:
    peers_of:
      hosts: "{{ ansible_play_hosts }}"
      facts: "{{ ansible_play_hosts | map('extract', hostvars, '__nvidia_driver_gpu')
                 | map(attribute='nvidia_gpu_facts', default={}) | list }}"
      visible: "{{ ansible_play_hosts | map('extract', hostvars)
                   | map(attribute='nvidia_driver_visible_devices', default='') | list }}"
  run_once: true
  register: __nvidia_driver_peers

- name: Run the burn-in tier's GPU diagnostics
  gpu_burnin:
    tier: quick
  register: __nvidia_driver_burnin

- name: Record the driver, GPU, GPU health and burn-in checks
  nvidia_driver_check:
    result: "{{ __nvidia_driver_gpu }}"
    peers: "{{ __nvidia_driver_peers.peers }}"
    records: ["{{ __nvidia_driver_burnin.record }}"]
"""

RETURN = r"""
peers:
  description: With I(peers_of), {host':' None (no GPU facts) or {driver, uuids}} over every node of the play.
  returned: with peers_of
  type: dict
preflight_records:
  description: Every record appended (as preflight_check returns them).
  returned: without peers_of
  type: list
ansible_facts:
  description: C(preflight_results) with the records, C(nvidia_gpu_facts) and C(nvidia_gpu_identity) of this node.
  returned: without peers_of
  type: dict
"""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, gpu_checks


def _int(value):
    """value as Jinja's int filter reads it (0 for what is not a number)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def peers_of(arg):
    """gpu_checks.peers_of over the peers_of argument, or AnsibleActionFail naming what is wrong with it."""
    if not isinstance(arg, dict) or not all(isinstance(arg.get(k), list) for k in ("hosts", "facts", "visible")):
        raise AnsibleActionFail("nvidia_driver_check: 'peers_of' must be a dict of three lists, hosts (the play's "
                                "hosts), facts and visible (each host's nvidia_gpu_facts and "
                                "nvidia_driver_visible_devices, in that order)")
    if not len(arg["hosts"]) == len(arg["facts"]) == len(arg["visible"]):
        raise AnsibleActionFail("nvidia_driver_check: 'peers_of' lists hosts, facts and visible of different lengths "
                                "(%d, %d, %d): give one entry per host of the play, in one order"
                                % (len(arg["hosts"]), len(arg["facts"]), len(arg["visible"])))
    if not all(f is None or isinstance(f, dict) for f in arg["facts"]):
        raise AnsibleActionFail("nvidia_driver_check: 'peers_of.facts' must hold each host's nvidia_gpu_facts (a dict) "
                                "or None")
    return gpu_checks.peers_of([str(h) for h in arg["hosts"]], arg["facts"], [str(v or "") for v in arg["visible"]])


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        if "peers_of" in args:
            return {"peers": peers_of(args["peers_of"])}
        result, peers = args.get("result"), args.get("peers")
        if not isinstance(result, dict) or not isinstance(peers, dict):
            raise AnsibleActionFail(
                "nvidia_driver_check: give 'result' (the registered nvidia_gpu_facts result, as a value: "
                "\"{{ __nvidia_driver_gpu }}\", not its name) and 'peers' (the 'peers' of the run_once call with "
                "peers_of); got result %s, peers %s" % (type(result).__name__, type(peers).__name__))
        more = args.get("records", [])
        if not isinstance(more, list) or not all(isinstance(r, dict) for r in more):
            raise AnsibleActionFail(
                "nvidia_driver_check: 'records' must be a list of records (dicts, as values: "
                "[\"{{ __nvidia_driver_burnin.record }}\"]), not a name or a %s" % type(more).__name__)
        host = task_vars.get("inventory_hostname")
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

        health = None
        if boolean(self.var(task_vars, "nvidia_driver_health_checks", True), strict=False):
            health = {"node_rank": model.get("node_rank"), "nproc_per_node": model.get("nproc_per_node"),
                      "visible": visible, "since": self.var(task_vars, "nvidia_driver_xid_since", 0)}
        records = gpu_checks.driver_records(host, result, peers, opts, health)
        # Check mode: the device order the nvidia_gpu_facts task would write is pending on it, not a failure.
        for rec in records:
            if rec["check"] == "nvidia_driver.device_order":
                rec["pending_on"] = {gpu_checks.DEVICE_ORDER_TASK: result}
        out = self.record(task_vars, *records, *more)
        out["ansible_facts"]["nvidia_gpu_facts"] = gpu_checks.facts_of(result)
        out["ansible_facts"]["nvidia_gpu_identity"] = gpu_checks.identity_of(result)
        return out
