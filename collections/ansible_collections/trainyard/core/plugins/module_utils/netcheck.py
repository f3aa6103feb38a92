# -*- coding: utf-8 -*-
"""Pure functions of the network role: data NIC selection, MTU verdicts, path-MTU diagnosis, rendezvous
port ownership and TCP error classification (stdlib only, Python 2.7/3.x compatible, no I/O).

Used by the modules ``net_facts``, ``path_mtu_check`` and ``port_check`` (on the nodes) and by the role's
filters (on the controller). Everything here takes parsed data and returns data, so it is unit-tested
without a network.
"""

from __future__ import absolute_import, division, print_function

import errno
import fnmatch
import re

# Interfaces NCCL/gloo must never be given: loopback, container/VM bridges and their veth ends, VM taps, overlay
# networks of container orchestrators. Matched on the name (in a container every NIC is a veth by kind). The one
# list: the validation play's check of cluster_data_iface reads it too (plugin_utils/cluster_model.py).
EXCLUDED_EXACT = ("lo",)
EXCLUDED_PREFIXES = ("docker", "veth", "br-", "virbr", "cni", "flannel", "cali", "cilium", "weave", "kube-",
                     "podman", "lxcbr", "lxdbr", "vxlan", "tunl", "genev", "nodelocaldns", "vnet")

# IPv4 (20) + ICMP (8) header bytes: the largest don't-fragment ICMP payload on an MTU of N is N - 28.
ICMP_OVERHEAD = 28
BASE_PAYLOAD = 1472  # 1500 - 28: what every Ethernet path carries


def excluded_reason(name):
    """Why an interface may not carry NCCL traffic, or None when it may."""
    if name in EXCLUDED_EXACT:
        return "%s is the loopback interface" % name
    for prefix in EXCLUDED_PREFIXES:
        if name.startswith(prefix):
            return "%s is a virtual interface (%s*: container/VM bridge or overlay)" % (name, prefix)
    return None


# --------------------------------------------------------------------------- interfaces

def parse_ip_addr(records):
    """``ip -j -d addr show`` (parsed JSON list) -> {name: {mtu, up, operstate, kind, mac, ipv4, ipv6, master}}.

    ``up`` is the administrative state (flag UP) together with carrier (LOWER_UP) or an operstate that is
    not DOWN (some drivers report UNKNOWN while passing traffic)."""
    out = {}
    for rec in records or []:
        name = rec.get("ifname")
        if not name:
            continue
        flags = rec.get("flags") or []
        operstate = rec.get("operstate") or "UNKNOWN"
        admin_up = "UP" in flags
        carrier = "LOWER_UP" in flags or operstate == "UP"
        ipv4, ipv6, nets = [], [], []
        for a in rec.get("addr_info") or []:
            if a.get("family") == "inet":
                ipv4.append(a.get("local"))
                if a.get("local") and a.get("prefixlen") is not None:
                    nets.append("%s/%s" % (a["local"], a["prefixlen"]))
            elif a.get("family") == "inet6":
                ipv6.append(a.get("local"))
        out[name] = {
            "name": name,
            "mtu": int(rec.get("mtu") or 0),
            "admin_up": admin_up,
            "up": bool(admin_up and (carrier or operstate not in ("DOWN", "LOWERLAYERDOWN", "NOTPRESENT"))
                       and "NO-CARRIER" not in flags),
            "operstate": operstate,
            "kind": ((rec.get("linkinfo") or {}).get("info_kind")) or "",
            "mac": rec.get("address") or "",
            "master": rec.get("master") or "",
            "ipv4": [a for a in ipv4 if a],
            "ipv6": [a for a in ipv6 if a],
            "nets": nets,
        }
    return out


def _ipv4_int(text):
    parts = str(text).split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
        return None
    return (int(parts[0]) << 24) | (int(parts[1]) << 16) | (int(parts[2]) << 8) | int(parts[3])


