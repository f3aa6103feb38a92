"""The network role's module internals on this machine, for real: the probe listener (detached, ends itself,
stopped by PID + start time), the port holder lookup through /proc, connect outcomes (ok, refused, timeout),
the cross-node plan (interface names, cluster MTU, the pairs the path proof pings) and the path record."""

from __future__ import annotations

import json
import os
import subprocess
import socket
import sys
import time


from ansible_collections.trainyard.core.plugins.module_utils import netcheck, procgroup
from ansible_collections.trainyard.core.plugins.plugin_utils import netrecords
from helpers import load

port_check = load("library/port_check.py", "port_check_mod")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def gone(pid: int, ticks: int) -> bool:
    return not procgroup.running([(pid, ticks)])


def test_listener_accepts_then_is_stopped_and_the_port_is_free_again():
    port = free_port()
    lst = port_check.start_listener("127.0.0.1", port, 30, 0)
    assert lst["listening"], lst
    try:
        assert lst["pid"] != os.getpid() and lst["start_ticks"] > 0
        holders, verdict, _ = port_check.inspect(port, "")
        assert verdict["state"] == "other" and holders[0]["pid"] == lst["pid"]
        assert port_check.connect("127.0.0.1", port, 2.0)[0] == "ok"
    finally:
        assert port_check.stop([(lst["pid"], lst["start_ticks"])], 2.0) == [lst["pid"]]
    deadline = time.time() + 5
    while not gone(lst["pid"], lst["start_ticks"]) and time.time() < deadline:
        time.sleep(0.05)
    assert gone(lst["pid"], lst["start_ticks"])
    assert port_check.inspect(port, "")[1]["state"] == "free"
    assert port_check.connect("127.0.0.1", port, 2.0)[0] == "refused"


def test_listener_ends_itself_after_the_expected_connections():
    port = free_port()
    lst = port_check.start_listener("127.0.0.1", port, 30, 1)
    assert lst["listening"]
    assert port_check.connect("127.0.0.1", port, 2.0)[0] == "ok"
    deadline = time.time() + 5
    while not gone(lst["pid"], lst["start_ticks"]) and time.time() < deadline:
        time.sleep(0.05)
    assert gone(lst["pid"], lst["start_ticks"]), "listener still alive after its one expected connection"


def test_listener_reports_an_address_that_is_not_ours():
    lst = port_check.start_listener("198.51.100.77", free_port(), 5, 0)
    assert not lst["listening"] and "cannot listen" in lst["reason"]


def test_stop_refuses_a_pid_whose_start_time_differs():
    assert port_check.stop([(os.getpid(), procgroup.start_ticks(os.getpid()) + 1)], 0.1) == []


def _holder(port, env):
    """A process that holds port (listening) until it is stopped; started once the port is bound."""
    code = ("import socket,sys,time;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            "s.bind(('127.0.0.1',int(sys.argv[1])));s.listen();print('up',flush=True);time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code, str(port)], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    return p


def test_stop_job_holders_stops_the_crashed_jobs_leftover_and_leaves_a_stranger(tmp_path):
    """reset's mode: a leftover of this job (its launcher gone, the launch token in its environment) holding the
    port is stopped through procgroup; a process outside the job holding it is reported and left running."""
    from helpers import adhoc

    state = tmp_path / "launch.json"
    # The recorded launcher is gone (no such PID); the job started before the leftover did.
    state.write_text(json.dumps({"pid": 4194303, "pgid": 4194303, "start_ticks": procgroup.start_ticks(os.getpid()),
                                 "token": "tok-port"}))
    port = free_port()
    leftover = _holder(port, dict(os.environ, **{procgroup.TOKEN_ENV: "tok-port"}))
    try:
        res = adhoc("port_check", {"mode": "stop_job_holders", "port": port, "state_file": str(state), "grace": 2})
        assert res["changed"] and res["stopped"] == [leftover.pid], res
        assert leftover.wait(timeout=10) != 0 and res["verdict"]["state"] == "free"
    finally:
        leftover.kill()
        leftover.wait()
    port = free_port()
    stranger = _holder(port, {k: v for k, v in os.environ.items() if k != procgroup.TOKEN_ENV})
    try:
        res = adhoc("port_check", {"mode": "stop_job_holders", "port": port, "state_file": str(state), "grace": 2})
        assert not res["changed"] and res["stopped"] == [] and res["verdict"]["state"] == "other", res
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_holder_of_our_own_socket_and_ownership_by_state_file(tmp_path):
    port = free_port()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen()
    try:
        holders, verdict, _ = port_check.inspect(port, "")
        assert holders[0]["pid"] == os.getpid() and verdict["state"] == "other"
        assert "pytest" in holders[0]["command"] or "python" in holders[0]["command"]
        me = procgroup.read_stat(os.getpid())
        state = tmp_path / "launch.json"
        state.write_text('{"pid": %d, "pgid": %d, "start_ticks": %d}' % (os.getpid(), me.pgrp, me.start_ticks))
        assert port_check.inspect(port, str(state))[1]["state"] == "running"  # held by the live job itself
        state.write_text('{"pid": %d, "pgid": %d, "start_ticks": %d}' % (os.getpid(), me.pgrp, me.start_ticks - 1))
        assert port_check.inspect(port, str(state))[1]["state"] == "other"  # PID reuse guard
    finally:
        srv.close()


