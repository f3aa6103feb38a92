# -*- coding: utf-8 -*-
"""The network role's check records, built on the controller from the raw results of its modules (pure, no I/O).

* ``cluster_plan``: once per play (the ``network_plan`` action, run_once) from every node's ``net_facts`` result:
  whether every node uses the same interface name, the MTU the cluster proves, each node's data MTU and interface,
  and which peers each node pings (``netcheck.path_pairs``: a full mesh up to ``full_mesh_max`` nodes, above it a
  ring, seeded random rings and one pair per data subnet pair), with the coverage of that scheme.
* ``split_plan``: the plan as the values each node's check task takes: what every node shares (O(1) in the node
  count) and each node's own slice (its peers, who probes it, its and its peers' MTUs and interfaces), so no node's
  arguments carry every node's peers.
* ``probe_records``, ``path_record``, ``port_records``: per node (the ``network_checks`` action) from its
  ``net_facts`` result, the plan, the head's ``port_check`` inspect result and this node's pings and rendezvous
  connect: every ``network.*`` record.
"""

from __future__ import annotations

from collections import Counter

from ansible_collections.trainyard.core.plugins.module_utils import netcheck

# The task whose change network.mtu and network.mtu_persist wait for in check mode (pending).
PROBE_TASK = "network : Probe the network, set and persist the data interface MTU"

DISABLED_DETAIL = ("network role off (network_enabled: false): no data interface, MTU, path or port checks on this "
                   "node; NCCL_SOCKET_IFNAME comes from nccl_env_socket_ifname or cluster_data_iface")


def node_view(facts):
    """A node's net_facts result -> {iface, address, mtu, link} ('' and None where it found none)."""
    facts = facts if isinstance(facts, dict) else {}
    selected = facts.get("selected") or {}
    iface = selected.get("iface") or ""
    return {"iface": iface, "address": selected.get("address") or "", "mtu": selected.get("mtu"),
            "link": (facts.get("interfaces") or {}).get(iface)}


def cluster_plan(hosts, facts_by_host, configured_mtu, full_mesh_max=16, samples=2, seed=0):
    """Every cross-node value of the role, once: {hosts, uniform, uniformity, expected, measure, mtus, ifaces,
    peers: {host: [{name, address}]}, probed_by: {host: n}, unaddressed: [host], coverage: {scheme, pairs,
    full_mesh_pairs, subnet_pairs, samples, seed, text}}. ``hosts`` in rank order, ``facts_by_host`` each node's
    net_facts result (a node without one has no interface, address or MTU). Subnets are read only above
    ``full_mesh_max``."""
    hosts = list(hosts)
    views = {h: node_view(facts_by_host.get(h)) for h in hosts}
    uniformity = netcheck.iface_uniformity({h: views[h]["iface"] for h in hosts})
    addressed = [h for h in hosts if views[h]["address"]]
    subnets = {}
    if len(addressed) > int(full_mesh_max):
        subnets = {h: netcheck.subnet_of(views[h]["link"], views[h]["address"]) for h in addressed}
    pairs = netcheck.path_pairs(addressed, subnets, int(full_mesh_max), int(samples), int(seed))
    probed_by = Counter(dst for peers in pairs["probes"].values() for dst in peers)
    return {
        "hosts": hosts, "uniform": uniformity["uniform"], "uniformity": uniformity["detail"],
        "expected": netcheck.cluster_mtu(configured_mtu, [views[h]["mtu"] for h in hosts]),
        "measure": int(configured_mtu or 0) == 0,
        "mtus": {h: views[h]["mtu"] for h in hosts}, "ifaces": {h: views[h]["iface"] for h in hosts},
        "peers": {h: [{"name": p, "address": views[p]["address"]} for p in pairs["probes"][h]] for h in addressed},
        "probed_by": {h: probed_by.get(h, 0) for h in addressed},
        "unaddressed": [h for h in hosts if not views[h]["address"]],
        "coverage": dict({k: pairs[k] for k in ("scheme", "pairs", "full_mesh_pairs", "subnet_pairs", "samples",
                                                 "seed")}, text=netcheck.coverage_text(pairs)),
    }


# The plan's keys that hold one entry per node: split_plan hands each node its own part of them.
PER_NODE = ("hosts", "mtus", "ifaces", "peers", "probed_by", "unaddressed")