def on_link(link, address):
    """Whether IPv4 ``address`` is inside a subnet of one of ``link``'s addresses (reachable without a router)."""
    addr = _ipv4_int(address)
    if addr is None:
        return False
    for net in (link or {}).get("nets") or []:
        parsed = _ipv4_net(net)
        if parsed and parsed[1] & parsed[3] == addr & parsed[3]:
            return True
    return False


def _ipv4_net(net):
    """'a.b.c.d/p' -> (local text, local int, prefix, mask), or None."""
    local, _, prefix = net.partition("/")
    base = _ipv4_int(local)
    if base is None or not prefix.isdigit():
        return None
    return local, base, int(prefix), (0xFFFFFFFF << (32 - int(prefix))) & 0xFFFFFFFF if int(prefix) else 0


def iface_holding(links, address):
    """Name of the interface that holds ``address``, or None."""
    if not address:
        return None
    for name, link in sorted(links.items()):
        if address in link.get("ipv4", []) or address in link.get("ipv6", []):
            return name
    return None


def parse_route_get(records, rc=0, stderr=""):
    """``ip -j route get ADDR`` -> {ok, dev, type, gateway, prefsrc, error}.

    A blackhole route makes ``ip route get`` fail with EINVAL, prohibit with EACCES, unreachable with
    EHOSTUNREACH; those come back as ok False with the route type named."""
    text = (stderr or "").strip()
    if rc != 0 or not records:
        low = text.lower()
        rtype = "none"
        if "invalid argument" in low:
            rtype = "blackhole"
        elif "permission denied" in low:
            rtype = "prohibit"
        elif "no route to host" in low:
            rtype = "unreachable"
        elif "network is unreachable" in low:
            rtype = "unreachable"
        return {"ok": False, "dev": None, "type": rtype, "gateway": None, "prefsrc": None,
                "error": text or "no route"}
    rec = records[0]
    rtype = rec.get("type") or "unicast"
    ok = rtype in ("unicast", "local") and bool(rec.get("dev"))
    return {"ok": ok, "dev": rec.get("dev"), "type": rtype, "gateway": rec.get("gateway"),
            "prefsrc": rec.get("prefsrc"), "error": "" if ok else "route type %s" % rtype}


def select_iface(links, requested="", route=None, head_address="", own_address="", is_head=False):
    """Pick this node's data interface.

    * ``requested`` (cluster_data_iface) when set: it must exist, be up and not be loopback/virtual;
    * otherwise the interface whose route reaches the head's data address; on the head itself (where the
      route to its own address says ``lo``) the interface that holds the address;
    * but when another (usable) interface holds this node's own data address and the head's data address is
      on its subnet, that one: an overlay address given as ``data_address`` is never traded for the interface
      of another route (an internet bridge's default route or a wider route over it).

    The node's own data address (``own_address``) must sit on the chosen interface.
    Returns {iface, address, mtu, reason, errors: [..], warnings: [..]}.
    """
    route = route or {}
    errors, warnings = [], []
    names = sorted(links)
    usable = [n for n in names if not excluded_reason(n)]
    iface, reason = None, ""
    if requested:
        if requested not in links:
            errors.append("cluster_data_iface %s does not exist on this node (interfaces: %s)"
                          % (requested, ", ".join(usable) or "none"))
        else:
            iface, reason = requested, "cluster_data_iface"
    else:
        holder = iface_holding(links, head_address)
        if is_head or (holder and route.get("dev") in (None, "lo")):
            if holder:
                iface, reason = holder, "holds the head's data address %s" % head_address
            else:
                errors.append("the head's data address %s is on none of this node's interfaces (%s)"
                              % (head_address, ", ".join(usable) or "none"))
        elif not route.get("ok"):
            errors.append("no route to the head's data address %s (%s)"
                          % (head_address, route.get("error") or route.get("type") or "no route"))
        else:
            iface = route.get("dev")
            reason = "route to the head's data address %s%s" % (
                head_address, " via %s" % route["gateway"] if route.get("gateway") else "")
            own = iface_holding(links, own_address)
            if own and own != iface and not excluded_reason(own) and on_link(links[own], head_address):
                # The node's data address (an overlay address on a rented container) names the interface: the
                # route may leave by another NIC (the internet bridge's default route), never chosen over it.
                warnings.append("the route to the head's data address %s leaves by %s, not by %s, which holds "
                                "this node's data address %s" % (head_address, iface, own, own_address))
                iface, reason = own, "holds this node's data address %s" % own_address
            if iface not in links:
                errors.append("the route to %s uses %s, which is not a listed interface" % (head_address, iface))
                iface = None
    link = links.get(iface) if iface else None
    if link is not None:
        why = excluded_reason(iface)
        if why:
            errors.append("%s: NCCL/gloo must not use it (%s)" % (why, reason))
        if not link["up"]:
            errors.append("%s is down (state %s%s)" % (iface, link["operstate"],
                                                      "" if link["admin_up"] else ", administratively down"))
    address = None
    if link is not None:
        if own_address:
            if own_address in link["ipv4"] or own_address in link["ipv6"]:
                address = own_address
            else:
                where = iface_holding(links, own_address)
                errors.append("data address %s is not on %s (%s has %s%s)" % (
                    own_address, iface, iface, ", ".join(link["ipv4"] + link["ipv6"]) or "no address",
                    "; %s is on %s" % (own_address, where) if where else "; no interface of this node has it"))
        if address is None and link["ipv4"]:
            address = link["ipv4"][0]
        elif address is None and link["ipv6"]:
            address = link["ipv6"][0]
    return {"iface": iface, "address": address, "mtu": link["mtu"] if link else None, "reason": reason,
            "errors": errors, "warnings": warnings}


