"""Network role on the simulated cluster: data NIC selection, MTU set or verified, the path proven between
every pair of nodes, the rendezvous port, and injected faults that must each fail a named check pointing at
the right node or pair.

Runs tests/integration/playbooks/network.yml (the role alone, with the cluster model in the contract's shape)
and reads every node's preflight records and network facts from the JSON it writes. Each test that breaks
something puts it back in `finally`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from helpers import REPO, BIN, ansible_env, parse_recap, run_playbook

PLAYBOOK = "tests/integration/playbooks/network.yml"
PORT = 39500
CHECKS = ("network.iface", "network.head_route", "network.mtu", "network.mtu_persist", "network.bridge_mtu",
          "network.path_mtu")


def converge(cluster, tmp_path: Path, *extra: str, entry: str = "main", inventory: Path | None = None):
    """Run one entry point of the role; returns (process, {host: {check: record}}, facts, recap)."""
    report = tmp_path / f"net-{uuid.uuid4().hex[:6]}.json"
    args = ["-e", f"network_report={report}", "-e", f"network_entry={entry}", *extra]
    r = run_playbook(inventory or cluster.inventory, PLAYBOOK, *args, timeout=600)
    records, facts = {}, {}
    if report.exists():
        data = json.loads(report.read_text())
        records = {h: {x["check"]: x for x in recs} for h, recs in data["records"].items()}
        facts = data["facts"]
    return r, records, facts, parse_recap(r.stdout)


def failing(records) -> set[tuple[str, str]]:
    return {(h, c) for h, recs in records.items() for c, x in recs.items() if x["status"] == "fail"}


def port_sockets(cluster, node) -> list[str]:
    """Sockets on a node that listen on (or are bound to) PORT, from /proc/net/tcp{,6}."""
    out = cluster.exec(node, ["cat", "/proc/net/tcp", "/proc/net/tcp6"]).stdout
    return [line for line in out.splitlines()
            if len(line.split()) > 3 and line.split()[1].upper().endswith(f":{PORT:04X}")
            and line.split()[3] in ("0A", "07")]


def assert_aligned(cluster, records, facts):
    for node in cluster.nodes:
        for check in CHECKS:
            # The sim node is a container without a network configuration system: nothing to persist (skip).
            expected = "skip" if check == "network.mtu_persist" else "pass"
            assert records[node][check]["status"] == expected, (node, records[node][check])
        assert facts[node]["network_iface"] == "eth1", facts[node]
        assert facts[node]["network_address"] == cluster.data[node]
        assert facts[node]["network_iface_uniform"] is True
        row = records[node]["network.path_mtu"]["data"]["pairwise"]["path_mtu"]
        assert row == {peer: True for peer in cluster.nodes if peer != node}, (node, row)
        if node != cluster.head:
            assert records[node]["network.rendezvous_reach"]["status"] == "pass", records[node]
    assert records[cluster.head]["network.rendezvous_port"]["status"] == "pass"


@pytest.fixture(scope="module")
def aligned(cluster, tmp_path_factory):
    for node in cluster.nodes:
        cluster.set_mtu(node, 9000)
    r, records, facts, _ = converge(cluster, tmp_path_factory.mktemp("net"))
    assert r.returncode == 0, r.stdout[-4000:]
    assert_aligned(cluster, records, facts)
    return cluster


def test_aligned_cluster_passes_and_a_second_run_changes_nothing(aligned, tmp_path):
    cluster = aligned
    r, records, facts, recap = converge(cluster, tmp_path)
    assert r.returncode == 0, r.stdout[-4000:]
    assert_aligned(cluster, records, facts)
    for node in cluster.nodes:
        assert recap[node]["changed"] == 0 and recap[node]["failed"] == 0, (node, recap[node])
        assert not port_sockets(cluster, node), f"{node}: something still holds {PORT} after the probe"
    # n·(n-1) probes, all recorded as a matrix on the node that sent them.
    assert sum(len(records[n]["network.path_mtu"]["data"]["pairwise"]["path_mtu"]) for n in cluster.nodes) == \
        len(cluster.nodes) * (len(cluster.nodes) - 1)
    # The sim node is a container with no netplan/networkd/ifupdown/NetworkManager: said, not pretended.
    assert "not persisted: no network configuration system found" in records[cluster.head]["network.mtu_persist"]["detail"]


def test_mtu_mismatch_verify_only_names_the_node_the_pairs_and_the_fix(aligned, tmp_path):
    cluster = aligned
    low = cluster.nodes[2]
    cluster.set_mtu(low, 1500)
    try:
        r, records, _, recap = converge(cluster, tmp_path, "-e", "network_manage_mtu=false")
        assert cluster.mtu(low) == 1500, "verify-only mode changed the MTU"
    finally:
        cluster.set_mtu(low, 9000)
    assert r.returncode == 0, r.stdout[-3000:]
    assert all(recap[n]["changed"] == 0 for n in cluster.nodes)
    mtu = records[low]["network.mtu"]
    assert mtu["status"] == "fail" and "1500" in mtu["detail"] and "9000" in mtu["detail"] and low in mtu["detail"]
    assert "ip link set dev eth1 mtu 9000" in mtu["fix"]
    for node in cluster.nodes:
        if node == low:
            continue
        assert records[node]["network.mtu"]["status"] == "pass"
        path = records[node]["network.path_mtu"]
        assert path["status"] == "fail", (node, path)
        assert f"{node} -> {low}" in path["detail"] and f"{low} eth1 1500" in path["detail"]
        assert f"{node} eth1 9000" in path["detail"] and "8972" in path["detail"]
        assert path["fix"].startswith(f"on {low}:"), path["fix"]
        assert path["data"]["pairwise"]["path_mtu"][low] is False
        assert path["data"]["pairwise"]["path_base"][low] is True
        others = [p for p in cluster.nodes if p not in (node, low)]
        assert all(path["data"]["pairwise"]["path_mtu"][p] for p in others)
    own = records[low]["network.path_mtu"]
    assert own["status"] == "fail" and "message too long" in own["detail"]
    assert failing(records) == {(low, "network.mtu")} | {(n, "network.path_mtu") for n in cluster.nodes}


def test_above_the_full_mesh_limit_a_ring_proves_every_node_and_names_a_failing_pair(aligned, tmp_path):
    cluster = aligned
    low = cluster.nodes[2]
    cluster.set_mtu(low, 1500)
    try:
        r, records, _, _ = converge(cluster, tmp_path, "-e", "network_manage_mtu=false",
                                    "-e", "network_path_mtu_full_mesh_max=2", "-e", "network_path_mtu_samples=0")
    finally:
        cluster.set_mtu(low, 9000)
    assert r.returncode == 0, r.stdout[-3000:]
    # 3 nodes above a limit of 2: a ring, each node probes one peer, every node in two pairs.
    peers = {n: list(records[n]["network.path_mtu"]["data"]["pairwise"]["path_mtu"]) for n in cluster.nodes}
    assert all(len(p) == 1 for p in peers.values()), peers
    assert {frozenset((n, p[0])) for n, p in peers.items()} == {frozenset(x) for x in
                                                                ((cluster.nodes[0], cluster.nodes[1]),
                                                                 (cluster.nodes[1], cluster.nodes[2]),
                                                                 (cluster.nodes[2], cluster.nodes[0]))}
    for node in cluster.nodes:
        path = records[node]["network.path_mtu"]
        cov = path["data"]["path_coverage"]
        assert (cov["scheme"], cov["pairs"], cov["full_mesh_pairs"], cov["probes"]) == ("ring + sample", 3, 3, 1)
        assert "ring + 0 seeded random rings (seed 0)" in path["detail"] and "3 of 3 node pairs" in path["detail"]
    # The pair into the low node fails where it is probed from, named by both ends with both MTUs.
    prober = next(n for n, p in peers.items() if p == [low])
    path = records[prober]["network.path_mtu"]
    assert path["status"] == "fail" and f"{prober} -> {low}" in path["detail"] and f"{low} eth1 1500" in path["detail"]
    assert records[low]["network.path_mtu"]["status"] == "fail"  # its own probe out: message too long


def test_mtu_mismatch_is_fixed_by_the_role_and_the_fix_is_idempotent(aligned, tmp_path):
    cluster = aligned
    low = cluster.nodes[1]
    cluster.set_mtu(low, 1500)
    try:
        r, records, _, recap = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-3000:]
        assert cluster.mtu(low) == 9000
        assert recap[low]["changed"] >= 1
        assert all(recap[n]["changed"] == 0 for n in cluster.nodes if n != low)
        assert "set by the role" in records[low]["network.mtu"]["detail"]
        assert not failing(records), failing(records)
        # The management interface is never touched.
        assert all(cluster.mtu(n, "eth0") == 1500 for n in cluster.nodes)
        r, records, _, recap = converge(cluster, tmp_path)
        assert all(recap[n]["changed"] == 0 for n in cluster.nodes), recap
    finally:
        cluster.set_mtu(low, 9000)


def test_wrong_interface_name_on_one_node(aligned, tmp_path):
    cluster = aligned
    bad = cluster.nodes[1]
    inv = tmp_path / "inv"
    shutil.copytree(cluster.inventory, inv)
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / f"{bad}.yml").write_text("---\ncluster_data_iface: ens9f1\n")
    r, records, facts, _ = converge(cluster, tmp_path, inventory=inv)
    assert r.returncode == 0, r.stdout[-3000:]
    rec = records[bad]["network.iface"]
    assert rec["status"] == "fail" and "ens9f1 does not exist" in rec["detail"] and "eth1" in rec["detail"]
    assert rec["fix"].startswith(f"on {bad}:")
    assert {h for h, _ in failing(records)} == {bad}, failing(records)
    assert facts[bad]["network_iface"] == ""
    for node in cluster.nodes:
        if node != bad:
            assert records[node]["network.iface"]["status"] == "pass"
            assert bad in records[node]["network.path_mtu"]["detail"]  # named as not probed


def test_interface_names_differing_per_node_are_rendered_per_node(aligned, tmp_path):
    cluster = aligned
    odd = cluster.nodes[2]
    inv = tmp_path / "inv"
    shutil.copytree(cluster.inventory, inv)
    (inv / "host_vars").mkdir(exist_ok=True)
    # A second NIC under another name (a veth pair: the nodes' kernel has no dummy driver).
    cluster.exec(odd, ["ip", "link", "add", "data0", "type", "veth", "peer", "name", "data0p"])
    try:
        cluster.exec(odd, ["ip", "link", "set", "data0p", "up"])
        cluster.exec(odd, ["ip", "link", "set", "data0", "mtu", "9000", "up"])
        cluster.exec(odd, ["ip", "addr", "add", "172.31.254.3/32", "dev", "data0"])
        (inv / "host_vars" / f"{odd}.yml").write_text("---\ncluster_data_iface: data0\ndata_address: 172.31.254.3\n")
        r, records, facts, _ = converge(cluster, tmp_path, "-e", "network_path_check=false",
                                        "-e", "network_port_check=false", inventory=inv)
    finally:
        cluster.exec(odd, ["ip", "link", "del", "data0"], check=False)
    assert r.returncode == 0, r.stdout[-3000:]
    assert facts[odd]["network_iface"] == "data0"
    assert all(facts[n]["network_iface_uniform"] is False for n in cluster.nodes)
    rec = records[odd]["network.iface"]
    assert rec["status"] == "warn" and "per node" in rec["detail"] and f"data0 on {odd}" in rec["detail"]


def test_port_held_by_an_unrelated_process_names_its_pid_and_command(aligned, tmp_path):
    cluster = aligned
    head = cluster.head
    holder = ("import socket,time;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
              f"s.bind(('0.0.0.0',{PORT}));s.listen();time.sleep(300)")
    cluster.exec(head, ["sh", "-c", f"python3 -c \"{holder}\" >/dev/null 2>&1 & echo $! > /tmp/net-holder.pid"])
    pid = cluster.exec(head, ["cat", "/tmp/net-holder.pid"]).stdout.strip()
    try:
        time.sleep(0.5)
        r, records, _, _ = converge(cluster, tmp_path)
    finally:
        cluster.exec(head, ["kill", pid], check=False)
    rec = records[head]["network.rendezvous_port"]
    assert rec["status"] == "fail", rec
    assert f"PID {pid}" in rec["detail"] and "python3 -c import socket" in rec["detail"]
    assert "another process" in rec["detail"] and "reset.yml" not in rec["fix"]
    assert failing(records) == {(head, "network.rendezvous_port")}


def _hold_port(cluster, node, pidfile, env=""):
    holder = f"import socket,time;s=socket.socket();s.bind(('0.0.0.0',{PORT}));s.listen();time.sleep(300)"
    cluster.exec(node, ["sh", "-c", f"{env} setsid python3 -c \"{holder}\" >/dev/null 2>&1 & echo $! > {pidfile}"])
    pid = int(cluster.exec(node, ["cat", pidfile]).stdout.strip())
    ticks = int(cluster.exec(node, ["cat", f"/proc/{pid}/stat"]).stdout.rsplit(")", 1)[1].split()[19])
    return pid, ticks


def _write_state(cluster, node, state):
    cluster.exec(node, ["sh", "-c", "mkdir -p /var/lib/trainyard/train && cat > /var/lib/trainyard/train/launch.json"],
                 input=json.dumps(state))


def test_port_held_by_our_job_says_reset_and_reset_frees_it(aligned, tmp_path):
    """A crashed job: its launcher is gone, a process it started (it carries the launch token) still holds the
    port. Preflight names it as this tool's leftover with reset.yml as the fix; the network reset frees it."""
    cluster = aligned
    head = cluster.head
    pid, _ = _hold_port(cluster, head, "/tmp/net-job.pid", env="TRAINYARD_LAUNCH_ID=tok-net")
    _write_state(cluster, head, {"job": "train", "runtime": "host", "pid": 999999, "pgid": 999999, "start_ticks": 1,
                                 "token": "tok-net", "command": ["torchrun"], "log": "/tmp/x.log", "sidecars": []})
    try:
        time.sleep(0.5)
        r, records, _, _ = converge(cluster, tmp_path)
        rec = records[head]["network.rendezvous_port"]
        assert rec["status"] == "fail" and "this tool's earlier job" in rec["detail"] and f"PID {pid}" in rec["detail"]
        assert "reset.yml" in rec["fix"]
        r, _, facts, recap = converge(cluster, tmp_path, entry="reset")
        assert r.returncode == 0, r.stdout[-3000:]
        assert recap[head]["changed"] == 1
        assert f"stopping PID {pid}" in facts[head]["network_reset_summary"]
        stat = cluster.exec(head, ["cat", f"/proc/{pid}/stat"], check=False)
        assert stat.returncode != 0 or stat.stdout.rsplit(")", 1)[1].split()[0] == "Z"
        assert not port_sockets(cluster, head)
        r, _, facts, recap = converge(cluster, tmp_path, entry="reset")
        assert recap[head]["changed"] == 0 and "is free" in facts[head]["network_reset_summary"]
    finally:
        cluster.exec(head, ["kill", "-9", str(pid)], check=False)
        cluster.exec(head, ["rm", "-f", "/var/lib/trainyard/train/launch.json"], check=False)


