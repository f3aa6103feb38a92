"""The simulated cluster behaves like separate nodes, and the data MTU can change under Ansible's feet."""

from __future__ import annotations

import subprocess
import uuid

from helpers import REPO, SIM, load, parse_recap, run_playbook


def test_nodes_are_separate(cluster):
    marker = f"/dev/shm/trainyard-sep-{uuid.uuid4().hex[:8]}"
    head, others = cluster.nodes[0], cluster.nodes[1:]
    cluster.exec(head, ["touch", marker])
    try:
        for node in others:
            assert cluster.exec(node, ["test", "-e", marker], check=False).returncode == 1, node
        hostnames = {cluster.exec(n, ["hostname"]).stdout.strip() for n in cluster.nodes}
        assert hostnames == set(cluster.nodes)
        # Separate process tables: a process started on the head is invisible on the others.
        pid = cluster.exec(head, ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"]).stdout.strip()
        for node in others:
            r = cluster.exec(node, ["sh", "-c", f"cat /proc/{pid}/cmdline 2>/dev/null"], check=False)
            assert "sleep" not in r.stdout, node
        cluster.exec(head, ["kill", pid])
    finally:
        cluster.exec(head, ["rm", "-f", marker])


def test_each_node_runs_its_own_docker_engine(cluster):
    ids = {cluster.ssh(n, ["docker", "info", "--format", "{{.ID}}"]).stdout.strip() for n in cluster.nodes}
    assert len(ids) == len(cluster.nodes)


def test_data_mtu_per_node_while_ansible_keeps_working(cluster):
    head, worker = cluster.nodes[0], cluster.nodes[1]
    assert cluster.mtu(worker) == cluster.meta["mtu"] == 9000
    # Change the worker's data MTU through Ansible itself, over the management network.
    r = run_playbook(cluster.inventory, "tests/integration/playbooks/set_data_mtu.yml",
                     "--limit", worker, "-e", "mtu=1500")
    assert r.returncode == 0, r.stdout
    try:
        assert cluster.mtu(worker) == 1500
        assert cluster.mtu(head) == 9000
        # Ansible still reaches every node (its SSH runs on the management network).
        r = run_playbook(cluster.inventory, "tests/integration/playbooks/ping.yml")
        assert r.returncode == 0, r.stdout
        assert all(v["unreachable"] == 0 and v["failed"] == 0 for v in parse_recap(r.stdout).values())
        # A real jumbo-frame mismatch: small frames pass, large don't-fragment frames vanish.
        small = cluster.exec(head, ["ping", "-M", "do", "-c", "1", "-W", "1", "-s", "1472", cluster.data[worker]],
                             check=False)
        large = cluster.exec(head, ["ping", "-M", "do", "-c", "1", "-W", "1", "-s", "8972", cluster.data[worker]],
                             check=False)
        assert small.returncode == 0, small.stdout
        assert large.returncode != 0, large.stdout
    finally:
        cluster.set_mtu(worker, 9000)
    large = cluster.exec(head, ["ping", "-M", "do", "-c", "1", "-W", "2", "-s", "8972", cluster.data[worker]],
                         check=False)
    assert large.returncode == 0, large.stdout


def test_a_cluster_whose_networks_alone_were_left_comes_up_again():
    """A removal cut short leaves the cluster's networks without its containers: up removes them and starts over."""
    name = f"lf{uuid.uuid4().hex[:6]}"
    label = f"trainyard.sim={name}"
    mgmt, _ = load("tests/sim/simcluster.py", "simcluster_for_test").subnets(name)  # the subnet up would take
    subprocess.run(["docker", "network", "create", "--label", label, "--subnet", str(mgmt), f"{name}-mgmt"],
                   check=True, capture_output=True)
    try:
        up = subprocess.run([*SIM, "up", "--name", name, "--nodes", "1", "--kind", "light"], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"cluster '{name}' exists; recreating it" in up.stdout + up.stderr
    finally:
        down = subprocess.run([*SIM, "down", "--name", name], cwd=REPO, capture_output=True, text=True)
    assert down.returncode == 0, down.stdout + down.stderr
    left = subprocess.run(["docker", "network", "ls", "-q", "--filter", f"label={label}"], capture_output=True,
                          text=True, check=True)
    assert left.stdout.split() == []