def iface_verdict(host, selected, requested="", uniform=True, uniformity_detail=""):
    """(status, detail, fix) of the network.iface check for one node."""
    errors = selected.get("errors") or []
    if errors:
        if requested and not selected.get("iface"):
            fix = ("on %s: set cluster_data_iface for this node to its data NIC (a host variable: names may "
                   "differ per node), or leave it empty to select by the route to the head" % host)
        elif any("not on" in e for e in errors):
            fix = ("on %s: data_address must be an address of the data interface: fix data_address in the "
                   "inventory, or set cluster_data_iface to the interface that holds it" % host)
        elif any("no route" in e or "is on none" in e for e in errors):
            fix = ("on %s: add a route to the head's data address over the data network (ip route get <addr> "
                   "must name the data NIC), or set cluster_data_iface" % host)
        elif any("down" in e for e in errors):
            fix = "on %s: bring the interface up (ip link set dev %s up) and check its cable/port" % (
                host, selected.get("iface"))
        else:
            fix = ("on %s: set cluster_data_iface to the physical data NIC (not loopback, docker*, veth*, br-*, "
                   "virbr*, cni*, flannel*)" % host)
        return "fail", "; ".join(errors), fix
    detail = "%s (%s), address %s, MTU %s" % (selected.get("iface"), selected.get("reason"),
                                              selected.get("address"), selected.get("mtu"))
    if not uniform:
        return ("warn", detail + "; " + uniformity_detail + ": NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME are "
                "rendered per node", "rename the data NICs the same on every node (e.g. a systemd .link "
                "file) to use one value cluster-wide; per-node values work as they are")
    return "pass", detail, ""


def iface_uniformity(ifaces_by_host):
    """{host: iface} -> {uniform, names: {iface: [hosts]}, detail}. Hosts with no interface are left out."""
    names = {}
    for host in sorted(ifaces_by_host):
        name = ifaces_by_host[host]
        if name:
            names.setdefault(name, []).append(host)
    uniform = len(names) <= 1
    if uniform:
        detail = "every node uses %s" % (next(iter(names)) if names else "no interface")
    else:
        detail = "interface names differ: " + "; ".join(
            "%s on %s" % (n, ", ".join(h)) for n, h in sorted(names.items()))
    return {"uniform": uniform, "names": names, "detail": detail}


