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


def network_iface_verdict(selected, host, requested="", uniformity=None):
    uniformity = uniformity or {"uniform": True, "detail": ""}
    status, detail, fix = netcheck.iface_verdict(host, selected, requested, uniformity["uniform"],
                                                 uniformity["detail"])
    return {"status": status, "detail": detail, "fix": fix}


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


def network_reach_verdict(result, src, head, address, port):
    ok, detail, fix = netcheck.reach_verdict(src, head, address, int(port), result.get("outcome", "error"),
                                             result.get("message", ""), result.get("seconds"))
    return {"ok": ok, "detail": detail, "fix": fix}


def network_ifupdown_mtu(text, iface, mtu):
    return netcheck.ifupdown_set_mtu(text, iface, int(mtu))[0]


class FilterModule(object):
    def filters(self):
        return {
            "network_uniformity": network_uniformity,
            "network_path_plan": network_path_plan,
            "network_bridge_text": network_bridge_text,
            "network_cluster_mtu": network_cluster_mtu,
            "network_iface_verdict": network_iface_verdict,
            "network_mtu_verdict": network_mtu_verdict,
            "network_path_diagnosis": network_path_diagnosis,
            "network_reach_verdict": network_reach_verdict,
            "network_ifupdown_mtu": network_ifupdown_mtu,
        }
