"""Rented container nodes end to end: two plain simulated nodes (`simcluster.py up --kind plain`: sshd and
Python, no docker engine, no systemd, SSH on mapped ports of 127.0.0.1, an overlay network at MTU 1450 beside
an internet-bridge-like network), the inventory built by the vast_instances plugin from the provider CLI's raw
JSON, then site.yml (the job on the nodes' own Python, janitor as a sidecar), the job's traffic on the overlay,
and reset.yml. Also the reference inventory inventory/example-rented-overlay through playbooks/validate.yml."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from helpers import REPO, SIM, BIN, ansible_env, parse_recap, report_of, run_playbook

OVERLAY_MTU = 1450


def test_reference_inventory_validates_and_names_what_it_left_out():
    r = run_playbook(REPO / "inventory/example-rented-overlay", "playbooks/validate.yml", timeout=180)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "2 trainers, 8 processes each" in r.stdout and "head vast-31000412 (10.0.0.1:39500)" in r.stdout
    assert "instance 31000501 left out: actual_status exited" in r.stdout
    assert "instance 31000610 left out: on overlay evalnet, not trainnet" in r.stdout


@pytest.fixture(scope="module")
def rented():
    name = os.environ.get("TY_SIM_NAME", "it") + "-rent"
    subprocess.run([*SIM, "up", "--name", name, "--nodes", "2", "--kind", "plain", "--data-mtu", str(OVERLAY_MTU)],
                   check=True, cwd=REPO)
    try:
        yield json.loads((REPO / ".sim" / name / "cluster.json").read_text())
    finally:
        if os.environ.get("TY_SIM_KEEP") != "1":
            subprocess.run([*SIM, "down", "--name", name], check=False, cwd=REPO)


def node_sh(node: str, script: str) -> str:
    r = subprocess.run(["docker", "exec", node, "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (node, script, r.stdout, r.stderr)
    return r.stdout


def test_site_runs_the_job_on_the_overlay_then_reset(rented):
    nodes, inv = rented["nodes"], Path(rented["inventory"])
    overlay = dict(zip(nodes, rented["data"]))
    bridge = dict(zip(nodes, rented["inet"]))

    # The inventory, from the provider's JSON: mapped SSH ports, overlay addresses, ranks by label.
    listed = subprocess.run([str(BIN / "ansible-inventory"), "-i", str(inv), "--list"], cwd=REPO,
                            env=ansible_env(), capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    hosts = data["trainers"]["hosts"]
    # Strings from the provider's file are marked unsafe (never templated): ansible-inventory shows them wrapped.
    hv = {h: {k: v["__ansible_unsafe"] if isinstance(v, dict) and "__ansible_unsafe" in v else v
              for k, v in vs.items()} for h, vs in data["_meta"]["hostvars"].items()}
    assert hosts == [f"vast-{i}" for i in rented["instance_ids"]]
    for rank, (host, node, port) in enumerate(zip(hosts, nodes, rented["ssh_ports"])):
        assert (hv[host]["ansible_host"], hv[host]["ansible_port"]) == ("127.0.0.1", port)
        assert hv[host]["data_address"] == overlay[node] and hv[host]["node_rank"] == rank
        assert hv[host]["vast_label"] == node and hv[host]["vast_num_gpus"] == 4

    # The nodes are containers without systemd or an engine.
    for node in nodes:
        assert node_sh(node, "test -e /.dockerenv && ! test -d /run/systemd/system && ! command -v dockerd "
                             "&& cat /sys/class/net/eth1/mtu").strip() == str(OVERLAY_MTU)

    r = run_playbook(inv, "site.yml", timeout=1500)
    assert r.returncode == 0, r.stdout[-5000:]
    recap = parse_recap(r.stdout)
    assert all(recap[h]["failed"] == 0 and recap[h]["unreachable"] == 0 for h in hosts), recap
    report = report_of(r.stdout)
    rec = {(x["host"], x["check"]): x for x in report["records"]}
    for host, node in zip(hosts, nodes):
        assert rec[(host, "network.iface")]["status"] == "pass"
        assert rec[(host, "network.iface")]["detail"].startswith("eth1 (") and overlay[node] in \
            rec[(host, "network.iface")]["detail"]
        # The overlay's MTU measured (cluster_data_mtu 0), proven between the nodes, never set.
        assert rec[(host, "network.mtu")]["status"] == "pass" and f"MTU {OVERLAY_MTU}" in rec[(host, "network.mtu")]["detail"]
        assert "measured" in rec[(host, "network.mtu")]["detail"]
        assert rec[(host, "network.path_mtu")]["status"] == "pass"
        assert f"{OVERLAY_MTU - 28}- and {OVERLAY_MTU - 28}-byte" in rec[(host, "network.path_mtu")]["detail"]
        assert rec[(host, "network.mtu_persist")]["status"] == "skip"
        # What cannot apply on a rented container is a skip with its reason, never a pass.
        assert rec[(host, "cluster.container")]["status"] == "skip"
        assert "docker container" in rec[(host, "cluster.container")]["detail"]
        assert "janitor as a sidecar" in rec[(host, "cluster.container")]["detail"]
        assert rec[(host, "container.enabled")]["status"] == "skip"
        assert rec[(host, "fabricmanager.service")]["status"] == "skip"

    # The job: gloo and NCCL given the overlay interface; its connections between the nodes on the overlay.
    pids = {}
    for rank, node in enumerate(nodes):
        log = ""
        for _ in range(120):
            log = node_sh(node, "cat /var/lib/trainyard/train/job-rw/torchrun.log")
            if "first step done" in log:
                break
            time.sleep(1)
        assert f"rendezvous done rank={rank} world=2" in log, log[-2000:]
        assert re.search(r"gloo_socket_ifname=eth1 nccl_socket_ifname=eth1", log), log[-2000:]
        assert "first step done" in log, log[-2000:]
        env = node_sh(node, "cat /var/lib/trainyard/train/job-ro/nccl.env")
        assert "NCCL_SOCKET_IFNAME=eth1" in env and "GLOO_SOCKET_IFNAME=eth1" in env
        state = json.loads(node_sh(node, "cat /var/lib/trainyard/train/launch.json"))
        assert state["runtime"] == "host" and [s["name"] for s in state["sidecars"]] == ["janitor"]
        pids[node] = [state["pid"]] + [s["pid"] for s in state["sidecars"]]
    peers = node_sh(nodes[0], "ss -tnH state established")
    assert re.search(rf"{re.escape(overlay[nodes[0]])}:\d+\s+{re.escape(overlay[nodes[1]])}:\d+", peers) or \
        re.search(rf"{re.escape(overlay[nodes[0]])}:\d+\s+.*{re.escape(overlay[nodes[1]])}", peers), peers
    assert bridge[nodes[1]] not in peers, peers  # nothing of the job crosses the internet bridge

    r = run_playbook(inv, "reset.yml", "-e", "reset_confirm=true", timeout=600)
    assert r.returncode == 0, r.stdout[-4000:]
    for node in nodes:
        alive = node_sh(node, " ".join(f"test -d /proc/{p} && echo {p};" for p in pids[node]) + " true")
        assert alive.strip() == "", (node, alive)
