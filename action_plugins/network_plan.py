# -*- coding: utf-8 -*-
"""The network role's cross-node values, computed once per play on the controller (run_once)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: network_plan
short_description: The network role's cross-node values and the pairs the path proof pings, once per play
description:
  - "Takes every node's C(net_facts) result (I(facts), the values, once per play) and
    returns what the role compares across nodes (C(plugin_utils/netrecords.py) C(cluster_plan)) whether every node
    uses the same data interface name, the MTU the cluster proves (C(cluster_data_mtu), or with 0 the smallest
    measured), each node's data MTU and interface (a failing pair names both), and which peers each node pings
    (a full mesh up to I(full_mesh_max) nodes, above it a ring, I(samples) seeded random rings and one pair per
    data subnet pair: O(1) peers per node) with the coverage of that scheme."
  - "Run it with C(run_once); the result is registered on every node and the fact C(network_iface_uniform) set on
    every node. Each node's C(network_checks) task takes two values of it: I(plan) (what every node shares, O(1) in
    the node count) and its own entry of I(nodes) (its peers and what its records read of them): no node's
    arguments carry every node's peers."
  - "Runs on the controller; with I(port) it also asks the head (the task delegated to it) who holds the rendezvous
    port, and starts the probe listener there when nobody does, in the same task (C(port_check) C(mode=inspect))."
options:
  hosts:
    description: The nodes of the cluster in the play, in rank order.
    type: list
    elements: str
    required: true
  facts:
    description: Each node's registered C(net_facts) result, one per entry of I(hosts) in its order (C({}) where a
      node has none).
    type: list
    elements: raw
    required: true
  head: {description: The head (rank 0)., type: str, required: true}
  head_address: {description: The head's data address (what every node's route is checked against)., type: str,
                 required: true}
  master_addr: {description: The rendezvous address (C(cluster_model.master_addr))., type: str, required: true}
  master_port: {description: The rendezvous port., type: int, required: true}
  mtu: {description: C(cluster_data_mtu); 0 measures (the smallest data interface MTU of the nodes)., type: int,
        required: true}
  full_mesh_max: {description: Most nodes for a full mesh (C(network_path_mtu_full_mesh_max))., type: int,
                  default: 16}
  samples: {description: Seeded random rings above I(full_mesh_max)., type: int, default: 2}
  seed: {description: Seed of those rings., type: int, default: 0}
  ping:
    description: "The path_mtu_check settings every node uses: C({wait, retries, workers}) and C(connect_timeout)
      (seconds a worker's connect to the rendezvous port may take)."
    type: dict
    default: {}
  port:
    description: "C(port_check)'s arguments for C(mode=inspect) (C(port), C(state_file), C(listen), C(address),
      C(listen_seconds), C(expect)): the module runs on the host the task is delegated to (the head) and its answer
      is returned as C(port); a failure of the module fails the task. Left out: no node is contacted."
    type: dict
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Compare the nodes and choose the pairs the path proof pings
  network_plan:
    hosts: "{{ _network_hosts }}"
    facts: "{{ _network_hosts | map('extract', hostvars) | map(attribute='__network_facts', default={}) | list }}"
    head: "{{ cluster_model.head }}"
    head_address: 10.0.0.11
    master_addr: 10.0.0.11
    master_port: 39500
    mtu: 9000
  run_once: true
  register: __network_plan
"""

RETURN = r"""
plan:
  description: "What every node's checks share: C(nodes) (how many), C(head_in_play), C(uniform), C(uniformity),
    C(expected), C(measure), C(coverage), and the arguments C(head), C(head_address), C(master_addr), C(master_port),
    C(ping)."
  returned: always
  type: dict
nodes:
  description: "{host: its own part of the plan}: C(peers) ({host: [{name, address}]}, empty when it has no data
    address), C(probed_by), C(unaddressed) (the other nodes with no data address), C(mtus) and C(ifaces) (of itself
    and its peers)."
  returned: always
  type: dict
port:
  description: "With I(port): C(port_check)'s answer on the head (C(holders), C(verdict), C(ours), and C(listener)
    when it listened): what every worker's connect reads, and what stops the listener."
  returned: with I(port)
  type: dict
ansible_facts:
  description: C(network_iface_uniform) (every node uses the same data interface name).
  returned: always
  type: dict
"""

from ansible.errors import AnsibleActionFail

from ansible_collections.trainyard.core.plugins.plugin_utils import bases, netrecords


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        hosts = bases.str_list(args.get("hosts"))
        for key in ("head", "head_address", "master_addr", "master_port", "mtu"):
            if args.get(key) is None:
                raise AnsibleActionFail(f"network_plan: '{key}' is required")
        if not isinstance(args.get("facts"), list) or len(args["facts"]) != len(hosts):
            raise AnsibleActionFail("network_plan: 'facts' must list each host's registered net_facts result, one per "
                                    "entry of 'hosts' (%d) in its order, as values" % len(hosts))
        facts = dict(zip(hosts, args["facts"]))
        plan = netrecords.cluster_plan(hosts, facts, int(args["mtu"]), int(args.get("full_mesh_max", 16)),
                                       int(args.get("samples", 2)), int(args.get("seed", 0)))
        plan.update(head=str(args["head"]), head_address=str(args["head_address"]),
                    master_addr=str(args["master_addr"]), master_port=int(args["master_port"]),
                    ping=bases.need_dict(args.get("ping") or {}, "network_plan: 'ping'"))
        shared, nodes = netrecords.split_plan(plan)
        out = {"plan": shared, "nodes": nodes, "ansible_facts": {"network_iface_uniform": plan["uniform"]}}
        if args.get("port"):
            port = dict(bases.need_dict(args["port"], "network_plan: 'port'", " (port_check's arguments)"),
                        mode="inspect")
            answer = self._execute_module(module_name="port_check", module_args=port, task_vars=task_vars)
            answer.pop("invocation", None)
            if answer.get("failed"):
                return dict(out, failed=True, port=answer, msg="port_check on the head: %s" % answer.get("msg", ""))
            out["port"] = answer
        return out