def test_port_held_by_our_running_job_passes(aligned, tmp_path):
    """A re-run of site.yml while the job trains: the port is the live job's rendezvous, not a fault; the
    workers reach it through the job's own listener."""
    cluster = aligned
    head = cluster.head
    pid, ticks = _hold_port(cluster, head, "/tmp/net-live.pid")
    _write_state(cluster, head, {"job": "train", "runtime": "host", "pid": pid, "pgid": pid, "start_ticks": ticks,
                                 "token": "tok-live", "command": ["torchrun"], "log": "/tmp/x.log", "sidecars": []})
    try:
        time.sleep(0.5)
        r, records, _, _ = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-3000:]
        rec = records[head]["network.rendezvous_port"]
        assert rec["status"] == "pass" and "the job runs" in rec["detail"] and f"PID {pid}" in rec["detail"], rec
        for node in cluster.nodes[1:]:
            assert records[node]["network.rendezvous_reach"]["status"] == "pass"
        assert cluster.exec(head, ["test", "-d", f"/proc/{pid}"], check=False).returncode == 0  # left running
    finally:
        cluster.exec(head, ["kill", "-9", str(pid)], check=False)
        cluster.exec(head, ["rm", "-f", "/var/lib/trainyard/train/launch.json"], check=False)


def test_reset_leaves_another_process_alone(aligned, tmp_path):
    cluster = aligned
    head = cluster.head
    holder = f"import socket,time;s=socket.socket();s.bind(('0.0.0.0',{PORT}));s.listen();time.sleep(300)"
    cluster.exec(head, ["sh", "-c", f"python3 -c \"{holder}\" >/dev/null 2>&1 & echo $! > /tmp/net-other.pid"])
    pid = cluster.exec(head, ["cat", "/tmp/net-other.pid"]).stdout.strip()
    try:
        time.sleep(0.5)
        r, _, facts, recap = converge(cluster, tmp_path, entry="reset")
        assert recap[head]["changed"] == 0
        assert f"PID {pid}" in facts[head]["network_reset_summary"] and "left alone" in facts[head]["network_reset_summary"]
        assert cluster.exec(head, ["test", "-d", f"/proc/{pid}"], check=False).returncode == 0
    finally:
        cluster.exec(head, ["kill", pid], check=False)


