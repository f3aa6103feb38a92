"""Pure functions of the network role (module_utils/netcheck.py): NIC selection, route parsing, ifupdown
editing, ping parsing and pair diagnosis, job ownership of a port, connect errors."""

from __future__ import annotations

import errno
import socket

import pytest
from hypothesis import given, strategies as st

from ansible_collections.trainyard.core.plugins.module_utils import netcheck as nc


def link(name, mtu=9000, ipv4=(), flags=("BROADCAST", "MULTICAST", "UP", "LOWER_UP"), operstate="UP", kind=""):
    return {"ifname": name, "mtu": mtu, "flags": list(flags), "operstate": operstate,
            "linkinfo": {"info_kind": kind} if kind else {},
            "addr_info": [{"family": "inet", "local": a, "prefixlen": 24} for a in ipv4]}


NODE = [link("lo", 65536, ["127.0.0.1"], ["LOOPBACK", "UP", "LOWER_UP"], "UNKNOWN"),
        link("eth0", 1500, ["172.28.1.12"], kind="veth"),
        link("eth1", 9000, ["172.29.1.12"], kind="veth"),
        link("docker0", 1500, ["172.17.0.1"], ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"], "DOWN", "bridge")]


def links(records=NODE):
    return nc.parse_ip_addr(records)


# --------------------------------------------------------------------------- exclusions

@pytest.mark.parametrize("name", ["lo", "docker0", "veth1a2b3c", "br-0123abcd", "virbr0", "cni0", "flannel.1",
                                  "cali12345", "cilium_host", "weave", "kube-ipvs0", "podman0", "vxlan.calico"])
def test_virtual_interfaces_are_excluded(name):
    assert nc.excluded_reason(name)


@pytest.mark.parametrize("name", ["eth0", "eth1", "ens5f0", "enp65s0f1np1", "ib0", "bond0", "bond0.100", "eno1",
                                  "lom1", "local0"])
def test_physical_interfaces_are_allowed(name):
    assert nc.excluded_reason(name) is None


def test_parse_ip_addr_reads_state_mtu_kind_and_addresses():
    ls = links()
    assert ls["eth1"]["mtu"] == 9000 and ls["eth1"]["up"] and ls["eth1"]["kind"] == "veth"
    assert ls["eth1"]["ipv4"] == ["172.29.1.12"]
    assert not ls["docker0"]["up"]  # NO-CARRIER
    down = nc.parse_ip_addr([link("eth2", flags=["BROADCAST", "MULTICAST"], operstate="DOWN")])
    assert not down["eth2"]["up"] and not down["eth2"]["admin_up"]


# --------------------------------------------------------------------------- route get

def test_route_get_ok_and_failures():
    r = nc.parse_route_get([{"dst": "172.29.1.11", "dev": "eth1", "prefsrc": "172.29.1.12"}])
    assert r["ok"] and r["dev"] == "eth1" and r["type"] == "unicast"
    assert nc.parse_route_get([], 2, "RTNETLINK answers: Invalid argument\n")["type"] == "blackhole"
    assert nc.parse_route_get([], 2, "RTNETLINK answers: Permission denied")["type"] == "prohibit"
    assert nc.parse_route_get([], 2, "RTNETLINK answers: No route to host")["type"] == "unreachable"
    r = nc.parse_route_get([{"type": "blackhole", "dst": "10.0.0.1"}])
    assert not r["ok"] and r["type"] == "blackhole"


# --------------------------------------------------------------------------- selection

def test_worker_selects_the_interface_of_the_route_to_the_head():
    route = nc.parse_route_get([{"dst": "172.29.1.11", "dev": "eth1"}])
    sel = nc.select_iface(links(), "", route, "172.29.1.11", "172.29.1.12")
    assert (sel["iface"], sel["address"], sel["mtu"], sel["errors"]) == ("eth1", "172.29.1.12", 9000, [])


def test_head_uses_the_interface_holding_its_address_not_lo():
    ls = nc.parse_ip_addr([link("lo", 65536, ["127.0.0.1"]), link("eth1", 9000, ["172.29.1.11"])])
    route = nc.parse_route_get([{"type": "local", "dst": "172.29.1.11", "dev": "lo"}])
    sel = nc.select_iface(ls, "", route, "172.29.1.11", "172.29.1.11", is_head=True)
    assert sel["iface"] == "eth1" and not sel["errors"]
    # Even without is_head: a route to a local address says lo, the holder is the answer.
    assert nc.select_iface(ls, "", route, "172.29.1.11", "172.29.1.11")["iface"] == "eth1"


def test_requested_interface_must_exist():
    sel = nc.select_iface(links(), "eth9", {}, "172.29.1.11", "172.29.1.12")
    assert sel["iface"] is None
    assert "eth9 does not exist" in sel["errors"][0] and "eth0, eth1" in sel["errors"][0]
    status, detail, fix = nc.iface_verdict("n2", sel, "eth9")
    assert status == "fail" and "eth9" in detail and fix.startswith("on n2:")


def test_requested_interface_must_be_up_and_not_virtual():
    ls = nc.parse_ip_addr(NODE + [link("eth2", ipv4=["172.29.1.12"], flags=["BROADCAST"], operstate="DOWN")])
    sel = nc.select_iface(ls, "eth2", {}, "172.29.1.11", "")
    assert any("down" in e for e in sel["errors"])
    sel = nc.select_iface(links(), "docker0", {}, "172.29.1.11", "")
    assert any("virtual" in e for e in sel["errors"])


def test_route_through_a_bridge_is_refused():
    route = nc.parse_route_get([{"dst": "172.17.0.5", "dev": "docker0"}])
    sel = nc.select_iface(links(), "", route, "172.17.0.5", "")
    assert sel["iface"] == "docker0" and any("docker0 is a virtual interface" in e for e in sel["errors"])


def test_data_address_must_be_on_the_selected_interface():
    route = nc.parse_route_get([{"dst": "172.29.1.11", "dev": "eth1"}])
    sel = nc.select_iface(links(), "", route, "172.29.1.11", "172.28.1.12")
    assert any("172.28.1.12 is not on eth1" in e and "is on eth0" in e for e in sel["errors"])
    status, _, fix = nc.iface_verdict("n2", sel)
    assert status == "fail" and "data_address" in fix


def test_blackhole_route_to_the_head_is_an_error():
    route = nc.parse_route_get([], 2, "RTNETLINK answers: Invalid argument")
    sel = nc.select_iface(links(), "", route, "172.29.1.11", "172.29.1.12")
    assert sel["iface"] is None and "no route" in sel["errors"][0]


def test_uniformity():
    assert nc.iface_uniformity({"a": "eth1", "b": "eth1"})["uniform"]
    u = nc.iface_uniformity({"a": "eth1", "b": "ens5", "c": "eth1", "d": ""})
    assert not u["uniform"] and u["names"] == {"eth1": ["a", "c"], "ens5": ["b"]}
    sel = {"iface": "ens5", "address": "10.0.0.2", "mtu": 9000, "reason": "r", "errors": []}
    status, detail, _ = nc.iface_verdict("b", sel, "", u["uniform"], u["detail"])
    assert status == "warn" and "per node" in detail and "ens5 on b" in detail


# --------------------------------------------------------------------------- persistence helpers

def test_networkd_match():
    text = "[Match]\nName=eth1 en*\n\n[Network]\nDHCP=yes\n"
    assert nc.networkd_matches(text, "eth1") and nc.networkd_matches(text, "ens5")
    assert not nc.networkd_matches(text, "ib0")
    assert not nc.networkd_matches("[Network]\nName=eth1\n", "eth1")


def test_netplan_section():
    doc = {"network": {"version": 2, "ethernets": {"eth0": {"dhcp4": True}, "nic1": {"set-name": "data0"}},
                       "bonds": {"bond0": {"interfaces": ["eth2", "eth3"]}}}}
    assert nc.netplan_section(doc, "eth0") == "ethernets"
    assert nc.netplan_section(doc, "data0") == "ethernets"
    assert nc.netplan_section(doc, "bond0") == "bonds"
    assert nc.netplan_section(doc, "eth9") is None
    assert nc.netplan_section(None, "eth0") is None


IFUPDOWN = """auto lo
iface lo inet loopback

auto eth0
iface eth0 inet dhcp

auto eth1
iface eth1 inet static
    address 10.0.0.12/24
    mtu 1500

iface eth2 inet static
\taddress 10.1.0.2/24
"""


def test_ifupdown_replaces_the_mtu_in_the_right_stanza_only():
    new, found = nc.ifupdown_set_mtu(IFUPDOWN, "eth1", 9000)
    assert found
    assert "    mtu 9000\n" in new and "mtu 1500" not in new
    assert new.count("mtu") == 1
    assert nc.ifupdown_set_mtu(new, "eth1", 9000)[0] == new  # idempotent


def test_ifupdown_adds_the_mtu_with_the_stanza_indent():
    new, found = nc.ifupdown_set_mtu(IFUPDOWN, "eth2", 9000)
    assert found and new.endswith("\taddress 10.1.0.2/24\n\tmtu 9000\n")
    new, found = nc.ifupdown_set_mtu(IFUPDOWN, "eth0", 9000)
    lines = new.splitlines()
    assert lines[lines.index("iface eth0 inet dhcp") + 1] == "    mtu 9000"
    assert "auto eth1" in new and new.count("mtu") == 2


def test_ifupdown_without_the_stanza_changes_nothing():
    assert nc.ifupdown_set_mtu(IFUPDOWN, "eth7", 9000) == (IFUPDOWN, False)


# --------------------------------------------------------------------------- MTU verdict

def test_mtu_verdict():
    assert nc.mtu_verdict("n1", "eth1", 9000, 9000, True)[0]
    ok, detail, fix = nc.mtu_verdict("n3", "eth1", 1500, 9000, False)
    assert not ok and "1500" in detail and "9000" in detail and "n3" in detail
    assert "ip link set dev eth1 mtu 9000" in fix and "network_manage_mtu" in fix
    ok, _, fix = nc.mtu_verdict("n3", "eth1", 1500, 9000, True)
    assert not ok and "max_mtu" in fix


# --------------------------------------------------------------------------- ping

def test_ping_argv_is_a_list_with_dont_fragment():
    assert nc.ping_argv("10.0.0.2", 8972) == ["ping", "-n", "-M", "do", "-c", "1", "-W", "1", "-s", "8972",
                                              "10.0.0.2"]


OK_OUT = ("PING 10.0.0.2 (10.0.0.2) 8972(9000) bytes of data.\n8980 bytes from 10.0.0.2: icmp_seq=1 ttl=64 "
          "time=0.1 ms\n\n--- 10.0.0.2 ping statistics ---\n1 packets transmitted, 1 received, 0% packet loss\n")
LOST_OUT = ("PING 10.0.0.3 (10.0.0.3) 8972(9000) bytes of data.\n\n--- 10.0.0.3 ping statistics ---\n"
            "1 packets transmitted, 0 received, 100% packet loss, time 0ms\n")


@pytest.mark.parametrize("rc,out,err,outcome,hint", [
    (0, OK_OUT, "", "ok", None),
    (1, LOST_OUT, "", "lost", None),
    (1, "PING x\n", "ping: local error: message too long, mtu=1500\n", "too_big", 1500),
    (1, "From 10.0.0.1 icmp_seq=1 Frag needed and DF set (mtu = 1500)\n", "", "too_big", 1500),
    (2, "", "ping: connect: Invalid argument\n", "blocked", None),
    (2, "", "ping: connect: Network is unreachable\n", "unreachable", None),
    (1, "From 10.0.0.9 icmp_seq=1 Destination Host Unreachable\n", "", "unreachable", None),
    (2, "", "ping: sendmsg: Operation not permitted\n", "blocked", None),
])
def test_parse_ping(rc, out, err, outcome, hint):
    r = nc.parse_ping(rc, out, err)
    assert r["outcome"] == outcome and r["ok"] == (outcome == "ok") and r["mtu_hint"] == hint


def probe(full_ok, base_ok, full_outcome="lost", message=""):
    return {"address": "x", "full": {"ok": full_ok, "outcome": "ok" if full_ok else full_outcome, "message": message},
            "base": {"ok": base_ok, "outcome": "ok" if base_ok else "lost"}}


def test_diagnosis_names_the_pair_both_mtus_and_the_node_to_fix():
    mtus = {"n1": 9000, "n2": 9000, "n3": 1500}
    probes = {"n1": {"n2": probe(True, True), "n3": probe(False, True)},
              "n3": {"n1": probe(False, True, "too_big", "local error: message too long, mtu=1500")}}
    fails = nc.diagnose(probes, mtus, 9000, {"n1": "eth1", "n3": "eth1"})
    assert [(f["src"], f["dst"]) for f in fails] == [("n1", "n3"), ("n3", "n1")]
    first = fails[0]
    assert "n1 -> n3" in first["detail"] and "MTU n1 eth1 9000" in first["detail"] and "n3 eth1 1500" in first["detail"]
    assert first["fix"].startswith("on n3: ip link set dev eth1 mtu 9000") and "n1:" not in first["fix"]
    assert "message too long" in fails[1]["detail"]


def test_diagnosis_blames_the_path_when_both_ends_are_right():
    f = nc.diagnose_pair("a", "b", probe(False, True), {"a": 9000, "b": 9000}, 9000)
    assert "switch, router or bridge" in f["fix"]


def test_diagnosis_of_a_dead_path():
    f = nc.diagnose_pair("a", "b", probe(False, False), {"a": 9000, "b": 9000}, 9000)
    assert f["payload"] == 1472 and "even a 1472-byte ping fails" in f["detail"]


def test_path_matrix():
    m = nc.path_matrix({"n1": {"n2": probe(True, True), "n3": probe(False, True)}})
    assert m["path_mtu"] == {"n1": {"n2": True, "n3": False}}
    assert m["path_base"] == {"n1": {"n2": True, "n3": True}}


# --------------------------------------------------------------------------- ownership

def test_port_verdicts():
    assert nc.port_verdict(39500, [], set())["state"] == "free"
    ours = nc.port_verdict(39500, [{"pid": 102, "command": "torchrun", "local": "0.0.0.0:39500"}], {102})
    assert ours["state"] == "ours" and not ours["ok"] and "reset.yml" in ours["fix"]
    other = nc.port_verdict(39500, [{"pid": 200, "command": "nc -l 39500", "local": "0.0.0.0:39500"}], {102})
    assert other["state"] == "other" and "PID 200" in other["detail"] and "nc -l 39500" in other["detail"]
    unknown = nc.port_verdict(39500, [{"pid": None, "command": "", "local": "0.0.0.0:39500"}], set())
    assert unknown["state"] == "other"


# --------------------------------------------------------------------------- connect errors

@pytest.mark.parametrize("err,kind", [
    (None, "ok"), ("timeout", "timeout"), (socket.timeout("timed out"), "timeout"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "refused"),
    (OSError(errno.EHOSTUNREACH, "no route"), "unreachable"),
    (OSError(errno.ENETUNREACH, "net unreachable"), "unreachable"),
    (OSError(errno.EINVAL, "Invalid argument"), "blocked"),
    (OSError(errno.EACCES, "Permission denied"), "blocked"),
    (OSError(errno.ETIMEDOUT, "timed out"), "timeout"),
    (OSError(errno.EIO, "io"), "error"),
])
def test_classify_connect_error(err, kind):
    assert nc.classify_connect_error(err) == kind


def test_reach_verdict_names_a_firewall_drop():
    ok, detail, fix = nc.reach_verdict("n2", "n1", "10.0.0.1", 39500, "timeout", "", 3.0)
    assert not ok and "firewall DROP" in detail and "n2 -> n1" in detail and "3.0 s" in detail
    assert "--dport 39500" in fix
    assert nc.reach_verdict("n2", "n1", "10.0.0.1", 39500, "ok")[0]


# --------------------------------------------------------------------------- properties

@given(st.lists(st.sampled_from(["eth1", "ens5", "ib0", ""]), min_size=1, max_size=12))
def test_uniformity_property(names):
    hosts = {"h%d" % i: n for i, n in enumerate(names)}
    u = nc.iface_uniformity(hosts)
    assert u["uniform"] == (len({n for n in names if n}) <= 1)
    assert sorted(h for hs in u["names"].values() for h in hs) == sorted(h for h, n in hosts.items() if n)


@given(st.integers(min_value=1280, max_value=9216), st.text(alphabet=" \tabcdefmtu0123456789\n", max_size=200))
def test_ifupdown_edit_property(mtu, junk):
    text = "auto eth1\niface eth1 inet static\n    address 10.0.0.2/24\n" + junk.replace("iface", "x")
    new, found = nc.ifupdown_set_mtu(text, "eth1", mtu)
    assert found and ("mtu %d" % mtu) in new
    assert nc.ifupdown_set_mtu(new, "eth1", mtu)[0] == new


def test_port_held_by_the_live_job_passes_and_by_its_leftovers_asks_for_reset():
    holder = [{"pid": 102, "command": "torchrun --nnodes=3", "local": "0.0.0.0:39500"}]
    running = nc.port_verdict(39500, holder, {102}, live=True)
    assert running["state"] == "running" and running["ok"] and running["fix"] == ""
    assert "the job runs: PID 102 (torchrun --nnodes=3)" in running["detail"]
    stale = nc.port_verdict(39500, holder, {102}, live=False)
    assert stale["state"] == "ours" and not stale["ok"] and "reset.yml" in stale["fix"]
    # a live job does not excuse a foreign holder
    mixed = holder + [{"pid": 300, "command": "nc -l", "local": "0.0.0.0:39500"}]
    assert nc.port_verdict(39500, mixed, {102}, live=True)["state"] == "other"


# A rented container (vast.ai's layout): eth0 the overlay (10.0.0.x/24, MTU 1450), eth1 the internet bridge
# (172.17.0.2/16, the default route). A route over the bridge to the overlay's subnet (policy routing, a
# provider's wider route) must not take the job off the overlay.
RENTED = [link("lo", 65536, ["127.0.0.1"], ["LOOPBACK", "UP", "LOWER_UP"], "UNKNOWN"),
          link("eth0", 1450, ["10.0.0.2"], kind="veth"),
          link("eth1", 1500, ["172.17.0.2"], kind="veth")]


def test_overlay_address_wins_over_the_route_by_the_internet_bridge():
    route = nc.parse_route_get([{"dst": "10.0.0.1", "gateway": "172.17.0.1", "dev": "eth1"}])
    sel = nc.select_iface(links(RENTED), "", route, "10.0.0.1", "10.0.0.2")
    assert (sel["iface"], sel["address"], sel["mtu"], sel["errors"]) == ("eth0", "10.0.0.2", 1450, [])
    assert "holds this node's data address 10.0.0.2" in sel["reason"]
    assert "leaves by eth1" in sel["warnings"][0]
    # Without a data address there is nothing to prefer: the route decides (and the check names it).
    assert nc.select_iface(links(RENTED), "", route, "10.0.0.1", "")["iface"] == "eth1"


def test_on_link_reads_the_prefix():
    ls = links(RENTED)
    assert nc.on_link(ls["eth0"], "10.0.0.200") and not nc.on_link(ls["eth0"], "10.0.1.1")
    assert nc.on_link(ls["eth1"], "172.17.0.200") and not nc.on_link(ls["eth1"], "fd00::1")


def test_an_overlay_below_1500_is_probed_within_its_mtu():
    assert nc.base_size(9000) == 1472 and nc.base_size(1500) == 1472 and nc.base_size(1450) == 1422
    lost = {"full": {"ok": True}, "base": {"ok": False, "outcome": "lost"}}
    d = nc.diagnose_pair("a", "b", lost, {"a": 1450, "b": 1450}, 1450)
    assert "even a 1422-byte ping fails" in d["detail"] and d["payload"] == 1422


def test_cluster_mtu_measures_when_zero():
    assert nc.cluster_mtu(9000, [1450, 1500]) == 9000
    assert nc.cluster_mtu(0, [1450, 1500, None]) == 1450
    assert nc.cluster_mtu(0, [None, ""]) is None
