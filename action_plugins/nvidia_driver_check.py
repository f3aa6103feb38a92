# -*- coding: utf-8 -*-
"""Record the nvidia_driver role's checks of every node from its nvidia_gpu_facts result and what every node's checks
compare, once for every node (run_once), controller side, no round trip; give each node its GPU facts as the host
variable nvidia_gpu_facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_check
short_description: Record the driver, GPU and GPU health checks of every node and keep each node's GPU facts
description:
  - "Runs on the controller only, once for every node (C(run_once: true)), after the nvidia_gpu_facts task of the
    role ran on every node of the play. No round trip."
  - "First what the checks across nodes compare (each node's driver version and the UUIDs of the GPUs it uses that
    another node lists too), built once over I(peers_of), O(n) in all (C(plugin_utils/gpu_checks.py) C(peers_of));
    then every C(nvidia_driver.*) check of each node of I(nodes), as preflight_check does, from its result in
    I(results) and the peers: C(module_utils/nvidia_smi.py) and C(module_utils/gpu_health.py) decide them,
    C(plugin_utils/gpu_checks.py) hands them their inputs. Each record names its node."
  - "Each node's options come from its result's C(kept) (the nvidia_gpu_facts task's I(keep), as that node's own
    variables give them): C(version), C(branch), C(visible), C(shared_gpus_ok), C(device_order_file), C(health),
    C(since), C(gpus_per_node), C(nproc_per_node), C(node_rank) and C(model_nproc) (its cluster model's). A result
    without them (a node that did not run the task) is read with this task's variables."
  - "A node's result may carry C(burnin_record) (the burn-in tier's record, nvidia_gpu_facts I(burnin)): it is
    recorded with that node's checks."
  - Gives every node of I(nodes) the host variables C(nvidia_gpu_facts) (None when nvidia-smi failed) for the roles
    after it, and C(nvidia_gpu_identity) (the machine's GPU UUIDs and serials and machine id,
    plugin_utils/bad_machines.py; None when unknown) for the record of bad machines, each its own. Needs the
    project's callback preflight_records (its ansible.cfg loads it), which keeps records and values of other nodes.
  - In check mode C(nvidia_driver.device_order) is C(pending) where a node's result says the task would write the
    device order (the record's fix names that task).
options:
  peers_of:
    description:
      - "Every node of the play (every shard's in a sharded run): C(hosts) (their names), C(facts) (each one's
        nvidia_gpu_facts, C({}) or None when nvidia-smi failed) and C(visible) (each one's
        C(nvidia_driver_visible_devices)), three lists in one order."
    type: dict
    required: true
  nodes:
    description: The nodes to record (the play's, C(ansible_play_hosts)).
    type: list
    elements: str
    required: true
  results:
    description: Each node's registered nvidia_gpu_facts result (the values, not their names), in the order of I(nodes).
    type: list
    elements: dict
    required: true
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Configure CUDA_DEVICE_ORDER=PCI_BUS_ID and read the GPU facts and health
  nvidia_gpu_facts:
    environment_file: /etc/environment
    set_device_order: true
    health: true
    keep: {version: "{{ nvidia_driver_version }}", visible: "{{ nvidia_driver_visible_devices }}"}
  register: __nvidia_driver_gpu
  failed_when: false

- name: Record the driver, GPU and GPU health checks of every node
  nvidia_driver_check:
    peers_of:
      hosts: "{{ ansible_play_hosts }}"
      facts: "{{ ansible_play_hosts | map('extract', hostvars, '__nvidia_driver_gpu')
                 | map(attribute='nvidia_gpu_facts', default={}) | list }}"
      visible: "{{ ansible_play_hosts | map('extract', hostvars)
                   | map(attribute='nvidia_driver_visible_devices', default='') | list }}"
    nodes: "{{ ansible_play_hosts }}"
    results: "{{ ansible_play_hosts | map('extract', hostvars, '__nvidia_driver_gpu') | list }}"
  run_once: true
"""

RETURN = r"""
peers:
  description: "{host: None (no GPU facts) or {driver, uuids}} over every node of I(peers_of)."
  returned: success
  type: dict
preflight_records:
  description: Every record appended (as preflight_check returns them), each naming its node.
  returned: success
  type: list
"""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, check_records, gpu_checks


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