def split_plan(plan):
    """(shared, nodes) of a cluster_plan with head: shared, the keys every node's checks read alike, with ``nodes``
    (how many) and ``head_in_play``; nodes, {host: the plan's per-node keys cut to what that host's records read}:
    its peers, who probes it, the other nodes with no data address, and the MTU and interface of itself and its
    peers. ``dict(shared, **nodes[host])`` is a plan the record builders below take for that host."""
    hosts = plan["hosts"]
    shared = {k: v for k, v in plan.items() if k not in PER_NODE}
    shared.update(nodes=len(hosts), head_in_play=plan.get("head") in hosts)
    nodes = {}
    for host in hosts:
        peers = plan["peers"].get(host)
        near = [host] + [p["name"] for p in peers or []]
        nodes[host] = {
            "peers": {} if peers is None else {host: peers},
            "probed_by": {host: plan["probed_by"][host]} if host in plan["probed_by"] else {},
            "unaddressed": [h for h in plan["unaddressed"] if h != host],
            "mtus": {h: plan["mtus"].get(h) for h in near}, "ifaces": {h: plan["ifaces"].get(h) for h in near},
        }
    return shared, nodes


def node_coverage(plan, host):
    """This node's share of the pair scheme, as network.path_mtu states it: the plan's coverage with probes,
    probed_by, unaddressed (the other nodes with no data address) and the text ending in this node's share."""
    peers = plan["peers"].get(host)
    cov = dict(plan["coverage"], probes=len(peers or []), probed_by=plan["probed_by"].get(host, 0),
               unaddressed=[h for h in plan["unaddressed"] if h != host])
    if peers is not None:
        cov["text"] += netcheck.node_share_text(len(peers), cov["probed_by"])
    return cov


def workers_reached(head, reach_by_host):
    """Every node but the head connected to the rendezvous port (the probe listener then ended itself).
    ``reach_by_host``: {host: its network_checks result (reach: {outcome})}."""
    return all(((r or {}).get("reach") or {}).get("outcome") == "ok" for h, r in reach_by_host.items() if h != head)


def bridge_text(bridge):
    """{name, mtu, up} -> 'docker0 MTU 1500 (down)'."""
    return "%s MTU %s%s" % (bridge.get("name"), bridge.get("mtu"), "" if bridge.get("up") else " (down)")


def path_diagnosis(probes, src, mtus, ifaces, expected):
    """This node's probe results -> {ok, failures, detail, fix, pairwise} with both MTUs of each failing pair."""
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


def _mtu_persist(facts, iface, o, expected):
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
                       "survives a reboot" % (iface, expected))
    return rec


def probe_records(facts, o, uniform=True, uniformity="", expected=0):
    """network.iface, network.head_route, network.mtu, network.mtu_persist and network.bridge_mtu of one node
    from its net_facts result. o: host, requested (cluster_data_iface), head_address, is_head, measure
    (cluster_data_mtu 0), manage, persist (the role's switches), mgmt (ansible_host); uniform and uniformity
    (its detail) over the nodes' interface names and expected (the cluster MTU) from the plan."""
    host, selected = o["host"], facts["selected"]
    iface, mtu, expected = selected.get("iface") or "", selected.get("mtu"), int(expected or 0)
    status, detail, fix = netcheck.iface_verdict(host, selected, o.get("requested") or "", uniform, uniformity)
    records = [{"check": "network.iface", "status": status, "detail": detail, "fix": fix,
                "data": {"drift": {"data_iface": iface}}},
               _head_route(host, iface, facts["route"], o["head_address"], o["is_head"])]
    mtu_set = facts.get("mtu_set") or {}
    managed = o["manage"] and not facts.get("mgmt") and not o["measure"]
    ok, mtu_detail, mtu_fix = netcheck.mtu_verdict(host, iface, None if mtu in (None, "") else int(mtu), expected,
                                                   bool(managed), bool(mtu_set.get("changed")))
    rec = {"check": "network.mtu", "status": "skip", "detail": "no data interface (see network.iface)",
           "data": {"drift": {"data_mtu": mtu}}}
    if iface:
        rec.update(status="pass" if ok else "fail", fix=mtu_fix, detail=mtu_detail
                   + (" (measured: cluster_data_mtu 0, the smallest data interface MTU of the nodes)"
                      if o["measure"] else "")
                   + ("; ip link: " + mtu_set["error"] if mtu_set.get("error") else "")
                   + ("; not changed: %s carries Ansible" % iface if facts.get("mgmt") and not ok else ""))
    pending = {"pending_on": {PROBE_TASK: {"changed": bool(facts.get("changed"))}}}
    records += [dict(rec, **pending), dict(_mtu_persist(facts, iface, o, expected), **pending)]
    bridges = facts.get("bridges") or []
    small = [b for b in bridges if b.get("up") and int(b.get("mtu") or 0) < expected]
    records.append({
        "check": "network.bridge_mtu", "status": "warn" if small else "pass",
        "detail": "no container/VM bridge on this node" if not bridges else ", ".join(map(bridge_text, bridges))
        + ("; containers without host networking would use a smaller MTU than %d (the training container uses host "
           "networking)" % expected if small else ""),
        "fix": 'set "mtu": %d in /etc/docker/daemon.json (docker0) and com.docker.network.driver.mtu=%d on user '
               "networks, or run containers with --network host" % (expected, expected)})
    return records