def test_firewall_drop_is_reported_within_seconds_and_the_listener_is_gone(aligned, tmp_path):
    cluster = aligned
    head = cluster.head
    rule = ["INPUT", "-p", "tcp", "--dport", str(PORT), "-j", "DROP"]
    cluster.exec(head, ["iptables", "-I", *rule])
    try:
        r, records, _, _ = converge(cluster, tmp_path)
        listening_after = port_sockets(cluster, head)
    finally:
        cluster.exec(head, ["iptables", "-D", *rule], check=False)
    assert not listening_after, f"probe listener still there after the play: {listening_after}"
    for node in cluster.nodes[1:]:
        rec = records[node]["network.rendezvous_reach"]
        assert rec["status"] == "fail", rec
        assert "timed out" in rec["detail"] and "firewall DROP" in rec["detail"] and head in rec["detail"]
        assert "--dport 39500" in rec["fix"]
        took = float(rec["detail"].split(" after ")[1].split(" s")[0])
        assert took < 10, rec["detail"]
    assert failing(records) == {(n, "network.rendezvous_reach") for n in cluster.nodes[1:]}


def test_worker_that_cannot_reach_the_head(aligned, tmp_path):
    cluster = aligned
    worker = cluster.nodes[2]
    head_addr = cluster.data[cluster.head]
    cluster.exec(worker, ["ip", "route", "add", "blackhole", f"{head_addr}/32"])
    try:
        r, records, _, _ = converge(cluster, tmp_path)
        r2, records2, _, _ = converge(cluster, tmp_path, "-e", "cluster_data_iface=eth1")
    finally:
        cluster.exec(worker, ["ip", "route", "del", "blackhole", f"{head_addr}/32"], check=False)
    # Route-based selection: the worker has no route to the head.
    route = records[worker]["network.head_route"]
    assert route["status"] == "fail" and "blackhole" in route["detail"] and head_addr in route["detail"]
    assert records[worker]["network.iface"]["status"] == "fail"
    reach = records[worker]["network.rendezvous_reach"]
    assert reach["status"] == "fail" and "blackhole" in reach["detail"]
    assert {h for h, _ in failing(records)} == {worker}, failing(records)
    # Interface given: the interface is fine, the route and the pair worker -> head are named.
    assert records2[worker]["network.iface"]["status"] == "pass"
    assert records2[worker]["network.head_route"]["status"] == "fail"
    path = records2[worker]["network.path_mtu"]
    assert path["status"] == "fail" and f"{worker} -> {cluster.head}" in path["detail"]
    assert path["data"]["pairwise"]["path_mtu"][cluster.head] is False


def test_the_probe_listener_ends_itself_when_nobody_stops_it(aligned):
    """What keeps the port free when a play dies between `listen` and `stop`: the listener's own deadline."""
    cluster = aligned
    head = cluster.head
    out = subprocess.run([str(BIN / "ansible"), "-i", str(cluster.inventory), head, "-m", "port_check", "-a",
                          f"mode=listen address={cluster.data[head]} port={PORT} listen_seconds=3"],
                         cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and '"listening": true' in out.stdout, out.stdout + out.stderr
    assert port_sockets(cluster, head), "listener not up"
    deadline = time.time() + 15
    while port_sockets(cluster, head) and time.time() < deadline:
        time.sleep(0.5)
    assert not port_sockets(cluster, head), "listener outlived its deadline"