# --------------------------------------------------------------------------- MTU and its persistence

def networkd_matches(text, iface):
    """Whether a systemd-networkd .network file's [Match] Name= globs match ``iface``."""
    section, names = None, []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if section == "Match" and "=" in line:
            key, value = line.split("=", 1)
            if key.strip() == "Name":
                names.extend(value.split())
    return any(fnmatch.fnmatchcase(iface, pat) for pat in names if not pat.startswith("!"))


NETPLAN_SECTIONS = ("ethernets", "bonds", "vlans", "bridges", "vrfs", "wifis", "tunnels")


def netplan_section(doc, iface):
    """The netplan section (ethernets, bonds, ...) that defines ``iface`` in a parsed netplan document."""
    net = (doc or {}).get("network") or {}
    for section in NETPLAN_SECTIONS:
        defs = net.get(section) or {}
        if not isinstance(defs, dict):
            continue
        for key, value in defs.items():
            if key == iface:
                return section
            if isinstance(value, dict) and value.get("set-name") == iface:
                return section
    return None


_IFUPDOWN_STANZA = re.compile(r"^(iface|auto|allow-\S+|mapping|source|source-directory|no-auto-down|"
                              r"no-scripts|rename)\b")


def ifupdown_set_mtu(text, iface, mtu):
    """Set ``mtu N`` inside the ``iface <iface> inet ...`` stanza of an ifupdown file.

    Returns (new_text, found): found is False when the file has no inet stanza for the interface (nothing
    changed). An existing mtu line in the stanza is replaced; otherwise one is added after the iface line."""
    lines = (text or "").splitlines(True)
    out, found, i = [], False, 0
    head = re.compile(r"^\s*iface\s+%s\s+inet\s" % re.escape(iface))
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not head.match(line) or found:
            continue
        found = True
        indent, placed = "    ", False
        while i < len(lines):
            body = lines[i]
            stripped = body.strip()
            if stripped and not body[:1].isspace() and _IFUPDOWN_STANZA.match(stripped):
                break
            if stripped and body[:1].isspace():
                indent = body[:len(body) - len(body.lstrip())]
            if re.match(r"^\s+mtu\s+\S+", body):
                out.append("%smtu %d\n" % (indent, mtu))
                placed = True
            else:
                out.append(body)
            i += 1
        if not placed:
            pos = len(out)
            # after the iface line and its option lines, before trailing blank lines
            while pos > 0 and not out[pos - 1].strip():
                pos -= 1
            if pos > 0 and not out[pos - 1].endswith("\n"):
                out[pos - 1] += "\n"
            out.insert(pos, "%smtu %d\n" % (indent, mtu))
    return "".join(out), found


PERSIST_HEADER = "# Managed by trainyard (role network): the data interface MTU.\n"


def persist_text(method, iface, mtu, section=None, text=None):
    """(content, file mode, command that applies it or None) of the MTU where ``method`` keeps it: a netplan
    override, a systemd-networkd drop-in, or the interface's ifupdown stanza (``text``, the file as it is)."""
    if method == "netplan":
        return (PERSIST_HEADER + "network:\n  %s:\n    %s:\n      mtu: %d\n  version: 2\n" % (section, iface, mtu),
                0o600, ["netplan", "generate"])
    if method == "networkd":
        return PERSIST_HEADER + "[Link]\nMTUBytes=%d\n" % mtu, 0o644, ["networkctl", "reload"]
    if method == "ifupdown":
        return ifupdown_set_mtu(text, iface, mtu)[0], 0o644, None
    raise ValueError("no MTU file for the method %r" % method)


def cluster_mtu(configured, measured):
    """The MTU the cluster proves: cluster_data_mtu, or with 0 ("measure it") the smallest data interface MTU
    measured on the nodes (an overlay's MTU is often below 1500: it is read, never assumed). None: none measured."""
    if int(configured or 0) > 0:
        return int(configured)
    values = [int(m) for m in measured if m not in (None, "") and int(m) > 0]
    return min(values) if values else None


