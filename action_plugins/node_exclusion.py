# -*- coding: utf-8 -*-
"""Leave out the nodes that failed a check (cluster_node_failure_policy: exclude) and remember the machines that
failed, on the controller (plugin_utils/bad_machines.py decides; this action reads and writes the record)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_exclusion
short_description: Leave failing nodes out of the launch and keep the record of bad machines
description:
  - Runs on the controller only, after the prepare play recorded every node's checks.
  - Reads the record of machines that failed (I(record_path), JSON; absent is empty), removes what I(clear) names,
    adds every node that failed a check of this run under its machine identity (GPU UUIDs and serials, machine id,
    never the address), and writes it back (not in check mode; only when it changed).
  - With I(policy) C(exclude), the failing nodes and the machines of the record are left out and the others get a
    cluster model with contiguous ranks (recover.yml's rule); fails naming the nodes when fewer than I(min_nodes)
    remain. With C(fail) nothing is left out and the record's machines are named as warnings.
  - Fails with one line naming the record file and the fix when it is not a record.
options:
  hosts_by_rank:
    description: The trainers, rank 0 first (the full-size cluster model's hosts_by_rank).
    type: list
    elements: str
    required: true
  records:
    description: "C({host: its preflight_results}) of every trainer."
    type: dict
    required: true
  identities:
    description: "C({host: nvidia_gpu_identity}) of every trainer (None where unknown)."
    type: dict
    default: {}
  run_id:
    description: This run's id (records of other runs are ignored).
    type: str
    default: ""
  policy:
    description: C(fail) or C(exclude) (cluster_node_failure_policy).
    type: str
    default: fail
  min_nodes:
    description: The fewest nodes the job may run on (cluster_min_nodes).
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
    description: C(cluster_master_addr) as the user set it.
    type: str
    default: ""
  record_path:
    description: The record's file on the controller.
    type: path
    required: true
  clear:
    description: Remove these entries first (an id, a node name last seen with it, or C(all)); "" removes none.
    type: str
    default: ""
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Leave out the failing nodes and remember the machines
  node_exclusion:
    hosts_by_rank: "{{ cluster_hosts_by_rank }}"
    records: "{{ dict(groups.trainers | zip(groups.trainers | map('extract', hostvars, 'preflight_results'))) }}"
    policy: exclude
    model: "{{ cluster_models[groups.trainers[0]] }}"
    record_path: runs/bad_machines.json
  register: __cluster_exclusion
"""

RETURN = r"""
excluded:
  description: C({host, id, reason (failed or remembered), checks}) of every node left out.
  returned: success
  type: list
kept:
  description: The nodes the job launches on, rank 0 first.
  returned: success
  type: list
models:
  description: The kept nodes' new cluster models (policy exclude with a node left out; else empty).
  returned: success
  type: dict
remembered:
  description: C({host, id, last_failed, checks}) of the nodes the record names that passed this run.
  returned: success
  type: list
summary:
  description: One line.
  returned: always
  type: str
lines:
  description: The summary, the remembered machines, what was cleared and the nodes that cannot be remembered.
  returned: success
  type: list
machines:
  description: The record's entries as written (C({id, last_host, first_failed, last_failed, failures, checks, ...})),
    for the report and the health page.
  returned: success
  type: list
"""

import datetime
import os
import tempfile

from ansible_collections.trainyard.core.plugins.module_utils import recover as rc
from ansible_collections.trainyard.core.plugins.plugin_utils import bad_machines as bm
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, shards


def _read(path):
    try:
        with open(path) as f:
            return f.read(1 << 22)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise bm.BadMachinesError("cannot read %s (%s). Fix: make it readable, or move it aside" % (path, exc))


def _write(path, text):
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".bad_machines.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        # In a sharded run (docs/sharding.md) one shard reads and writes the record and every shard takes its answer:
        # the others would read the record it already wrote.
        # A shard whose nodes were all left out retires: the other shards' node steps stop waiting for it.
        try:
            out = shards.once("exclude-decision", lambda: self.decide_here(args), shards.current())
            if out.get("excluded") and not out.get("failed"):
                shards.retire_if_none_left(out.get("models") or {})
            return out
        except shards.ShardError as exc:
            return dict(failed=True, msg="node_exclusion: %s" % exc)

    def decide_here(self, args):
        path = os.path.abspath(str(args.get("record_path") or ""))
        model = dict(args.get("model") or {})
        failed = {}
        for host, records in dict(args.get("records") or {}).items():
            found = rc.failed_checks(records, str(args.get("run_id") or ""))
            if found:
                failed[host] = found
        min_nodes = args.get("min_nodes", 1)
        min_nodes = int(min_nodes) if str(min_nodes).strip().lstrip("-").isdigit() else min_nodes
        try:
            text = _read(path)
            record = bm.load(text, path)
            record, cleared = bm.clear(record, args.get("clear") or "")
            out = bm.decide(list(args.get("hosts_by_rank") or []), failed, dict(args.get("identities") or {}),
                            record, str(args.get("policy") or "fail"), min_nodes,
                            datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            str(args.get("run_id") or ""), int(model.get("nproc_per_node") or 1),
                            int(model.get("master_port") or 39500), dict(args.get("data_addresses") or {}),
                            str(args.get("master_addr") or ""))
        except bm.BadMachinesError as exc:
            return dict(failed=True, msg=str(exc), summary=str(exc))
        new = bm.dump(out.pop("record"))
        changed = new != text and (bool(text.strip()) or bool(bm.load(new)["machines"]))
        if changed and not self._task.check_mode:
            try:
                _write(path, new)
            except OSError as exc:
                return dict(failed=True, msg="cannot write %s (%s). Fix: make its directory writable" % (path, exc))
        if not out["excluded"]:
            out["models"] = {}
        lines = [out["summary"]] + out["notes"] + (["Cleared from the record: " + ", ".join(cleared)] if cleared else [])
        if out["unknown"]:
            lines.append("Not remembered (no machine identity: the nvidia_driver role did not read the node): "
                         + ", ".join(out["unknown"]))
        return dict(out, cleared=cleared, record_path=path, record_changed=changed, msg=out["summary"], lines=lines,
                    machines=bm.load(new)["machines"])
