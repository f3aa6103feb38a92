# -*- coding: utf-8 -*-
"""Split a large run over several ansible-playbook processes, one per shard of the nodes (docs/sharding.md)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainyard_shards
short_description: Run the node plays of a large cluster in several ansible-playbook processes
description:
  - "Above I(per_shard) nodes, splits the nodes (rank order) into K contiguous shards (K = ceil(n / per_shard), at
    most I(max_shards)) and runs the same playbook once per shard: a child C(ansible-playbook) with the parent's own
    command line, C(--limit) its shard's nodes, the run id, and C(TRAINYARD_SHARD=i/K) in its environment, in a
    process group of its own, its output in C(<run dir>/shards/<i>.log). Every cross-node step of the roles
    exchanges its values between the children (plugin_utils/shards.py), so each child gets the answer one process
    would; one child writes the report."
  - "Prints every child's failures as they come (the node and the fix, prefixed with the shard), waits for every
    child, and fails naming each shard that failed and its log. Sets C(trainyard_sharded) on the controller host: the
    parent's own node plays then select no host (the children ran them)."
  - "Does not split (the run goes on in one process) at or below I(per_shard) nodes, with I(per_shard) 0, with
    C(--limit) given, or with a password prompt on the command line (a child has no terminal), and says so."
  - Stops only the process groups it started, after a grace period, when the parent is interrupted.
options:
  nodes:
    description: Every node of the cluster in rank order.
    type: list
    elements: str
    required: true
  per_shard:
    description: C(cluster_shard_nodes), the nodes a process runs; 0 never splits.
    type: int
    default: 128
  max_shards:
    description: C(cluster_shard_max), at most this many children; 0 is half the controller's cores.
    type: int
    default: 0
  expected:
    description: >-
      Whether the validate play decided that this process splits (C(__cluster_splits): it then gave the nodes their
      model without C(hosts_by_rank)). A run that should split and does not stops here, before any node play.
    type: bool
    default: false
  wait_s:
    description: C(cluster_shard_wait_s), how long a cross-node step waits for the other shards.
    type: int
    default: 1800
  run_dir:
    description: C(cluster_run_dir) of this run; the shards' directory is its C(shards/).
    type: str
    required: true
  run_id:
    description: The run id the children take (names the report directory).
    type: str
    required: true
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Split the run when the cluster is large
  trainyard_shards:
    nodes: "{{ cluster_hosts_by_rank }}"
    per_shard: "{{ cluster_shard_nodes }}"
    run_dir: "{{ cluster_run_dir | realpath }}"
    run_id: "{{ _cluster_run_id }}"
"""

RETURN = r"""
sharded:
  description: Whether the run was split (the children ran the node plays).
  returned: always
  type: bool
shards:
  description: Per shard, its index, first and last node, node count, exit code and log.
  returned: when sharded
  type: list
"""

import os
import sys
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.utils.display import Display
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, shards

display = Display()


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        nodes = bases.str_list(args.get("nodes"))
        try:
            per_shard, max_shards = int(args.get("per_shard", 128)), int(args.get("max_shards", 0))
            wait_s = int(args.get("wait_s", 1800))
        except (TypeError, ValueError):
            raise AnsibleActionFail("trainyard_shards: cluster_shard_nodes, cluster_shard_max and cluster_shard_wait_s "
                                    "are whole numbers") from None
        if per_shard < 0 or max_shards < 0 or wait_s < 1:
            raise AnsibleActionFail("trainyard_shards: cluster_shard_nodes and cluster_shard_max are 0 or more, "
                                    "cluster_shard_wait_s 1 or more")
        plan, why = shards.decide(nodes, per_shard, max_shards, sys.argv)
        if why and boolean(args.get("expected", False), strict=False):
            raise AnsibleActionFail("trainyard_shards: the validate play decided to split this run and this play does "
                                    "not (%s): its node plays would run without every node's cluster model. Nothing "
                                    "was changed on a node; rerun, and report it if it happens again" % why)
        if why:
            if len(plan) > 1 and shards.current() is None:
                display.warning("Not splitting the run over %d processes: %s." % (len(plan), why))
            return {"sharded": False, "msg": why}
        root = os.path.join(str(args.get("run_dir")), "shards")
        children = shards.Children(root, plan, sys.executable, sys.argv, str(args.get("run_id")), wait_s)
        for i, part in enumerate(plan):
            display.display("shard %d/%d: %d node(s) %s..%s, log %s" % (i, len(plan), len(part), part[0], part[-1],
                                                                        os.path.join(root, "%d.log" % i)))
        try:
            while children.running():
                for i, line in children.poll():
                    display.display("[shard %d] %s" % (i, line))
                time.sleep(0.5)
            for i, line in children.poll():
                display.display("[shard %d] %s" % (i, line))
        except BaseException:
            children.stop()
            raise
        report = os.path.join(str(args.get("run_dir")), "report.json")
        if os.path.exists(report):
            display.display("Report: %s\nMarkdown: %s\nHealth page: %s" % (
                report, report[:-len("json")] + "md", os.path.join(os.path.dirname(report), "health.html")))
        out = [{"index": i, "nodes": len(part), "first": part[0], "last": part[-1], "rc": children.rcs.get(i),
                "log": os.path.join(root, "%d.log" % i)} for i, part in enumerate(plan)]
        bad = [s for s in out if s["rc"] != 0]
        result = {"sharded": True, "shards": out, "ansible_facts": {"trainyard_sharded": True}}
        if bad:
            return dict(result, failed=True, msg="The run failed in %d of %d shard(s): %s" % (
                len(bad), len(out), "; ".join("shard %d (nodes %s..%s) exited %s, see %s"
                                              % (s["index"], s["first"], s["last"], s["rc"], s["log"]) for s in bad)))
        return dict(result, msg="Every shard passed: %d node(s) in %d ansible-playbook processes" % (len(nodes),
                                                                                                      len(out)))
