# -*- coding: utf-8 -*-
"""One task per node for the network role's proofs and records: the pings and the rendezvous connect in one
path_mtu_check call, then every network.* record of the node built in Python (plugin_utils/netrecords.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: network_checks
short_description: Ping this node's peers, connect to the rendezvous port and record every network check
description:
  - With the role off (I(enabled) false) records C(network.enabled) as skipped and contacts nothing.
  - "Otherwise one C(path_mtu_check) call on the node, when it has something to do: the don't-fragment pings to the
    peers I(plan) gives this node (when C(network_path_check) is on, the cluster has 2 nodes or more and this node
    has a data interface) and, on a worker, the TCP connect to the rendezvous port (when something answers there:
    a holder or the head's probe listener from I(port))."
  - Then records, through C(preflight_check) (check mode, printing a failure at once and the report as there),
    C(network.iface), C(network.head_route), C(network.mtu), C(network.mtu_persist), C(network.bridge_mtu) from
    I(facts), C(network.path_mtu) (a failing pair named by both ends, the coverage of the pair scheme),
    C(network.rendezvous_port) and C(network.rendezvous_listen) on the head, C(network.rendezvous_reach) on a
    worker. C(network.mtu) and C(network.mtu_persist) are pending in check mode when the probe would change the
    MTU.
  - The pings and the connect are read-only and run the same in check mode.
options:
  enabled: {description: C(network_enabled)., type: bool, default: true}
  facts:
    description: This node's registered C(net_facts) result (the value, not its name); not read when the role is off.
    type: dict
    required: true
  plan:
    description: C(plan) of the registered C(network_plan) result (what every node shares); C({}) fails the task (no
      plan) unless the role is off.
    type: dict
    required: true
  node_plan:
    description: This node's entry of C(nodes) of the registered C(network_plan) result (its peers and what its records
      read of them); C({}) for a node the plan left out.
    type: dict
    default: {}
  port:
    description: The head's C(port_check) inspect answer (network_plan's C(port); C({}) when it did not run).
    type: dict
    default: {}
  requested: {description: C(cluster_data_iface) of this node., type: str, default: ""}
  manage: {description: C(network_manage_mtu)., type: bool, default: true}
  persist: {description: C(network_persist_mtu)., type: bool, default: true}
  mgmt: {description: The address Ansible connects to (C(ansible_host))., type: str, default: ""}
  path_check: {description: C(network_path_check)., type: bool, default: true}
  port_check: {description: C(network_port_check)., type: bool, default: true}
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Ping every peer, connect to the rendezvous port and record every network check
  network_checks:
    enabled: "{{ network_enabled }}"
    facts: "{{ __network_facts }}"
    plan: "{{ __network_plan.plan | default({}) }}"
    node_plan: "{{ __network_plan.nodes[inventory_hostname] | default({}) }}"
    port: "{{ __network_plan.port | default({}) }}"
    requested: "{{ cluster_data_iface }}"
  register: __network_checks
"""

RETURN = r"""
probes:
  description: path_mtu_check's probes per peer (empty when this node pinged nothing).
  returned: unless the role is off
  type: dict
seconds:
  description: Wall time of the pings.
  returned: when this node pinged
  type: float
reach:
  description: The connect to the rendezvous port (C(outcome), C(seconds), C(message)); empty when it did not connect.
  returned: unless the role is off
  type: dict
preflight_records:
  description: Every record of this task (see C(preflight_check)).
  returned: always
  type: list
"""

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.trainyard.core.plugins.plugin_utils import bases, netrecords


# What each argument takes, for a task that passed a registered result's name.
VALUES_HINT = (": give the registered result as a value (facts: \"{{ __network_facts }}\", plan: "
               "\"{{ __network_plan.plan }}\", node_plan: \"{{ __network_plan.nodes[inventory_hostname] }}\", port: "
               "\"{{ __network_plan.port }}\"), not its name")


def values(args):
    """(facts, plan, node_plan, port) from the arguments, or AnsibleActionFail naming the one that is not a value."""
    return [bases.need_dict(args.get(key, default), "network_checks: '%s'" % key, VALUES_HINT)
            for key, default in (("facts", None), ("plan", None), ("node_plan", {}), ("port", {}))]


class ActionModule(bases.ControllerAction):
    _requires_connection = True  # the pings and the connect run on the node

    def decide(self, args, task_vars):
        if not boolean(args.get("enabled", True), strict=False):
            return self.record(task_vars, netrecords.disabled_record())
        host = task_vars.get("inventory_hostname")
        facts, shared, mine, port = values(args)
        if "head" not in shared or "nodes" not in shared:
            return dict(failed=True, msg="network_checks on %s: no network plan (the network_plan task did not run "
                                         "for this play): run the network role's main or preflight tasks" % host)
        # A plan for this node: what every node shares and its own slice (netrecords.split_plan).
        plan = dict(shared, peers={}, probed_by={}, unaddressed=[], mtus={}, ifaces={})
        plan.update(mine)
        head, ping = plan["head"], plan.get("ping") or {}
        path_check = boolean(args.get("path_check", True), strict=False) and int(plan["nodes"]) > 1
        port_check = boolean(args.get("port_check", True), strict=False)
        iface = netrecords.node_view(facts)["iface"]
        expected = int(plan.get("expected") or 0)
        module_args = {}
        if path_check and iface:
            module_args.update(peers=plan["peers"].get(host, []), payload=expected - 28,
                               base=min(1472, expected - 28),  # below 1500 (an overlay) both probes fit its MTU
                               wait=int(ping.get("wait", 1)), retries=int(ping.get("retries", 1)),
                               workers=int(ping.get("workers", 64)))
        if port_check and host != head and plan["head_in_play"] and netrecords.listening_or_held(port):
            module_args.update(connect={"address": plan["master_addr"], "port": plan["master_port"],
                                        "timeout": float(ping.get("connect_timeout", 3))})
            module_args.setdefault("payload", expected - 28)
        probed = {}
        if module_args:
            probed = self._execute_module(module_name="path_mtu_check", module_args=module_args, task_vars=task_vars)
            if probed.get("failed"):
                return dict(failed=True, msg="path_mtu_check on %s: %s" % (host, probed.get("msg")))
        o = {"host": host, "requested": str(args.get("requested") or ""), "head_address": plan["head_address"],
             "is_head": host == head, "measure": plan["measure"],
             "manage": boolean(args.get("manage", True), strict=False),
             "persist": boolean(args.get("persist", True), strict=False), "mgmt": str(args.get("mgmt") or "")}
        records = netrecords.probe_records(facts, o, plan["uniform"], plan["uniformity"], expected)
        if path_check:
            records.append(netrecords.path_record(host, plan, probed if "peers" in module_args else None))
        if port_check:
            check_mode = bool(self._task.check_mode or getattr(self._play_context, "check_mode", False))
            records += netrecords.port_records(host, dict(plan, check_mode=check_mode), port, probed.get("reach"))
        result = self.record(task_vars, *records)
        result.update(probes=probed.get("probes") or {}, reach=probed.get("reach") or {})
        if "seconds" in probed:
            result["seconds"] = probed["seconds"]
        return result