# --------------------------------------------------------------------------- the cross-node plan and the path record

def facts(iface, address, mtu, prefix=24):
    """A net_facts result with one data interface."""
    return {"selected": {"iface": iface, "address": address, "mtu": mtu},
            "interfaces": {iface: {"nets": [f"{address}/{prefix}"] if address else []}}}


FACTS = {"n1": facts("eth1", "10.0.0.1", 9000), "n2": facts("eth1", "10.0.0.2", 9000), "n3": facts("ens5", "", 1500)}


def test_plan_full_mesh_leaves_out_self_and_names_nodes_without_an_address():
    plan = netrecords.cluster_plan(["n1", "n2", "n3"], FACTS, 9000)
    assert plan["peers"] == {"n1": [{"name": "n2", "address": "10.0.0.2"}], "n2": [{"name": "n1", "address": "10.0.0.1"}]}
    cov = netrecords.node_coverage(plan, "n1")
    assert cov["scheme"] == "full mesh" and cov["unaddressed"] == ["n3"] and cov["probes"] == 1
    assert cov["text"] == "full mesh: 1 of 1 node pairs, each from both ends; this node probes 1 and is probed by 1"
    assert netrecords.node_coverage(plan, "n3")["text"] == "full mesh: 1 of 1 node pairs, each from both ends"