# A node's options, as its result's kept gives them (its own variables), by this task's variable when not kept.
_KEPT = {"version": "nvidia_driver_version", "branch": "nvidia_driver_branch", "visible": "nvidia_driver_visible_devices",
         "shared_gpus_ok": "nvidia_driver_allow_shared_gpus", "device_order_file": "nvidia_driver_environment_file",
         "health": "nvidia_driver_health_checks", "since": "nvidia_driver_xid_since",
         "gpus_per_node": "cluster_gpus_per_node", "nproc_per_node": "cluster_nproc_per_node"}


def node_options(kept, own):
    """(opts, health) of one node for gpu_checks.driver_records: kept (its result's kept, {} when none) over own (a
    function of a variable's name: this task's value)."""
    kept = kept if isinstance(kept, dict) else {}
    v = {k: kept[k] if k in kept else own(name) for k, name in _KEPT.items()}
    node_rank = kept["node_rank"] if "node_rank" in kept else (own("cluster_model") or {}).get("node_rank")
    model_nproc = kept["model_nproc"] if "model_nproc" in kept else (own("cluster_model") or {}).get("nproc_per_node")
    gpus_per_node = v["gpus_per_node"]
    opts = {
        "version": v["version"] or "",
        "branch": str(v["branch"] or ""),
        "gpus_per_node": gpus_per_node,
        "nproc_per_node": v["nproc_per_node"] if model_nproc is None else model_nproc,
        "gpu_ranks": _int(1 if gpus_per_node is None else gpus_per_node) > 0,
        "visible_devices": v["visible"] or "",
        "shared_gpus_ok": boolean(v["shared_gpus_ok"] if v["shared_gpus_ok"] is not None else False, strict=False),
        "device_order_file": v["device_order_file"],
    }
    health = None
    if boolean(v["health"] if v["health"] is not None else True, strict=False):
        health = {"node_rank": node_rank, "nproc_per_node": model_nproc, "visible": v["visible"] or "",
                  "since": v["since"] if v["since"] is not None else 0}
    return opts, health


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        peers = peers_of(args.get("peers_of"))
        nodes, results = args.get("nodes"), args.get("results")
        if not isinstance(nodes, list) or not isinstance(results, list) or len(nodes) != len(results) \
                or not all(isinstance(r, dict) for r in results):
            raise AnsibleActionFail(
                "nvidia_driver_check: give 'nodes' (the play's hosts) and 'results' (each one's registered "
                "nvidia_gpu_facts result, as values: \"{{ ansible_play_hosts | map('extract', hostvars, "
                "'__nvidia_driver_gpu') | list }}\"), two lists of one length; got %s and %s"
                % (type(nodes).__name__, type(results).__name__))
        records, by_host = [], {}
        for host, result in zip((str(n) for n in nodes), results):
            opts, health = node_options(result.get("kept"), lambda name: self.var(task_vars, name))
            mine = gpu_checks.driver_records(host, result, peers, opts, health)
            # Check mode: the device order the nvidia_gpu_facts task would write is pending on it, not a failure.
            for rec in mine:
                rec.setdefault("host", host)
                if rec["check"] == "nvidia_driver.device_order":
                    rec["pending_on"] = {gpu_checks.DEVICE_ORDER_TASK: result}
            burnin = result.get("burnin_record")
            if isinstance(burnin, dict):
                mine.append(dict(burnin, host=burnin.get("host") or host))
            records += mine
            by_host[host] = {"nvidia_gpu_facts": gpu_checks.facts_of(result),
                             "nvidia_gpu_identity": gpu_checks.identity_of(result)}
        out = self.record(task_vars, *records)  # records for other nodes need the callback: it says so otherwise
        out["peers"] = peers
        if check_records.callback_keeps_records():
            out[check_records.PUBLISH_KEY] = {"by_host": by_host}
        else:  # one node, its own: its values as facts, as a run without the callback reads them
            out.setdefault("ansible_facts", {}).update(by_host.get(task_vars.get("inventory_hostname"), {}))
        return out