def mtu_verdict(host, iface, current, expected, managed, changed=False):
    """(ok, detail, fix) for the data interface's MTU after the role had its chance to set it."""
    if current == expected:
        detail = "%s MTU %d%s" % (iface, current, " (set by the role)" if changed else "")
        return True, detail, ""
    detail = "%s MTU %s on %s, expected cluster_data_mtu %d" % (iface, current, host, expected)
    fix = ("on %s: ip link set dev %s mtu %d (and persist it), or run with network_manage_mtu: true, "
           "or set cluster_data_mtu to what the network carries" % (host, iface, expected))
    if managed:
        fix = ("the role could not set it: check that %s on %s accepts MTU %d (driver max_mtu, bond/VLAN "
               "parent MTU), or lower cluster_data_mtu" % (iface, host, expected))
    return False, detail, fix


# --------------------------------------------------------------------------- path MTU (ping)

def ping_argv(address, size, wait=1):
    """A single don't-fragment ICMP echo with ``size`` payload bytes."""
    return ["ping", "-n", "-M", "do", "-c", "1", "-W", str(int(wait)), "-s", str(int(size)), address]


_MTU_HINT = re.compile(r"mtu\s*=\s*(\d+)", re.I)


def parse_ping(rc, stdout, stderr):
    """Result of one ping -> {ok, outcome, mtu_hint, message}.

    outcome: ok | lost (no reply: dropped on the path or at the receiver) | too_big (the local MTU, or a
    router's "frag needed", is smaller) | unreachable | blocked (route or firewall refuses) | error."""
    text = "%s\n%s" % (stdout or "", stderr or "")
    low = text.lower()
    hint = _MTU_HINT.search(text)
    mtu_hint = int(hint.group(1)) if hint else None
    if rc == 0 and re.search(r"\b1 (packets )?received", low):
        return {"ok": True, "outcome": "ok", "mtu_hint": None, "message": ""}
    if "message too long" in low or "frag needed" in low:
        outcome = "too_big"
    elif "invalid argument" in low:
        outcome = "blocked"  # blackhole route
    elif "permission denied" in low or "prohibited" in low or "operation not permitted" in low:
        outcome = "blocked"
    elif "unreachable" in low:
        outcome = "unreachable"
    elif rc == 1 or "0 received" in low or "100% packet loss" in low:
        outcome = "lost"
    else:
        outcome = "error"
    message = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("PING ", "---", "rtt ")) or "packets transmitted" in line:
            continue
        message = line
        break
    return {"ok": False, "outcome": outcome, "mtu_hint": mtu_hint, "message": message}


def base_size(expected):
    """The small probe's payload: 1472 (any Ethernet path), less on a network below 1500 (an overlay)."""
    return min(BASE_PAYLOAD, int(expected) - ICMP_OVERHEAD)


def path_matrix(probes_by_src):
    """{src: {dst: {full: {ok..}, base: {ok..}}}} -> {'path_mtu': {src: {dst: bool}}, 'path_base': ...}."""
    full, base = {}, {}
    for src, row in (probes_by_src or {}).items():
        for dst, res in (row or {}).items():
            full.setdefault(src, {})[dst] = bool((res.get("full") or {}).get("ok"))
            base.setdefault(src, {})[dst] = bool((res.get("base") or {}).get("ok"))
    return {"path_mtu": full, "path_base": base}


