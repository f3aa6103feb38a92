# -*- coding: utf-8 -*-
"""Filters of the network role: thin wrappers over module_utils/netcheck.py (pure, unit-tested there)."""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.module_utils import netcheck


def network_uniformity(hostvars, hosts):
    """hostvars, [host] -> {uniform, names, detail} over the hosts' network_iface."""
    return netcheck.iface_uniformity({h: (hostvars[h].get("network_iface") or "") for h in hosts if h in hostvars})


def network_cluster_mtu(hostvars, hosts, configured):
    """cluster_data_mtu, or with 0 the smallest data interface MTU measured on the hosts (fact _network_mtu)."""
    return netcheck.cluster_mtu(configured, [(hostvars[h].get("_network_mtu") if h in hostvars else None)
                                             for h in hosts])


def network_bridge_text(bridge):
    """{name, mtu, up} -> 'docker0 MTU 1500 (down)'."""
    return "%s MTU %s%s" % (bridge.get("name"), bridge.get("mtu"), "" if bridge.get("up") else " (down)")


def network_path_plan(hostvars, hosts, me, full_mesh_max=16, samples=2, seed=0):
    """The peers this node probes for the path-MTU proof and the coverage of the whole scheme
    (netcheck.path_pairs): {peers: [{name, address}], coverage: {scheme, pairs, full_mesh_pairs, subnet_pairs,
    samples, seed, probes, probed_by, unaddressed, text}}. Subnets are read only above full_mesh_max."""
    addrs = {}
    for h in hosts:
        addrs[h] = (hostvars[h].get("network_address") if h in hostvars else None) or ""
    addressed = [h for h in hosts if addrs[h]]
    subnets = {}
    if len(addressed) > int(full_mesh_max):
        for h in addressed:
            facts = hostvars[h].get("__network_facts") or {}
            link = (facts.get("interfaces") or {}).get(hostvars[h].get("network_iface") or "")
            subnets[h] = netcheck.subnet_of(link, addrs[h])
    plan = netcheck.path_pairs(addressed, subnets, int(full_mesh_max), int(samples), int(seed))
    mine = plan["probes"].get(me, [])
    coverage = {k: plan[k] for k in ("scheme", "pairs", "full_mesh_pairs", "subnet_pairs", "samples", "seed")}
    coverage.update(probes=len(mine), probed_by=sum(1 for peers in plan["probes"].values() if me in peers),
                    unaddressed=[h for h in hosts if not addrs[h] and h != me],
                    text=netcheck.coverage_text(plan, me if me in plan["probes"] else None))
    return {"peers": [{"name": p, "address": addrs[p]} for p in mine], "coverage": coverage}


def network_mtu_verdict(current, host, iface, expected, managed, changed=False):
    ok, detail, fix = netcheck.mtu_verdict(host, iface, None if current in (None, "") else int(current),
                                           int(expected), bool(managed), bool(changed))
    return {"ok": ok, "detail": detail, "fix": fix}


def network_path_diagnosis(probes, src, hostvars, hosts, expected):
    """This node's probe results -> {ok, failures, detail, fix, pairwise} with both MTUs of each failing pair."""
    mtus = {h: hostvars[h].get("_network_mtu") for h in hosts if h in hostvars}
    ifaces = {h: hostvars[h].get("network_iface") for h in hosts if h in hostvars}
    rows = {src: probes or {}}
    failures = netcheck.diagnose(rows, mtus, int(expected), ifaces)
    matrix = netcheck.path_matrix(rows)
    pairwise = {k: v.get(src, {}) for k, v in matrix.items()}
    n = len(probes or {})
    if failures:
        detail = "; ".join(f["detail"] for f in failures)
        fix = "; ".join(dict.fromkeys(f["fix"] for f in failures))
    else:
        detail = "%d peer%s pass %d- and %d-byte don't-fragment pings" % (
            n, "" if n == 1 else "s", int(expected) - netcheck.ICMP_OVERHEAD, netcheck.base_size(expected))
        fix = ""
    return {"ok": not failures, "failures": failures, "detail": detail, "fix": fix, "pairwise": pairwise}


# The task whose change network.mtu and network.mtu_persist wait for in check mode (pending).
PROBE_TASK = "network : Probe the network, set and persist the data interface MTU"


