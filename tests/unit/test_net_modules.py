"""The network role's module internals on this machine, for real: the probe listener (detached, ends itself,
stopped by PID + start time), the port holder lookup through /proc, connect outcomes (ok, refused, timeout),
and the role's filters."""

from __future__ import annotations

import json
import os
import subprocess
import socket
import sys
import time

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import procgroup
from conftest import load

port_check = load("library/port_check.py", "port_check_mod")
filters = load("roles/network/filter_plugins/network_filters.py", "network_filters")


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
    from conftest import adhoc

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


# --------------------------------------------------------------------------- filters

HV = {"n1": {"network_iface": "eth1", "network_address": "10.0.0.1", "_network_mtu": 9000},
      "n2": {"network_iface": "eth1", "network_address": "10.0.0.2", "_network_mtu": 9000},
      "n3": {"network_iface": "ens5", "network_address": "", "_network_mtu": 1500}}


def test_path_plan_full_mesh_leaves_out_self_and_names_nodes_without_an_address():
    plan = filters.network_path_plan(HV, ["n1", "n2", "n3"], "n1", 16, 2, 0)
    assert plan["peers"] == [{"name": "n2", "address": "10.0.0.2"}]
    cov = plan["coverage"]
    assert cov["scheme"] == "full mesh" and cov["unaddressed"] == ["n3"] and cov["probes"] == 1
    assert cov["text"] == "full mesh: 1 of 1 node pairs, each from both ends; this node probes 1 and is probed by 1"


def _hv_two_subnets(n):
    hv = {}
    for i in range(1, n + 1):
        addr = f"10.{i % 2}.0.{i}"
        hv[f"n{i}"] = {"network_iface": "eth1", "network_address": addr, "_network_mtu": 9000,
                       "__network_facts": {"interfaces": {"eth1": {"nets": [f"{addr}/24"]}}}}
    return hv


def test_path_plan_above_the_limit_probes_few_peers_and_states_the_coverage():
    hv = _hv_two_subnets(40)
    hosts = list(hv)
    plans = {h: filters.network_path_plan(hv, hosts, h, 16, 2, 0) for h in hosts}
    assert all(len(p["peers"]) <= 8 for p in plans.values())
    cov = plans["n1"]["coverage"]
    assert cov["scheme"] == "ring + sample" and cov["full_mesh_pairs"] == 780 and cov["subnet_pairs"] == 3
    assert f"{cov['pairs']} of 780 node pairs" in cov["text"]
    # Every node probes or is probed; the pairs the nodes probe add up to the scheme's count.
    probed = {p["name"] for plan in plans.values() for p in plan["peers"]}
    assert probed | {h for h, plan in plans.items() if plan["peers"]} == set(hosts)
    assert sum(len(p["peers"]) for p in plans.values()) == cov["pairs"]


def test_a_failing_sampled_pair_is_named_by_both_ends():
    hv = _hv_two_subnets(20)
    hv["n7"]["_network_mtu"] = 1500
    plan = filters.network_path_plan(hv, list(hv), "n3", 16, 1, 0)
    probes = {p["name"]: {"address": p["address"], "full": {"ok": p["name"] != "n7", "outcome": "lost"},
                          "base": {"ok": True, "outcome": "ok"}} for p in plan["peers"] + [{"name": "n7", "address": "x"}]}
    v = filters.network_path_diagnosis(probes, "n3", hv, list(hv), 9000)
    assert not v["ok"] and "n3 -> n7" in v["detail"] and "MTU n3 eth1 9000, n7 eth1 1500" in v["detail"]


def test_uniformity_filter():
    u = filters.network_uniformity(HV, ["n1", "n2", "n3"])
    assert not u["uniform"] and "ens5 on n3" in u["detail"]


def test_path_diagnosis_filter_gives_the_row_and_both_mtus():
    probes = {"n2": {"address": "10.0.0.2", "full": {"ok": True, "outcome": "ok"}, "base": {"ok": True, "outcome": "ok"}},
              "n3": {"address": "10.0.0.3", "full": {"ok": False, "outcome": "lost"}, "base": {"ok": True, "outcome": "ok"}}}
    v = filters.network_path_diagnosis(probes, "n1", HV, ["n1", "n2", "n3"], 9000)
    assert not v["ok"] and v["pairwise"]["path_mtu"] == {"n2": True, "n3": False}
    assert "MTU n1 eth1 9000, n3 ens5 1500" in v["detail"] and v["fix"].startswith("on n3: ip link set dev ens5")
    ok = filters.network_path_diagnosis({"n2": probes["n2"]}, "n1", HV, ["n1", "n2"], 9000)
    assert ok["ok"] and ok["fix"] == "" and "1 peer pass 8972" in ok["detail"]


@pytest.mark.parametrize("current,ok", [(9000, True), ("9000", True), (1500, False), (None, False)])
def test_mtu_verdict_filter(current, ok):
    assert filters.network_mtu_verdict(current, "n1", "eth1", 9000, False)["ok"] is ok


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