def diagnose_pair(src, dst, probe, mtus, expected, ifaces=None):
    """One failing (src -> dst) probe -> {src, dst, payload, what, detail, fix}, or None when it passed.

    ``mtus``: {host: MTU of its data interface}; ``ifaces``: {host: interface name}."""
    ifaces = ifaces or {}
    full = probe.get("full") or {}
    base = probe.get("base") or {}
    payload = expected - ICMP_OVERHEAD
    base_payload = base_size(expected)
    if full.get("ok") and base.get("ok"):
        return None
    smtu, dmtu = mtus.get(src), mtus.get(dst)
    sif, dif = ifaces.get(src) or "data interface", ifaces.get(dst) or "data interface"
    seen = "MTU %s %s %s, %s %s %s" % (src, sif, smtu, dst, dif, dmtu)
    if not base.get("ok"):
        what = base.get("outcome") or "lost"
        detail = "%s -> %s: even a %d-byte ping fails (%s%s); %s" % (
            src, dst, base_payload, what, ": " + base["message"] if base.get("message") else "", seen)
        if what == "blocked":
            fix = ("on %s: the route to %s is a blackhole/prohibit route or a firewall rejects ICMP: check "
                   "`ip route get %s` and the firewall on both nodes" % (src, dst, probe.get("address", dst)))
        else:
            fix = ("no data path from %s to %s: check cabling/VLAN/addressing of %s and %s, the firewall "
                   "(ICMP echo), and `ip route get %s` on %s" % (src, dst, sif, dif, probe.get("address", dst), src))
        return {"src": src, "dst": dst, "payload": base_payload, "what": what, "detail": detail, "fix": fix}
    what = full.get("outcome") or "lost"
    low = [h for h, m in ((src, smtu), (dst, dmtu)) if m is not None and m < expected]
    detail = "%s -> %s: %d-byte don't-fragment ping %s, %d bytes pass; %s (cluster_data_mtu %d)" % (
        src, dst, payload, "lost" if what == "lost" else "fails (%s)" % (full.get("message") or what),
        base_payload, seen, expected)
    if low:
        fix = "; ".join("on %s: ip link set dev %s mtu %d" % (h, ifaces.get(h) or "<data iface>", expected)
                        for h in low) + " (or let the role manage it: network_manage_mtu: true)"
    else:
        hint = full.get("mtu_hint")
        fix = ("both ends are at MTU %d: a switch, router or bridge between %s and %s carries less%s; raise "
               "its MTU to %d or lower cluster_data_mtu" % (expected, src, dst,
                                                            " (reported mtu=%d)" % hint if hint else "", expected))
    return {"src": src, "dst": dst, "payload": payload, "what": what, "detail": detail, "fix": fix}


def diagnose(probes_by_src, mtus, expected, ifaces=None):
    """Every failing pair, ordered by (src, dst)."""
    out = []
    for src in sorted(probes_by_src or {}):
        for dst in sorted(probes_by_src[src] or {}):
            d = diagnose_pair(src, dst, probes_by_src[src][dst], mtus, expected, ifaces)
            if d:
                out.append(d)
    return out


# --------------------------------------------------------------------------- which pairs prove the path

FULL_MESH = "full mesh"
SAMPLED = "ring + sample"


def subnet_of(link, address):
    """The IPv4 subnet ('a.b.c.d/p', network address) of ``link`` that holds ``address``, or None."""
    for net in (link or {}).get("nets") or []:
        parsed = _ipv4_net(net)
        if parsed and parsed[0] == address:
            base = parsed[1] & parsed[3]
            return "%d.%d.%d.%d/%d" % (base >> 24, (base >> 16) & 255, (base >> 8) & 255, base & 255, parsed[2])
    return None


def _seeded_order(hosts, seed, round_no):
    """A permutation of ``hosts`` that depends only on the host list, the seed and the round."""
    import hashlib
    import random
    key = "%s|%d|%s" % (seed, round_no, "\0".join(hosts))
    rng = random.Random(int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:16], 16))
    order = list(hosts)
    rng.shuffle(order)
    return order