def path_record(host, plan, path):
    """The network.path_mtu record of one node from its pings (path_mtu_check's probes and seconds; None when it
    pinged nothing: no data interface here)."""
    rec = {"check": "network.path_mtu", "status": "skip", "detail": "no data interface on this node (see network.iface)"}
    if path is None:
        return rec
    verdict = path_diagnosis(path.get("probes"), host, plan["mtus"], plan["ifaces"], plan["expected"] or 0)
    coverage = node_coverage(plan, host)
    unprobed = coverage["unaddressed"]
    rec.update(status="pass" if verdict["ok"] else "fail", fix=verdict["fix"],
               detail="%s (%s s)" % (verdict["detail"], path.get("seconds"))
               + ("; " + coverage["text"] if coverage.get("text") else "")
               + ("; not probed (no data address): " + ", ".join(unprobed) if unprobed else ""),
               data={"pairwise": verdict["pairwise"], "path_coverage": coverage})
    return rec


def port_records(host, o, held, reach):
    """network.rendezvous_port and network.rendezvous_listen (the head), network.rendezvous_reach (a worker).
    o: nodes (how many in the play), head_in_play, head, master_addr, master_port, check_mode; held: the head's
    port_check inspect result; reach: this worker's connect ({outcome, message, seconds}), None when it did not connect."""
    address, port, head = o["master_addr"], int(o["master_port"]), o["head"]
    held = held if isinstance(held, dict) else {}
    listener = held.get("listener") or {}
    if host == head:
        verdict = held["verdict"]
        records = [{"check": "network.rendezvous_port", "status": "pass" if verdict["ok"] else "fail",
                    "detail": "%s (head %s, master_addr %s)" % (verdict["detail"], head, address),
                    "fix": verdict["fix"], "data": {"drift": {"rendezvous_port": verdict["state"]}}}]
        if listener and not listener.get("listening") and not o["check_mode"]:
            records.append({"check": "network.rendezvous_listen", "status": "fail", "detail": listener["reason"],
                            "fix": "cluster_master_addr (%s) must be an address of the head %s: set it to the head's "
                                   "data address, or fix data_address of the head" % (address, head)})
        return records
    if int(o["nodes"]) < 2 or not o["head_in_play"]:
        return []
    if not listening_or_held(held):
        return [{"check": "network.rendezvous_reach", "status": "skip",
                 "detail": "nothing listens on the head and no probe listener ran: "
                           + (listener.get("reason") or "the head did not start one"),
                 "data": {"pairwise": {"rendezvous": {head: False}}}}]
    reach = reach or {}
    ok, detail, fix = netcheck.reach_verdict(host, head, address, port, reach.get("outcome", "error"),
                                             reach.get("message", ""), reach.get("seconds"))
    return [{"check": "network.rendezvous_reach", "status": "pass" if ok else "fail", "detail": detail, "fix": fix,
             "data": {"pairwise": {"rendezvous": {head: ok}}}}]


def listening_or_held(held):
    """Something answers on the head's port: a holder, or the probe listener. A free port with no listener (check
    mode, or master_addr not on the head) leaves nothing for a worker to reach."""
    held = held if isinstance(held, dict) else {}
    return ((held.get("verdict") or {}).get("state", "free") != "free"
            or bool((held.get("listener") or {}).get("listening")))


def disabled_record():
    """network.enabled: the role is off on this node."""
    return {"check": "network.enabled", "status": "skip", "detail": DISABLED_DETAIL}
