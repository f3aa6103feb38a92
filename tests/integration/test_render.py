"""The render play (nccl_env, deepspeed_config, train_args) on a simulated 3-node cluster: files on every node,
read by a shell and by docker --env-file the same way, identical across nodes, idempotent, and a node whose
env file was edited fails the consistency check with the diff and is repaired by the next run."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from helpers import parse_recap

PLAYBOOK = "tests/integration/playbooks/render_sim.yml"
ENV = "/var/lib/trainyard/train/job-ro/nccl.env"
DS = "/var/lib/trainyard/train/job-ro/ds_config.json"


def _run(cluster, *args):
    report = Path(tempfile.mkstemp(suffix=".json")[1])
    p = cluster.playbook(PLAYBOOK, "-e", f"render_report={report}", *args)
    p.report = json.loads(report.read_text() or "{}")
    report.unlink()
    return p


def _records(p, check):
    return {h: r for h, d in p.report.items() for r in d.get("preflight_results") or [] if r["check"] == check}


def _shell_env(cluster, node):
    """What a shell sees after `set -a; . nccl.env` (only the file's own names)."""
    out = cluster.exec(node, ["sh", "-c", f"env -i sh -c 'set -a; . {ENV}; env'"]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line and line.split("=", 1)[0] != "PWD")


def test_render_play_on_the_simulated_cluster(cluster):
    p = _run(cluster)
    assert p.returncode == 0, p.stdout[-4000:]
    envs = {n: _shell_env(cluster, n) for n in cluster.nodes}
    for rank, node in enumerate(cluster.nodes):
        env = envs[node]
        assert env["NODE_RANK"] == str(rank)
        assert env["MASTER_ADDR"] == cluster.data[cluster.head]
        # The interface that holds the node's data address (eth1 at bring-up; a restarted node container may get
        # its networks in another order), never the management one.
        addrs = cluster.exec(node, ["ip", "-o", "-4", "addr", "show"]).stdout
        data_iface = next(line.split()[1] for line in addrs.splitlines()
                          if f" {cluster.data[node]}/" in line)
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == data_iface, addrs
        assert env["NNODES"] == "3" and env["NCCL_IB_DISABLE"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # Everything but the node's rank and its own interface name is the same on every node.
    per_node = ("NODE_RANK", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    same = [{k: v for k, v in e.items() if k not in per_node} for e in envs.values()]
    assert same[0] == same[1] == same[2]
    assert {r["status"] for r in _records(p, "nccl_env.consistent").values()} == {"pass"}
    assert {r["status"] for r in _records(p, "deepspeed_config.valid").values()} == {"pass"}
    ds = [json.loads(cluster.exec(n, ["cat", DS]).stdout) for n in cluster.nodes]
    assert ds[0] == ds[1] == ds[2] and ds[0]["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"]
    for node in cluster.nodes:
        assert p.report[node]["nccl_env_file"] == ENV and p.report[node]["deepspeed_config_file"] == DS
        assert isinstance(p.report[node]["train_args_argv"], list)

    # docker's own env-file parser reads the same values as the shell
    text = cluster.exec(cluster.nodes[1], ["cat", ENV]).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".env", delete=False) as fh:
        fh.write(text)
    image = subprocess.run(["docker", "inspect", "-f", "{{.Config.Image}}", cluster.nodes[1]], capture_output=True,
                           text=True, check=True).stdout.strip()
    out = subprocess.run(["docker", "run", "--rm", "--network", "none", "--env-file", fh.name, "--entrypoint", "env",
                          image], capture_output=True, text=True, timeout=120)
    Path(fh.name).unlink()
    assert out.returncode == 0, out.stderr
    docker_env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    for key, value in envs[cluster.nodes[1]].items():
        assert docker_env.get(key) == value, key

    # idempotence: nothing changes on the nodes the second time
    again = _run(cluster)
    recap = parse_recap(again.stdout)
    assert {n: recap[n]["changed"] for n in cluster.nodes} == dict.fromkeys(cluster.nodes, 0), again.stdout[-3000:]


def test_edited_env_file_on_one_node_is_caught_and_repaired(cluster):
    assert _run(cluster).returncode == 0
    odd = cluster.nodes[2]
    cluster.exec(odd, ["sed", "-i", "s/^NCCL_NSOCKS_PERTHREAD=4$/NCCL_NSOCKS_PERTHREAD=1/", ENV])
    try:
        p = _run(cluster, "-e", "render_entry=preflight")
        recs = _records(p, "nccl_env.consistent")
        assert recs[odd]["status"] == "fail", recs
        assert odd in recs[odd]["detail"]
        assert "-NCCL_NSOCKS_PERTHREAD=4" in recs[odd]["data"]["diff"]
        assert "+NCCL_NSOCKS_PERTHREAD=1" in recs[odd]["data"]["diff"]
        assert all(recs[n]["status"] == "pass" for n in cluster.nodes if n != odd)
        assert "NCCL_NSOCKS_PERTHREAD=1" in cluster.exec(odd, ["cat", ENV]).stdout  # read-only
    finally:
        p = _run(cluster)
    assert p.returncode == 0
    assert parse_recap(p.stdout)[odd]["changed"] >= 1
    assert {r["status"] for r in _records(p, "nccl_env.consistent").values()} == {"pass"}