def path_pairs(hosts, subnets=None, full_mesh_max=16, samples=2, seed=0):
    """Which node probes which, for the path-MTU proof.

    Up to ``full_mesh_max`` nodes a full mesh: every node probes every other (n·(n-1) probes, each pair from
    both ends). Above it, O(1) probes per node:
      * a ring in the given host order (each node probes the next one: every node is in at least 2 pairs);
      * ``samples`` rounds of a seeded random ring (a permutation of the hosts; the same seed and hosts give
        the same pairs on every run, so re-runs are comparable);
      * one representative pair for every pair of data subnets (and within every subnet of 2 or more nodes)
        that the above left uncovered, between the least-loaded nodes of the two.
    Each pair is probed from one end (a ping's echo crosses the path both ways at the full size).
    ``subnets``: {host: subnet or None}. Returns {scheme, probes: {src: [dst, ...]}, pairs, full_mesh_pairs,
    subnet_pairs, subnet_pairs_total, samples, seed}; ``pairs`` counts distinct node pairs proved."""
    order = []
    for h in hosts or []:
        if h not in order:
            order.append(h)
    n = len(order)
    full = n * (n - 1) // 2
    subnets = subnets or {}
    nets = sorted(set(v for v in (subnets.get(h) for h in order) if v))
    members = dict((net, [h for h in order if subnets.get(h) == net]) for net in nets)
    net_pairs = [(a, b) for i, a in enumerate(nets) for b in nets[i:] if a != b or len(members[a]) > 1]
    result = {"scheme": FULL_MESH, "probes": {}, "pairs": full, "full_mesh_pairs": full, "samples": 0,
              "seed": seed, "subnet_pairs": len(net_pairs), "subnet_pairs_total": len(net_pairs)}
    if n <= max(int(full_mesh_max), 1):
        result["probes"] = dict((h, [p for p in order if p != h]) for h in order)
        return result
    seen = set()
    probes = dict((h, []) for h in order)
    degree = dict((h, 0) for h in order)

    def add(src, dst):
        key = (src, dst) if src < dst else (dst, src)
        if src == dst or key in seen:
            return False
        seen.add(key)
        probes[src].append(dst)
        degree[src] += 1
        degree[dst] += 1
        return True

    for i, h in enumerate(order):
        add(h, order[(i + 1) % n])
    for r in range(max(0, int(samples))):
        ring = _seeded_order(order, seed, r + 1)
        for i, h in enumerate(ring):
            add(h, ring[(i + 1) % n])
    rank = dict((h, i) for i, h in enumerate(order))
    for a, b in net_pairs:
        if any((x, y) in seen or (y, x) in seen for x in members[a] for y in members[b] if x != y):
            continue
        src = min(members[a], key=lambda h: (degree[h], rank[h]))
        dst = min((h for h in members[b] if h != src), key=lambda h: (degree[h], rank[h]))
        if len(probes[dst]) < len(probes[src]):
            src, dst = dst, src
        add(src, dst)
    result.update(scheme=SAMPLED, probes=probes, pairs=len(seen), samples=max(0, int(samples)))
    return result


def coverage_text(plan, host=None):
    """One line for the record: which scheme, how many of the full mesh's pairs are proved, this node's share."""
    full = plan["full_mesh_pairs"]
    pct = " (%.1f%%)" % (100.0 * plan["pairs"] / full) if full else ""
    if plan["scheme"] == FULL_MESH:
        text = "full mesh: %d of %d node pairs, each from both ends" % (plan["pairs"], full)
    else:
        text = ("ring + %d seeded random ring%s (seed %s) + one pair per data subnet pair (%d): %d of %d node "
                "pairs%s" % (plan["samples"], "" if plan["samples"] == 1 else "s", plan["seed"],
                             plan["subnet_pairs_total"], plan["pairs"], full, pct))
    if host is not None and host in plan["probes"]:
        probed_by = sum(1 for peers in plan["probes"].values() if host in peers)
        text += node_share_text(len(plan["probes"][host]), probed_by)
    return text


def node_share_text(probes, probed_by):
    """The end of coverage_text for one node: how many peers it probes and how many probe it."""
    return "; this node probes %d and is probed by %d" % (probes, probed_by)


# --------------------------------------------------------------------------- rendezvous port

# Who holds the port (the /proc/net/tcp parser, the /proc/*/fd scan): module_utils/proc_sockets.py.


