# -*- coding: utf-8 -*-
"""Controller side of the nvidia_driver and fabricmanager roles: what their actions (action_plugins/
nvidia_driver_check.py, fabricmanager_check.py) hand to the verdicts of module_utils/nvidia_smi.py and
module_utils/gpu_health.py, built from the results the nodes' nvidia_gpu_facts calls returned and the roles' options.

Pure: no Ansible object comes in (another node's variables are asked for through a function), so it is unit-tested
without a play (tests/unit/plugin_utils/test_gpu_checks.py).
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


def gpu_sharers(host, facts_by_host):
    """The other nodes that list a GPU UUID this node lists too (their visible devices decide whether they share)."""
    mine = {g.get("uuid") for g in (facts_by_host.get(host) or {}).get("gpus") or []} - {None, ""}
    if not mine:
        return []
    return [h for h, f in facts_by_host.items()
            if h != host and mine & {g.get("uuid") for g in (f or {}).get("gpus") or []}]


def driver_records(host, results, opts, visible_of=None, health=None):
    """Every nvidia_driver check of `host` (nvidia_smi.driver_records, then the health records when `health` is
    given, then the quick burn-in tier's GPUDirect records when the result has the gpudirect read).

    results: {host: its nvidia_gpu_facts result (registered) or None} for every play host, this one included;
    opts: nvidia_smi.driver_records's options less error, device_order and visible_by_host, which come from this
    node's result and from visible_of(host) (another node's nvidia_driver_visible_devices), asked only for the nodes
    that list one of this node's GPU UUIDs: a node that shares none cannot share a GPU in use either;
    health: gpu_health.health_records's options (node_rank, nproc_per_node, visible, since), None without health.
    """
    mine = results.get(host) or {}
    facts_by_host = {h: facts_of(r) for h, r in results.items()}
    visible_by_host = {h: (visible_of(h) if visible_of else "") or "" for h in gpu_sharers(host, facts_by_host)}
    visible_by_host[host] = opts.get("visible_devices") or ""
    recs = nvidia_smi.driver_records(host, facts_by_host.get(host), facts_by_host, dict(
        opts, error="" if "nvidia_gpu_facts" in mine else mine.get("msg"), device_order=mine.get("device_order"),
        visible_by_host=visible_by_host))
    if health is not None:
        recs += gpu_health.health_records(host, mine.get("health"), health)
    if "gpudirect" in mine:
        recs += gpudirect.records(host, mine["gpudirect"], bool((facts_by_host.get(host) or {}).get("gpus")))
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