def _head_route(host, iface, route, head_address, is_head):
    """The network.head_route record: the route from this node to the head's data address."""
    if is_head:
        return {"check": "network.head_route", "status": "pass", "detail": "this node is the head"}
    if not route.get("ok"):
        nic = iface or "the data NIC"
        return {"check": "network.head_route", "status": "fail",
                "detail": "route to %s: %s (type %s)" % (head_address, route.get("error"), route.get("type")),
                "fix": "on %s: remove the %s route for %s or add one over %s (ip route get %s must name %s)"
                       % (host, route.get("type"), head_address, nic, head_address, nic)}
    if not iface:
        return {"check": "network.head_route", "status": "skip", "detail": "no data interface (see network.iface)"}
    detail = "route to %s: dev %s%s" % (head_address, route["dev"],
                                        " via " + route["gateway"] if route.get("gateway") else "")
    if route["dev"] == iface:
        return {"check": "network.head_route", "status": "pass", "detail": detail}
    return {"check": "network.head_route", "status": "warn",
            "detail": detail + "; the data interface is %s: traffic to the head leaves by another NIC" % iface,
            "fix": "on %s: route %s over %s (ip route add %s dev %s), or set cluster_data_iface to %s"
                   % (host, head_address, iface, head_address, iface, route["dev"])}


def _mtu_persist(facts, iface, o):
    """The network.mtu_persist record: how (and whether) the MTU survives a reboot."""
    config, mgmt, in_container = facts["config"], facts.get("mgmt"), facts.get("in_container")
    error = (facts.get("persisted") or {}).get("error")
    rec = {"check": "network.mtu_persist", "status": "skip"}
    if o["measure"] and iface:
        rec["detail"] = "cluster_data_mtu 0: the measured MTU of %s is used, nothing is set or persisted" % iface
    elif not (o["manage"] and o["persist"]):
        rec["detail"] = "MTU management is off (network_manage_mtu/network_persist_mtu)"
    elif not iface:
        rec["detail"] = "no data interface"
    elif mgmt:
        rec.update(status="warn", detail="%s also carries Ansible (%s): its MTU is left alone" % (iface, o["mgmt"]),
                   fix="set the MTU of %s out of band (console) or give Ansible a management interface apart "
                       "from the data network" % iface)
    elif config["method"] != "none":
        where = config.get("path") or config.get("connection")
        rec.update(status="fail" if error else "pass",
                   detail="persisted with %s in %s" % (config["method"], where) if not error
                   else "not persisted with %s in %s: %s" % (config["method"], where, error),
                   fix="on %s: make %s writable and its tool (netplan, networkctl, nmcli) work, then re-run"
                       % (o["host"], where))
    elif in_container:
        rec["detail"] = ("not persisted: no network configuration system found (the node is a container; its "
                         "engine sets the MTU)")
    else:
        rec.update(status="warn", detail="not persisted: no network configuration system found",
                   fix="configure %s with netplan, NetworkManager, systemd-networkd or ifupdown, with MTU %s, so it "
                       "survives a reboot" % (iface, o["expected"]))
    return rec


def network_probe_records(facts, hostvars, hosts, o):
    """network.iface, network.head_route, network.mtu, network.mtu_persist and network.bridge_mtu of one node
    from its net_facts result. o: host, requested (cluster_data_iface), head_address, is_head, expected (the
    cluster MTU), measure (cluster_data_mtu 0), manage, persist (the role's switches), mgmt (ansible_host)."""
    host, selected = o["host"], facts["selected"]
    iface, mtu, expected = selected.get("iface") or "", selected.get("mtu"), int(o["expected"])
    uniformity = network_uniformity(hostvars, hosts)
    status, detail, fix = netcheck.iface_verdict(host, selected, o.get("requested") or "", uniformity["uniform"],
                                                 uniformity["detail"])
    records = [{"check": "network.iface", "status": status, "detail": detail, "fix": fix,
                "data": {"drift": {"data_iface": iface}}},
               _head_route(host, iface, facts["route"], o["head_address"], o["is_head"])]
    mtu_set = facts.get("mtu_set") or {}
    managed = o["manage"] and not facts.get("mgmt") and not o["measure"]
    verdict = network_mtu_verdict(mtu, host, iface, expected, managed, mtu_set.get("changed"))
    rec = {"check": "network.mtu", "status": "skip", "detail": "no data interface (see network.iface)",
           "data": {"drift": {"data_mtu": mtu}}}
    if iface:
        rec.update(status="pass" if verdict["ok"] else "fail", fix=verdict["fix"], detail=verdict["detail"]
                   + (" (measured: cluster_data_mtu 0, the smallest data interface MTU of the nodes)"
                      if o["measure"] else "")
                   + ("; ip link: " + mtu_set["error"] if mtu_set.get("error") else "")
                   + ("; not changed: %s carries Ansible" % iface if facts.get("mgmt") and not verdict["ok"] else ""))
    pending = {"pending_on": {PROBE_TASK: {"changed": bool(facts.get("changed"))}}}
    records += [dict(rec, **pending), dict(_mtu_persist(facts, iface, o), **pending)]
    bridges = facts.get("bridges") or []
    small = [b for b in bridges if b.get("up") and int(b.get("mtu") or 0) < expected]
    records.append({
        "check": "network.bridge_mtu", "status": "warn" if small else "pass",
        "detail": "no container/VM bridge on this node" if not bridges else ", ".join(map(network_bridge_text, bridges))
        + ("; containers without host networking would use a smaller MTU than %d (the training container uses host "
           "networking)" % expected if small else ""),
        "fix": 'set "mtu": %d in /etc/docker/daemon.json (docker0) and com.docker.network.driver.mtu=%d on user '
               "networks, or run containers with --network host" % (expected, expected)})
    return records