def port_verdict(port, holders, ours, fix_reset="ansible-playbook reset.yml -e reset_confirm=true", live=False):
    """Decide the rendezvous port check on the head.

    ``holders``: [{pid, command, local, state}] (pid None when no process could be mapped); ``ours``: set
    of PIDs of this tool's job (procgroup.recorded_job); ``live``: that job's leader still runs
    (procgroup.recorded_alive). Returns {state:
    free|running|ours|other, ok, detail, fix}: held by the live job is its rendezvous at work (a re-run of
    site.yml leaves the job running); held by the job's leftovers after it died is what reset.yml frees."""
    if not holders:
        return {"state": "free", "ok": True, "detail": "port %d is free" % port, "fix": ""}
    named = ["PID %s (%s) on %s" % (h.get("pid") if h.get("pid") is not None else "?",
                                    h.get("command") or "command unknown", h.get("local")) for h in holders]
    if all(h.get("pid") in ours for h in holders if h.get("pid") is not None) and \
            any(h.get("pid") is not None for h in holders):
        if live:
            return {"state": "running", "ok": True,
                    "detail": "port %d is this job's rendezvous, the job runs: %s (the launch leaves it running; "
                              "reset.yml stops it)" % (port, "; ".join(named)), "fix": ""}
        return {"state": "ours", "ok": False,
                "detail": "port %d is held by this tool's earlier job: %s" % (port, "; ".join(named)),
                "fix": "a previous trainyard job still holds it: run %s" % fix_reset}
    other = [n for h, n in zip(holders, named) if h.get("pid") not in ours]
    return {"state": "other", "ok": False,
            "detail": "port %d is held by another process: %s" % (port, "; ".join(other)),
            "fix": "stop that process (it is not this tool's job), or choose another cluster_rendezvous_port"}


CONNECT_MESSAGES = {
    "ok": "connected",
    "timeout": "timed out: packets are dropped on the way (a firewall DROP rule on the head or in between)",
    "refused": "connection refused: nothing listens there, or a firewall REJECT rule answers with a reset",
    "unreachable": "no route to host: an ICMP unreachable/prohibited answer (firewall REJECT or routing)",
    "blocked": "the local route or firewall forbids it (blackhole/prohibit route or an OUTPUT rule)",
    "error": "connection failed",
}


def classify_connect_error(err):
    """An exception from socket.connect (or the string 'timeout') -> one of CONNECT_MESSAGES' keys."""
    if err is None:
        return "ok"
    if err == "timeout" or err.__class__.__name__ in ("timeout", "TimeoutError"):
        return "timeout"
    code = getattr(err, "errno", None)
    if code == errno.ECONNREFUSED:
        return "refused"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "unreachable"
    if code in (errno.EINVAL, errno.EACCES, errno.EPERM):
        return "blocked"
    if code == errno.ETIMEDOUT:
        return "timeout"
    return "error"


def reach_verdict(src, head, address, port, outcome, message="", seconds=None):
    """(ok, detail, fix) for a worker's TCP connect to head:port."""
    took = " after %.1f s" % seconds if seconds is not None else ""
    if outcome == "ok":
        return True, "%s -> %s:%d connected%s" % (src, address, port, took), ""
    detail = "%s -> %s (%s):%d %s%s%s" % (src, head, address, port, CONNECT_MESSAGES.get(outcome, outcome), took,
                                         " [%s]" % message if message else "")
    fixes = {
        "timeout": "allow TCP %d from the workers' data network on %s (e.g. iptables -I INPUT -p tcp --dport %d "
                   "-j ACCEPT) and on any firewall in between" % (port, head, port),
        "refused": "check what listens on %s:%d on %s, and REJECT rules for port %d" % (address, port, head, port),
        "unreachable": "check routes and REJECT rules between %s and %s (ip route get %s on %s)"
                       % (src, head, address, src),
        "blocked": "on %s: remove the blackhole/prohibit route or OUTPUT rule for %s (ip route get %s)"
                   % (src, address, address),
    }
    return False, detail, fixes.get(outcome, "check the data network between %s and %s" % (src, head))