def test_split_plan_gives_each_node_its_own_slice_and_the_same_records_as_the_whole_plan():
    hosts = ["n%02d" % i for i in range(24)]  # above the full mesh: a ring, sampled rings, O(1) peers per node
    by_host = {h: facts("eth1", "10.0.%d.%d" % (i // 4, i + 1), 9000 if i % 5 else 1500, prefix=22)
               for i, h in enumerate(hosts)}
    by_host["n23"] = facts("eth1", "", 9000)  # no data address: in every other node's "not probed"
    plan = dict(netrecords.cluster_plan(hosts, by_host, 9000), head="n00", master_addr="10.0.0.1",
                master_port=39500, check_mode=False)
    shared, nodes = netrecords.split_plan(plan)
    assert shared["nodes"] == 24 and shared["head_in_play"] and set(nodes) == set(hosts)
    assert not set(netrecords.PER_NODE) & set(shared)
    for h in hosts:
        mine = dict(shared, **nodes[h])
        peers = plan["peers"].get(h)
        # its own part only: its peers, itself and them in the MTU and interface maps
        assert len(mine["mtus"]) == 1 + len(peers or []) < 24
        probes = {p["name"]: {"ok": p["name"] != "n01", "base_ok": True} for p in peers or []}
        path = {"probes": probes, "seconds": 0.1}
        assert netrecords.path_record(h, mine, path) == netrecords.path_record(h, plan, path), h
        assert netrecords.node_coverage(mine, h) == netrecords.node_coverage(plan, h), h
        held = {"verdict": {"state": "free", "ok": True, "detail": "free", "fix": ""}, "listener": {"listening": True}}
        reach = {"outcome": "ok", "seconds": 0.01, "message": ""}
        assert netrecords.port_records(h, mine, held, reach) == netrecords.port_records(
            h, dict(plan, nodes=24, head_in_play=True), held, reach), h
    assert nodes["n23"]["peers"] == {} and nodes["n23"]["unaddressed"] == []
    assert nodes["n05"]["unaddressed"] == ["n23"]


def test_plan_compares_the_names_and_measures_the_mtu_once_for_every_node():
    plan = netrecords.cluster_plan(["n1", "n2", "n3"], FACTS, 0)
    assert not plan["uniform"] and plan["uniformity"] == "interface names differ: ens5 on n3; eth1 on n1, n2"
    assert plan["expected"] == 1500 and plan["measure"]
    assert plan["mtus"] == {"n1": 9000, "n2": 9000, "n3": 1500} and plan["ifaces"]["n3"] == "ens5"
    same = netrecords.cluster_plan(["n1", "n2"], FACTS, 9000)
    assert same["uniform"] and same["uniformity"] == "every node uses eth1" and same["expected"] == 9000
    # A node whose probe failed (no result) has no interface, address or MTU.
    assert netrecords.cluster_plan(["n1", "n9"], FACTS, 0)["unaddressed"] == ["n9"]


def _two_subnets(n):
    return {f"n{i}": facts("eth1", f"10.{i % 2}.0.{i}", 9000) for i in range(1, n + 1)}


def test_plan_above_the_limit_probes_few_peers_and_states_the_coverage():
    hosts = list(_two_subnets(40))
    plan = netrecords.cluster_plan(hosts, _two_subnets(40), 9000, 16, 2, 0)
    assert all(len(p) <= 8 for p in plan["peers"].values())
    cov = netrecords.node_coverage(plan, "n1")
    assert cov["scheme"] == "ring + sample" and cov["full_mesh_pairs"] == 780 and cov["subnet_pairs"] == 3
    assert f"{cov['pairs']} of 780 node pairs" in cov["text"]
    # Every node probes or is probed; the pairs the nodes probe add up to the scheme's count; the counts of who
    # probes whom agree with the per-node text netcheck.coverage_text gives.
    probed = {p["name"] for peers in plan["peers"].values() for p in peers}
    assert probed | {h for h, peers in plan["peers"].items() if peers} == set(hosts)
    assert sum(len(p) for p in plan["peers"].values()) == cov["pairs"]
    pairs = netcheck.path_pairs(hosts, {h: netcheck.subnet_of(f["interfaces"]["eth1"], f["selected"]["address"])
                                        for h, f in _two_subnets(40).items()}, 16, 2, 0)
    assert all(netrecords.node_coverage(plan, h)["text"] == netcheck.coverage_text(pairs, h) for h in hosts)


def test_a_failing_sampled_pair_is_named_by_both_ends():
    hv = _two_subnets(20)
    hv["n7"]["selected"]["mtu"] = 1500
    plan = netrecords.cluster_plan(list(hv), hv, 9000, 16, 1, 0)
    probes = {p["name"]: {"address": p["address"], "full": {"ok": p["name"] != "n7", "outcome": "lost"},
                          "base": {"ok": True, "outcome": "ok"}} for p in plan["peers"]["n3"] + [{"name": "n7", "address": "x"}]}
    rec = netrecords.path_record("n3", plan, {"probes": probes, "seconds": 1.2})
    assert rec["status"] == "fail" and "n3 -> n7" in rec["detail"] and "MTU n3 eth1 9000, n7 eth1 1500" in rec["detail"]
    assert rec["fix"].startswith("on n7: ip link set dev eth1 mtu 9000")
    assert "(1.2 s); ring + 1 seeded random ring (seed 0)" in rec["detail"]
    assert rec["data"]["path_coverage"]["scheme"] == "ring + sample"


def test_path_record_gives_the_row_both_mtus_and_a_skip_without_an_interface():
    plan = netrecords.cluster_plan(["n1", "n2", "n3"], dict(FACTS, n3=facts("ens5", "10.0.0.3", 1500)), 9000)
    probes = {"n2": {"address": "10.0.0.2", "full": {"ok": True, "outcome": "ok"}, "base": {"ok": True, "outcome": "ok"}},
              "n3": {"address": "10.0.0.3", "full": {"ok": False, "outcome": "lost"}, "base": {"ok": True, "outcome": "ok"}}}
    rec = netrecords.path_record("n1", plan, {"probes": probes, "seconds": 0.5})
    assert rec["status"] == "fail" and rec["data"]["pairwise"]["path_mtu"] == {"n2": True, "n3": False}
    assert "MTU n1 eth1 9000, n3 ens5 1500" in rec["detail"] and rec["fix"].startswith("on n3: ip link set dev ens5")
    ok = netrecords.path_record("n1", plan, {"probes": {"n2": probes["n2"]}, "seconds": 0.5})
    assert ok["status"] == "pass" and ok["fix"] == ""
    assert ok["detail"].startswith("1 peer pass 8972- and 1472-byte don't-fragment pings (0.5 s); full mesh: 3 of 3")
    assert netrecords.path_record("n1", plan, None) == {
        "check": "network.path_mtu", "status": "skip", "detail": "no data interface on this node (see network.iface)"}


def test_leftover_of_a_crashed_job_is_known_by_its_launch_token(tmp_path):
    """The job's launcher is gone, a process it started still holds the port: that process carries the
    launch token, so the port is this job's leftover (reset.yml frees it), not another process's."""
    port = free_port()
    code = ("import socket,time;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            f"s.bind(('127.0.0.1',{port}));s.listen();print('up',flush=True);time.sleep(60)")
    env = dict(os.environ, TRAINYARD_LAUNCH_ID="tok123")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        state = tmp_path / "launch.json"
        state.write_text(json.dumps({"pid": 999999, "pgid": 999999, "start_ticks": 1, "token": "tok123"}))
        holders, verdict, ours = port_check.inspect(port, str(state))
        assert ours == {proc.pid} and verdict["state"] == "ours" and not verdict["ok"]
        assert "reset.yml" in verdict["fix"]
        state.write_text(json.dumps({"pid": 999999, "pgid": 999999, "start_ticks": 1, "token": "other"}))
        assert port_check.inspect(port, str(state))[1]["state"] == "other"
    finally:
        proc.kill()
        proc.wait()