def network_workers_reached(hostvars, hosts, head):
    """Every node but the head connected to the rendezvous port (the probe listener then ended itself)."""
    return all(((hostvars[h].get("__network_reach") or {}).get("outcome") == "ok") for h in hosts if h != head)


def network_verify_records(hostvars, host, o):
    """network.enabled (role off), network.path_mtu, network.rendezvous_port, network.rendezvous_listen and
    network.rendezvous_reach of one node. o: enabled, hosts (in rank order), head, master_addr, master_port,
    expected, path_check, port_check, check_mode."""
    if not o["enabled"]:
        return [{"check": "network.enabled", "status": "skip",
                 "detail": "network role off (network_enabled: false): no data interface, MTU, path or port checks on "
                           "this node; NCCL_SOCKET_IFNAME comes from nccl_env_socket_ifname or cluster_data_iface"}]
    mine, hosts, head = hostvars[host], o["hosts"], o["head"]
    records = []
    path = mine.get("__network_path") or {"skipped": True}
    if o["path_check"] and len(hosts) > 1:
        rec = {"check": "network.path_mtu", "status": "skip",
               "detail": "no data interface on this node (see network.iface)"}
        if not path.get("skipped"):
            verdict = network_path_diagnosis(path["probes"], host, hostvars, hosts, o["expected"])
            coverage = path.get("coverage") or {}
            unprobed = coverage.get("unaddressed") or []
            rec.update(status="pass" if verdict["ok"] else "fail", fix=verdict["fix"],
                       detail="%s (%s s)" % (verdict["detail"], path["seconds"])
                       + ("; " + coverage["text"] if coverage.get("text") else "")
                       + ("; not probed (no data address): " + ", ".join(unprobed) if unprobed else ""),
                       data={"pairwise": verdict["pairwise"], "path_coverage": coverage})
        records.append(rec)
    if not o["port_check"]:
        return records
    address, port = o["master_addr"], int(o["master_port"])
    held = hostvars[head].get("__network_port") or {}
    listener = held.get("listener") or {}
    if host == head:
        verdict = held["verdict"]
        records.append({"check": "network.rendezvous_port", "status": "pass" if verdict["ok"] else "fail",
                        "detail": "%s (head %s, master_addr %s)" % (verdict["detail"], head, address),
                        "fix": verdict["fix"], "data": {"drift": {"rendezvous_port": verdict["state"]}}})
        if listener and not listener.get("listening") and not o["check_mode"]:
            records.append({"check": "network.rendezvous_listen", "status": "fail", "detail": listener["reason"],
                            "fix": "cluster_master_addr (%s) must be an address of the head %s: set it to the head's "
                                   "data address, or fix data_address of the head" % (address, head)})
        return records
    if len(hosts) < 2 or head not in hosts:
        return records
    # Free port on the head but no listener (check mode, or master_addr not on the head): nothing to reach.
    if (held.get("verdict") or {}).get("state", "free") == "free" and not listener.get("listening"):
        records.append({"check": "network.rendezvous_reach", "status": "skip",
                        "detail": "nothing listens on the head and no probe listener ran: "
                                  + (listener.get("reason") or "the head did not start one"),
                        "data": {"pairwise": {"rendezvous": {head: False}}}})
        return records
    reach = mine.get("__network_reach") or {}
    ok, detail, fix = netcheck.reach_verdict(host, head, address, port, reach.get("outcome", "error"),
                                             reach.get("message", ""), reach.get("seconds"))
    records.append({"check": "network.rendezvous_reach", "status": "pass" if ok else "fail", "detail": detail,
                    "fix": fix, "data": {"pairwise": {"rendezvous": {head: ok}}}})
    return records


class FilterModule(object):
    def filters(self):
        return {
            "network_uniformity": network_uniformity,
            "network_path_plan": network_path_plan,
            "network_cluster_mtu": network_cluster_mtu,
            "network_probe_records": network_probe_records,
            "network_verify_records": network_verify_records,
            "network_workers_reached": network_workers_reached,
        }
