# -*- coding: utf-8 -*-
"""Record the host-basics checks of every node from its host_facts probe, once for all of them (controller side, no
round trip)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_basics
short_description: Record the host-basics checks of every node from its probe, once for the cluster
description:
  - "Turns each node's registered result of C(host_facts) (C(__cluster_host)) into the records C(cluster.python),
    C(cluster.disk), C(cluster.shm), C(cluster.memlock), C(cluster.docker), C(cluster.clock) and, on a node that is
    itself a container without an engine, C(cluster.container) (plugin_utils/host_basics.py), and records them as
    C(preflight_check) does, each record naming its node."
  - "Runs once (C(run_once: true)) for every node of I(nodes): one worker for the cluster instead of one per node.
    Each node's records use the options its probe kept (C(kept): C(output_root), C(thresholds), C(launch_runtime),
    C(nccl_env_profile), C(container_engine_install), C(container_enabled), as the node's own variables gave them
    in the probe's task)."
  - "Each clock is judged against the median clock offset of the nodes (every shard's nodes in a sharded run,
    plugin_utils/shards.py), widened by the largest measurement error."
  - A probe that failed (no Python that can run it) is recorded as a C(cluster.python) failure with its error and
    a skip of every other check.
  - Runs on the controller only; no node is contacted.
options:
  nodes:
    description: The nodes to record (C(ansible_play_hosts)).
    type: list
    elements: str
    required: true
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Record the host basics of every node (once, each clock against the median of the nodes)
  host_basics:
    nodes: "{{ ansible_play_hosts }}"
    probes: "{{ ansible_play_hosts | map('extract', hostvars, '__cluster_host') | list }}"
  run_once: true
"""

RETURN = r"""
clocks:
  description: The clock reference the records took (C(median), C(uncertainty), and C(nodes), how many nodes had a
    clock).
  returned: always
  type: dict
preflight_records:
  description: Every record appended, each with its node (see the C(preflight_check) action).
  returned: always
  type: list
"""

from ansible.errors import AnsibleActionFail
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, host_basics, shards

# What each node's records read of its probe's kept options (roles/cluster/tasks/preflight.yml).
_KEPT = ("output_root", "thresholds", "launch_runtime", "nccl_env_profile", "container_engine_install",
         "container_enabled")


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        nodes = args.get("nodes")
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise AnsibleActionFail("host_basics: 'nodes' must be the list of the nodes to record "
                                    "(ansible_play_hosts), not %s" % type(nodes).__name__)
        given = args.get("probes")
        if not isinstance(given, list) or len(given) != len(nodes):
            raise AnsibleActionFail("host_basics: 'probes' must be each node's registered host_facts result, one per "
                                    "node of 'nodes' (%d) in its order, as values" % len(nodes))
        probes = dict(zip(nodes, given))
        try:
            clocks = shards.union([(p or {}).get("clock", {}) for p in probes.values()], "cluster-clock")
        except shards.ShardError as e:
            raise AnsibleActionFail(str(e)) from None
        reference = host_basics.clock_reference(clocks)
        records = []
        for node, probe in probes.items():
            kept = (probe or {}).get("kept")
            if not isinstance(kept, dict) or any(k not in kept for k in _KEPT):
                raise AnsibleActionFail(f"host_basics: {node} has no probe result with the options it kept (the task "
                                        f"'Probe the node in one round trip' with keep: {', '.join(_KEPT)})")
            opts = dict(kept, output_root=str(kept["output_root"] or ""),
                        thresholds=bases.need_dict(kept["thresholds"], f"host_basics: {node}: thresholds"),
                        launch_runtime=str(kept["launch_runtime"] or "docker"),
                        nccl_env_profile=str(kept["nccl_env_profile"] or "tcp"))
            missing = [k for k in host_basics.THRESHOLDS if k not in opts["thresholds"]]
            if missing:
                raise AnsibleActionFail("host_basics: %s: cluster_preflight lacks %s" % (node, ", ".join(missing)))
            records += [dict(r, host=node) for r in host_basics.host_basics_records(probe, reference, opts)]
        out = self.record(task_vars, *records)
        out["clocks"] = reference or {"nodes": 0}
        return out
