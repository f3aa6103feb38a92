# -*- coding: utf-8 -*-
"""Decide, on the controller, which nodes a recovered job runs on and with which ranks (no host contacted)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: recover_plan
short_description: Drop the unreachable and failing nodes and compute the survivors' cluster model
description:
  - Runs on the controller only. Takes the full-size cluster model's C(hosts_by_rank), the nodes that did not
    answer and the failed preflight records of the others, drops those nodes (never below I(min_nodes)) and
    returns the new cluster model of every survivor (ranks contiguous in the old order, the head moved to the
    first survivor when it was lost), with C(module_utils/recover.py).
options:
  hosts_by_rank:
    description: The inventory's trainers, rank 0 first.
    type: list
    elements: str
    required: true
  unreachable:
    description: "C({host: why}) of the nodes that did not answer."
    type: dict
    default: {}
  failed:
    description: "C({host: [check: detail]}) (or one message) of the nodes whose preflight failed or broke off."
    type: dict
    default: {}
  records:
    description: "C({host: preflight_results}); the failed records of run I(run_id) are added to I(failed)."
    type: dict
    default: {}
  run_id:
    description: The run id of this run (records of an earlier run are ignored).
    type: str
    default: ""
  min_nodes:
    description: The fewest nodes the job may run on (C(cluster_min_nodes)).
    type: int
    default: 1
  model:
    description: The full-size cluster model of the head (nproc_per_node, master_port).
    type: dict
    required: true
  data_addresses:
    description: "C({host: data address})."
    type: dict
    default: {}
  master_addr:
    description: C(cluster_master_addr) as the user set it ("" when not set).
    type: str
    default: ""
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Decide the survivors
  recover_plan:
    hosts_by_rank: "{{ cluster_hosts_by_rank }}"
    unreachable: "{{ _recover_unreachable }}"
    failed: "{{ _recover_failed }}"
    min_nodes: "{{ cluster_min_nodes }}"
    model: "{{ cluster_models[groups.trainers[0]] }}"
  register: __recover_plan
"""

RETURN = r"""
survivors:
  description: The nodes the job runs on, new rank 0 first.
  returned: success
  type: list
dropped:
  description: C({host, reason, old_rank}) of every dropped node.
  returned: success
  type: list
models:
  description: The new cluster model of every survivor.
  returned: success
  type: dict
summary:
  description: One line naming the dropped nodes, why, and the new rank map.
  returned: always
  type: str
"""

from ansible_collections.trainyard.core.plugins.module_utils import recover as rc
from ansible_collections.trainyard.core.plugins.plugin_utils import bases


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        model = dict(args.get("model") or {})
        min_nodes = args.get("min_nodes", 1)
        failed = {h: [v] if isinstance(v, str) else list(v or []) for h, v in dict(args.get("failed") or {}).items()}
        for host, records in dict(args.get("records") or {}).items():
            found = rc.failed_checks(records, str(args.get("run_id") or ""))
            if found:
                failed[host] = failed.get(host, []) + found
        try:
            min_nodes = int(min_nodes) if str(min_nodes).strip().lstrip("-").isdigit() else min_nodes
            plan = rc.plan_survivors(list(args.get("hosts_by_rank") or []), dict(args.get("unreachable") or {}),
                                     failed, min_nodes,
                                     int(model.get("nproc_per_node") or 1), int(model.get("master_port") or 39500),
                                     dict(args.get("data_addresses") or {}), str(args.get("master_addr") or ""))
        except rc.RecoverError as exc:
            return dict(failed=True, msg=str(exc), summary=str(exc))
        return dict(msg=plan["summary"], **plan)
