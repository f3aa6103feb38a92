"""The network role's single round trips, for real on this machine: net_facts sets the data interface MTU only
where it differs (inside a network namespace of the test's own, on a veth pair) and says so in check mode;
port_check's inspect starts the probe listener in the same call when the port is free; the records the role
builds on the controller from those results (one task per step)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest

from helpers import BIN, REPO, adhoc, load
from ansible_collections.trainyard.core.plugins.module_utils import netcheck
from ansible_collections.trainyard.core.plugins.module_utils import proc_sockets
from ansible_collections.trainyard.core.plugins.plugin_utils import netrecords

filters = load("filter_plugins/network_filters.py", "network_filters_rt")


def in_netns(ns, module, args, *flags):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    p = subprocess.run(["ip", "netns", "exec", ns, str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
                        "-e", f"ansible_python_interpreter={sys.executable}", "-m", module, "-a", json.dumps(args),
                        *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    out, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index("{"):])
    return out["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.fixture
def netns():
    ns = "ty-net-" + uuid.uuid4().hex[:6]
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode != 0:
        pytest.skip("no network namespaces here (needs root and ip netns)")
    try:
        for cmd in (["ip", "link", "add", "tya", "type", "veth", "peer", "name", "tyb"],
                    ["ip", "addr", "add", "198.51.100.1/24", "dev", "tya"],
                    ["ip", "link", "set", "tya", "up"], ["ip", "link", "set", "tyb", "up"]):
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_net_facts_sets_the_mtu_only_where_it_differs_and_not_in_check_mode(netns):
    args = {"target": "198.51.100.2", "address": "198.51.100.1", "mtu": 1400}
    mtu_now = ["ip", "netns", "exec", netns, "cat", "/sys/class/net/tya/mtu"]
    checked = in_netns(netns, "net_facts", args, "--check")
    assert checked["changed"] and checked["mtu_set"] == {"changed": True, "error": ""}, checked
    assert subprocess.run(mtu_now, capture_output=True, text=True).stdout.strip() == "1500"
    first = in_netns(netns, "net_facts", args)
    assert first["changed"] and first["selected"]["iface"] == "tya" and first["selected"]["mtu"] == 1400, first
    # Published as host variables (the action net_facts, for the callback preflight_records), not facts.
    assert first["trainyard_vars"]["vars"] == {"network_iface": "tya", "network_address": "198.51.100.1",
                                               "_network_mtu": 1400} and "ansible_facts" not in first, first
    assert subprocess.run(mtu_now, capture_output=True, text=True).stdout.strip() == "1400"
    again = in_netns(netns, "net_facts", args)
    assert not again["changed"] and again["mtu_set"]["changed"] is False
    # The interface Ansible talks over is never changed.
    mgmt = in_netns(netns, "net_facts", dict(args, mtu=1300, mgmt_address="198.51.100.1"))
    assert mgmt["mgmt"] and not mgmt["changed"] and mgmt["selected"]["mtu"] == 1400


def test_net_facts_refuses_with_the_controllers_reason_before_probing():
    r = adhoc("net_facts", {"target": "127.0.0.1", "refuse": "n1: no cluster_model fact: run it through site.yml"})
    assert r["failed"] and r["msg"] == "n1: no cluster_model fact: run it through site.yml"


def test_persist_text_of_each_configuration_system():
    text, mode, cmd = netcheck.persist_text("netplan", "eth1", 9000, section="ethernets")
    assert "network:\n  ethernets:\n    eth1:\n      mtu: 9000\n  version: 2\n" in text and mode == 0o600
    assert cmd == ["netplan", "generate"]
    text, mode, cmd = netcheck.persist_text("networkd", "eth1", 9000)
    assert text.endswith("[Link]\nMTUBytes=9000\n") and cmd == ["networkctl", "reload"]
    text, _, cmd = netcheck.persist_text("ifupdown", "eth1", 9000, text="auto eth1\niface eth1 inet dhcp\n")
    assert text == "auto eth1\niface eth1 inet dhcp\n    mtu 9000\n" and cmd is None


def _port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_inspect_starts_the_probe_listener_in_the_same_call_and_it_ends_after_the_expected_connect():
    port = _port()
    args = {"mode": "inspect", "port": port, "listen": True, "address": "127.0.0.1", "listen_seconds": 30,
            "expect": 1}
    checked = adhoc("port_check", args, "--check")
    assert checked["verdict"]["state"] == "free" and checked["listener"]["listening"] is False
    assert checked["listener"]["reason"] == "check mode"
    r = adhoc("port_check", args)
    assert r["verdict"]["state"] == "free" and r["listener"]["listening"] is True, r
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    for _ in range(100):  # the listener closes after its one expected connection
        if not proc_sockets.parse_proc_net_tcp(open("/proc/net/tcp").read(), port):
            break
        subprocess.run(["sleep", "0.1"])
    holder = adhoc("port_check", {"mode": "inspect", "port": port})
    assert holder["verdict"]["state"] == "free" and "listener" not in holder


def test_inspect_starts_no_listener_on_a_held_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        r = adhoc("port_check", {"mode": "inspect", "port": s.getsockname()[1], "listen": True,
                                 "address": "127.0.0.1"})
        assert r["verdict"]["state"] == "other" and "listener" not in r
    finally:
        s.close()


FACTS = {"selected": {"iface": "eth1", "address": "10.0.0.2", "mtu": 1500, "reason": "route", "errors": []},
         "route": {"ok": True, "dev": "eth0", "gateway": "", "type": "unicast"}, "config": {"method": "none"},
         "in_container": False, "mgmt": False, "bridges": [{"name": "docker0", "mtu": 1500, "up": True}],
         "mtu_set": {"changed": False, "error": "Error: mtu greater than device maximum."}, "changed": False}
OPTS = {"host": "n2", "requested": "", "head_address": "10.0.0.1", "is_head": False, "measure": False,
        "manage": True, "persist": True, "mgmt": "192.168.0.2"}


def probe(facts=FACTS, uniform=True, uniformity="every node uses eth1", **o):
    return netrecords.probe_records(facts, dict(OPTS, **o), uniform, uniformity, 9000)


def test_probe_records_name_the_node_the_values_and_the_fix():
    recs = {r["check"]: r for r in probe()}
    assert list(recs) == ["network.iface", "network.head_route", "network.mtu", "network.mtu_persist",
                          "network.bridge_mtu"]
    assert recs["network.iface"] == {"check": "network.iface", "status": "pass", "fix": "",
                                     "detail": "eth1 (route), address 10.0.0.2, MTU 1500",
                                     "data": {"drift": {"data_iface": "eth1"}}}
    route = recs["network.head_route"]
    assert route["status"] == "warn" and "leaves by another NIC" in route["detail"]
    assert route["fix"] == ("on n2: route 10.0.0.1 over eth1 (ip route add 10.0.0.1 dev eth1), or set "
                            "cluster_data_iface to eth0")
    mtu = recs["network.mtu"]
    assert mtu["status"] == "fail" and "eth1 MTU 1500 on n2" in mtu["detail"]
    assert "; ip link: Error: mtu greater than device maximum." in mtu["detail"]
    assert mtu["fix"].startswith("the role could not set it: check that eth1 on n2 accepts MTU 9000")
    assert mtu["pending_on"] == {netrecords.PROBE_TASK: {"changed": False}}
    persist = recs["network.mtu_persist"]
    assert persist["status"] == "warn" and "with MTU 9000, so it survives a reboot" in persist["fix"]
    assert persist["pending_on"] == {netrecords.PROBE_TASK: {"changed": False}}
    assert recs["network.bridge_mtu"]["status"] == "warn" and "docker0 MTU 1500" in recs["network.bridge_mtu"]["detail"]
    container = probe(dict(FACTS, in_container=True))
    assert container[3]["status"] == "skip" and "the node is a container" in container[3]["detail"]
    failed = probe(dict(FACTS, config={"method": "networkd", "path": "/etc/x.conf"},
                        persisted={"changed": False, "error": "cannot write /etc/x.conf: read-only"}))
    assert failed[3]["status"] == "fail" and "read-only" in failed[3]["detail"]


def test_probe_records_warn_on_names_that_differ_and_say_when_the_mtu_was_measured():
    recs = {r["check"]: r for r in probe(uniform=False, uniformity="interface names differ: eth1 on n2; ens5 on n1",
                                         measure=True)}
    assert recs["network.iface"]["status"] == "warn"
    assert "interface names differ: eth1 on n2; ens5 on n1: NCCL_SOCKET_IFNAME" in recs["network.iface"]["detail"]
    assert recs["network.mtu"]["detail"].startswith("eth1 MTU 1500 on n2, expected cluster_data_mtu 9000 (measured:")
    assert recs["network.mtu_persist"]["status"] == "skip" and "cluster_data_mtu 0" in recs["network.mtu_persist"]["detail"]


def test_probe_records_without_a_data_interface_skip_and_never_blame_a_missing_one():
    facts = dict(FACTS, selected={"iface": "", "address": "", "mtu": None, "reason": "", "errors": ["no route"]})
    recs = {r["check"]: r for r in probe(facts)}
    assert recs["network.head_route"] == {"check": "network.head_route", "status": "skip",
                                          "detail": "no data interface (see network.iface)"}
    assert recs["network.mtu"]["status"] == "skip" and recs["network.iface"]["status"] == "fail"


PLAN = dict(netrecords.split_plan(dict(netrecords.cluster_plan(["n1", "n2"], {}, 9000), head="n1"))[0],
            master_addr="10.0.0.1", master_port=39500, check_mode=False)


def test_disabled_role_records_one_skip():
    assert netrecords.disabled_record() == {
        "check": "network.enabled", "status": "skip",
        "detail": "network role off (network_enabled: false): no data interface, MTU, path or port checks on this "
                  "node; NCCL_SOCKET_IFNAME comes from nccl_env_socket_ifname or cluster_data_iface"}


def test_port_records_silent_head_and_a_listener_that_could_not_start():
    refused = {"verdict": {"state": "free", "ok": True, "detail": "port 39500 is free", "fix": ""},
               "listener": {"listening": False, "reason": "cannot listen on 10.0.0.9:39500: Cannot assign"}}
    head = {r["check"]: r for r in netrecords.port_records("n1", PLAN, refused, None)}
    assert head["network.rendezvous_port"]["status"] == "pass"
    assert head["network.rendezvous_port"]["detail"] == "port 39500 is free (head n1, master_addr 10.0.0.1)"
    assert head["network.rendezvous_listen"]["status"] == "fail"
    assert "must be an address of the head n1" in head["network.rendezvous_listen"]["fix"]
    reach = netrecords.port_records("n2", PLAN, refused, None)
    assert [r["check"] for r in reach] == ["network.rendezvous_reach"]
    assert reach[0]["status"] == "skip" and "Cannot assign" in reach[0]["detail"]
    assert reach[0]["data"]["pairwise"]["rendezvous"] == {"n1": False}
    checked = netrecords.port_records("n1", dict(PLAN, check_mode=True), refused, None)
    assert [r["check"] for r in checked] == ["network.rendezvous_port"]


def test_port_records_of_a_worker_that_connected_or_timed_out():
    held = {"verdict": {"state": "free", "ok": True, "detail": "port 39500 is free", "fix": ""},
            "listener": {"listening": True, "pid": 7, "start_ticks": 1, "reason": "probe listener for 600 s"}}
    ok = netrecords.port_records("n2", PLAN, held, {"outcome": "ok", "seconds": 0.01, "message": ""})[0]
    assert ok["status"] == "pass" and ok["detail"] == "n2 -> 10.0.0.1:39500 connected after 0.0 s"
    assert ok["data"]["pairwise"]["rendezvous"] == {"n1": True}
    dropped = netrecords.port_records("n2", PLAN, held, {"outcome": "timeout", "seconds": 3.0,
                                                         "message": "no answer within 3.0 s"})[0]
    assert dropped["status"] == "fail" and dropped["detail"].startswith("n2 -> n1 (10.0.0.1):39500 timed out")
    assert dropped["fix"].startswith("allow TCP 39500 from the workers' data network on n1")
    held_by_other = {"verdict": {"state": "other", "ok": False, "detail": "port 39500 is held", "fix": "stop it"}}
    assert netrecords.port_records("n1", PLAN, held_by_other, None)[0]["status"] == "fail"
    assert netrecords.port_records("n2", dict(PLAN, nodes=1, head_in_play=False), held, None) == []


def test_the_listener_is_stopped_only_when_a_worker_did_not_reach_it():
    ok = {"reach": {"outcome": "ok"}}
    assert netrecords.workers_reached("n1", {"n1": {}, "n2": ok, "n3": ok})
    assert not netrecords.workers_reached("n1", {"n1": {}, "n2": ok, "n3": {"reach": {"outcome": "timeout"}}})
    assert not netrecords.workers_reached("n1", {"n1": {}, "n2": ok, "n3": None})
    assert filters.network_workers_reached({"n1": {}, "n2": {"__network_checks": ok}}, ["n1", "n2"], "n1")


def _checks(port, *flags, **args):
    """network_checks on this machine (host localhost, a worker of head n1 whose master address is 127.0.0.1)."""
    shared, nodes = netrecords.split_plan(dict(netrecords.cluster_plan(["n1", "localhost"], {}, 9000), head="n1"))
    plan = dict(shared, head_address="127.0.0.1", master_addr="127.0.0.1", master_port=port,
                ping={"connect_timeout": 2})
    return adhoc("network_checks", dict({"facts": dict(FACTS, changed=True), "plan": plan,
                                         "node_plan": nodes["localhost"], "path_check": False,
                                         "port": {"verdict": {"state": "free"}, "listener": {"listening": True}},
                                         "mgmt": "192.168.0.2"}, **args), *flags)


def test_checks_connect_to_the_rendezvous_port_in_one_call_and_record_every_check():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        r = _checks(port)
    finally:
        s.close()
    recs = {x["check"]: x for x in r["preflight_records"]}
    assert list(recs) == ["network.iface", "network.head_route", "network.mtu", "network.mtu_persist",
                          "network.bridge_mtu", "network.rendezvous_reach"]
    assert r["reach"]["outcome"] == "ok" and recs["network.rendezvous_reach"]["status"] == "pass"
    assert recs["network.rendezvous_reach"]["detail"].startswith(f"localhost -> 127.0.0.1:{port} connected")
    assert recs["network.mtu"]["status"] == "fail" and r["probes"] == {}
    # The records go to the callback preflight_records (the run's ansible.cfg loads it), not in a fact.
    assert "ansible_facts" not in r, r


def test_checks_in_check_mode_leave_the_mtu_pending_on_the_probe_and_a_refused_connect_fails():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: the connect is refused
    r = _checks(port, "--check")
    recs = {x["check"]: x for x in r["preflight_records"]}
    assert recs["network.mtu"]["status"] == "pending" and recs["network.mtu_persist"]["status"] == "pending"
    assert recs["network.mtu"]["fix"] == "the run does it: " + netrecords.PROBE_TASK
    assert recs["network.iface"]["status"] == "pass"
    assert r["reach"]["outcome"] == "refused" and recs["network.rendezvous_reach"]["status"] == "fail"


def test_checks_of_a_node_with_the_role_off_contact_nothing():
    r = adhoc("network_checks", {"enabled": False})
    assert [x["check"] for x in r["preflight_records"]] == ["network.enabled"] and "reach" not in r



def test_checks_take_values_and_name_the_argument_given_as_a_variable_name():
    r = _checks(1, facts="__network_facts")
    assert r["failed"] and r["msg"].startswith("network_checks: 'facts' must be a dict, not str: give the registered "
                                               "result as a value")
    r = _checks(1, node_plan="__network_plan")
    assert r["failed"] and "'node_plan' must be a dict, not str" in r["msg"]
    # The role's task before the plan ran (or a plan of another shape): the one-line "no network plan".
    r = _checks(1, plan={})
    assert r["failed"] and r["msg"].startswith("network_checks on localhost: no network plan")


def test_plan_action_reads_the_nodes_once_and_sets_whether_their_names_agree():
    r = adhoc("network_plan", {"hosts": ["localhost"], "facts": [{}], "head": "localhost", "head_address": "127.0.0.1",
                               "master_addr": "127.0.0.1", "master_port": 39500, "mtu": 0,
                               "ping": {"wait": 1, "connect_timeout": 2}})
    plan, mine = r["plan"], r["nodes"]["localhost"]
    # localhost has no net_facts result: no interface, no address, no MTU to measure.
    assert mine == {"peers": {}, "probed_by": {}, "unaddressed": [], "mtus": {"localhost": None},
                    "ifaces": {"localhost": ""}}
    assert plan["nodes"] == 1 and plan["head_in_play"] and plan["expected"] is None and "peers" not in plan
    assert plan["measure"] and plan["uniformity"] == "every node uses no interface"
    assert plan["head_address"] == "127.0.0.1" and plan["ping"] == {"wait": 1, "connect_timeout": 2}
    assert r["trainyard_vars"] == {"hosts": ["localhost"], "vars": {"network_iface_uniform": True}}, r
    missing = adhoc("network_plan", {"hosts": ["localhost"], "facts": [{}], "head": "localhost"})
    assert missing["failed"] and missing["msg"] == "network_plan: 'head_address' is required"
    # A registered result's name where the values go is refused with what to pass.
    named = adhoc("network_plan", {"hosts": ["localhost"], "facts": "__network_facts", "head": "localhost",
                                   "head_address": "127.0.0.1", "master_addr": "127.0.0.1", "master_port": 1, "mtu": 0})
    assert named["failed"] and "'facts' must list each host's registered net_facts result" in named["msg"]


def test_plan_action_asks_the_head_who_holds_the_port_and_listens_there_in_the_same_task():
    plan = {"hosts": ["localhost"], "facts": [{}], "head": "localhost", "head_address": "127.0.0.1",
            "master_addr": "127.0.0.1", "mtu": 0}
    port = _port()
    spec = {"port": port, "listen": True, "address": "127.0.0.1", "listen_seconds": 30, "expect": 1}
    checked = adhoc("network_plan", dict(plan, master_port=port, port=spec), "--check")
    assert checked["port"]["verdict"]["state"] == "free" and checked["port"]["listener"]["reason"] == "check mode"
    r = adhoc("network_plan", dict(plan, master_port=port, port=spec))
    assert r["plan"]["master_port"] == port and r["port"]["listener"]["listening"] is True, r
    assert "invocation" not in r["port"]
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # the one expected connect ends it
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        held = adhoc("network_plan", dict(plan, master_port=s.getsockname()[1],
                                          port=dict(spec, port=s.getsockname()[1])))
        assert held["port"]["verdict"]["state"] == "other" and "listener" not in held["port"]
    finally:
        s.close()
    # port_check's failure is the task's, naming where it ran
    bad = adhoc("network_plan", dict(plan, master_port=port, port=dict(spec, port=70000)))
    assert bad["failed"] and bad["msg"] == "port_check on the head: port 70000 is not a TCP port (1-65535)"
    assert "port" not in adhoc("network_plan", dict(plan, master_port=port)), "no port: no node contacted"
