# -*- coding: utf-8 -*-
"""Controller side of the nvidia_driver and fabricmanager roles: what their actions (action_plugins/
nvidia_driver_check.py, fabricmanager_check.py) hand to the verdicts of module_utils/nvidia_smi.py and
module_utils/gpu_health.py, built from the results the nodes' nvidia_gpu_facts calls returned and the roles' options.

Pure: values in (each node's result, what the other nodes' checks compare as peers_of builds it once), records
out, so it is unit-tested without a play (tests/unit/plugin_utils/test_gpu_checks.py).
"""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.module_utils import gpu_health, gpudirect, nvidia_smi
from ansible_collections.trainyard.core.plugins.plugin_utils import bad_machines


def facts_of(result):
    """The nvidia_gpu_facts of one node's nvidia_gpu_facts result; None when nvidia-smi failed or the node has none."""
    return (result or {}).get("nvidia_gpu_facts") or None


def identity_of(result):
    """The machine identity (plugin_utils/bad_machines.py) of one node's nvidia_gpu_facts result: its GPUs' UUIDs
    and serials and its machine id; None when the result says neither."""
    return bad_machines.identity(facts_of(result), (result or {}).get("machine_id"))


# The label of the pending device order in check mode: text for the reader (the nvidia_gpu_facts task of
# roles/nvidia_driver/tasks/verify.yml writes the order); the registered result beside it decides.
DEVICE_ORDER_TASK = "nvidia_driver : Configure CUDA_DEVICE_ORDER=PCI_BUS_ID and read the GPU facts and health"


def peers_of(hosts, facts, visible):
    """What the checks across nodes compare, taken once per play over every node (O(n) in all): {host: None when
    it has no GPU facts, else {driver: its driver version, uuids: the UUIDs of the GPUs it uses (its visible
    devices) that another node lists too}}, in host order.

    hosts, facts, visible: the play's hosts and, in the same order, each one's nvidia_gpu_facts (None when
    nvidia-smi failed) and nvidia_driver_visible_devices. A UUID no other node lists cannot be on two nodes, so each
    node's entry is its driver version and, on a healthy cluster, no UUID at all.
    """
    gpus = [((f or {}).get("gpus") or []) for f in facts]
    nodes_of = {}
    for g_list in gpus:
        for uuid in {g.get("uuid") for g in g_list} - {None, ""}:
            nodes_of[uuid] = nodes_of.get(uuid, 0) + 1
    return {h: None if not f else {
        "driver": f.get("driver_version"),
        "uuids": [g.get("uuid") for g in nvidia_smi.used_gpus(g_list, v or "") if nodes_of.get(g.get("uuid"), 0) > 1]}
        for h, f, g_list, v in zip(hosts, facts, gpus, visible)}


def driver_records(host, result, peers, opts, health=None):
    """Every nvidia_driver check of `host` (nvidia_smi.driver_records, then the health records when `health` is
    given, then the quick burn-in tier's GPUDirect records when the result has the gpudirect read).

    result: this node's registered nvidia_gpu_facts result; peers: peers_of(...) over every node of the play (this
    one's entry is replaced by its own result); opts: nvidia_smi.driver_records's options less error, device_order
    and visible_by_host, which come from this node's result and the peers (whose UUIDs are already those they use);
    health: gpu_health.health_records's options (node_rank, nproc_per_node, visible, since), None without health.
    """
    mine = result or {}
    facts = facts_of(mine)
    all_facts = {h: None if p is None else {"driver_version": p.get("driver"),
                                            "gpus": [{"uuid": u} for u in p.get("uuids") or []]}
                 for h, p in (peers or {}).items()}
    all_facts[host] = facts
    visible_by_host = dict.fromkeys(all_facts, "")
    visible_by_host[host] = opts.get("visible_devices") or ""
    recs = nvidia_smi.driver_records(host, facts, all_facts, dict(
        opts, error="" if "nvidia_gpu_facts" in mine else mine.get("msg"), device_order=mine.get("device_order"),
        visible_by_host=visible_by_host))
    if health is not None:
        recs += gpu_health.health_records(host, mine.get("health"), health)
    if "gpudirect" in mine:
        recs += gpudirect.records(host, mine["gpudirect"], bool((facts or {}).get("gpus")))
    return recs


def fabricmanager_needs(facts, required):
    """(relevant, needed) of one node: it is checked where any GPU shows an NVSwitch fabric (or
    fabricmanager_required is always), and runs the fabric manager itself where it has NVSwitches (or always)."""
    if facts is None or required == "never":
        return False, False
    nvs = facts.get("nvswitch") or {}
    always = required == "always"
    return always or bool(nvs.get("present")), always or bool(nvs.get("local"))


def fabricmanager_read(known, facts, required, probed_systemd):
    """Whether the fabricmanager role reads the node itself: when the nvidia_driver role has not read the GPU facts
    in this run (`known` False), or where the fabric matters (`facts`, the nvidia_driver role's) and systemd may run
    the node (the cluster role's host probe says, `probed_systemd`; None when it did not run), for the fabric
    manager's unit."""
    return not known or (fabricmanager_needs(facts, required)[0] and probed_systemd is not False)


def fabricmanager_opts(read, required, service_name, probe):
    """fabricmanager_records's options: the service manager and unit from the role's read when it read, else from the
    cluster role's host probe (`probe`: fact trainyard_init, {systemd, pid1}, or None)."""
    read = read or {}
    if "service_manager" in read:
        manager = read["service_manager"]
    elif probe is not None:
        manager = "systemd" if probe.get("systemd") else probe.get("pid1")
    else:
        manager = None
    return {"required": required, "service_name": service_name, "service_manager": manager,
            "service": read.get("service")}
