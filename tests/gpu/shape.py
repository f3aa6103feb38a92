"""The acceptance inventory for a shape: N "nodes" of G GPUs each on one GPU machine (tests/gpu/acceptance.py
--nodes N --gpus-per-node G --runtime host|container).

Nodes that share a machine are told apart the way a cluster's nodes are: each has its own GPUs
(`nvidia_driver_visible_devices`: node i gets GPUs i*G .. i*G+G-1, its CUDA_VISIBLE_DEVICES), its own output and
state directories, its own data address on lo, and its own NCCL host id (`launch_env` for the job, and through
the NCCL check's nccl_check_env; `container_env` too in the container runtime), so NCCL joins a node's GPUs over
NVLink (P2P and SHM stay on) and crosses nodes over its socket transport, as between real machines. Where the
machine has fewer GPUs than N x G, every node uses the same GPU(s) (`nvidia_driver_allow_shared_gpus`; P2P and SHM
off), the layout of tests/gpu/two-nodes and two-nodes-container.

The base variables are those inventories' group_vars/all.yml (copied); the shape's own variables go into
group_vars/trainers.yml, which wins over all.yml (hosts.yml's own group vars would not: they rank below it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BASE = {"host": REPO / "tests/gpu/two-nodes", "container": REPO / "tests/gpu/two-nodes-container"}


def node_devices(nodes: int, gpus_per_node: int, ngpu: int) -> list[list[int]]:
    """Each node's GPU indexes; every node on GPUs 0..G-1 when the machine has fewer than N x G."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("--nodes and --gpus-per-node must be at least 1")
    if nodes * gpus_per_node <= ngpu:
        return [list(range(i * gpus_per_node, (i + 1) * gpus_per_node)) for i in range(nodes)]
    if gpus_per_node > ngpu:
        raise ValueError(f"--gpus-per-node {gpus_per_node}: this machine has {ngpu} GPU(s)")
    return [list(range(gpus_per_node)) for _ in range(nodes)]


def inventory(out: Path, runtime: str, nodes: int, gpus_per_node: int, ngpu: int) -> dict:
    """Write OUT/inventory-<runtime>-<N>x<G>/ (hosts.yml, group_vars/all.yml); returns {path, hosts, devices}."""
    devices = node_devices(nodes, gpus_per_node, ngpu)
    shared = nodes * gpus_per_node > ngpu
    inv = out / f"inventory-{runtime}-{nodes}x{gpus_per_node}"
    (inv / "group_vars").mkdir(parents=True, exist_ok=True)
    shutil.copy(BASE[runtime] / "group_vars" / "all.yml", inv / "group_vars" / "all.yml")
    hosts = {}
    for i, devs in enumerate(devices):
        hv = {"data_address": f"127.0.0.{i + 1}",
              "cluster_output_root": "{{ gpu_acceptance_root }}/node%d/outputs" % i,
              "cluster_state_dir": "{{ gpu_acceptance_root }}/node%d/state" % i,
              "nvidia_driver_visible_devices": ",".join(map(str, devs)),
              "launch_env": {"NCCL_HOSTID": f"trainyard-node{i}"}}
        if runtime == "container":
            hv.update(container_name=f"trainyard-gpu-accept-node{i}",
                      container_env={"NCCL_HOSTID": f"trainyard-node{i}"},
                      # rank 0 logs the loss after its first step; the other nodes wait for the rendezvous only
                      launch_wait_for="first_step" if i == 0 else "rendezvous")
        hosts[f"gpu-node{i}"] = hv
    group = {"cluster_gpus_per_node": ngpu, "cluster_nproc_per_node": gpus_per_node,
             "nvidia_driver_allow_shared_gpus": shared,
             # within a node NVLink (P2P) and shared memory, unless the nodes share their GPUs
             "nccl_env_p2p_disable": shared, "nccl_env_shm_disable": shared}
    if not shared:  # the NCCL check at the size of the plain all-reduce it is compared with (1 GiB)
        group.update(nccl_check_size_mb=1024, nccl_check_min_inter_busbw_gbps=1.0)
    # group_vars/trainers.yml: a file of the inventory's group_vars outranks group_vars/all.yml (the base); vars in
    # hosts.yml itself would not (inventory-file group vars rank below every group_vars file)
    (inv / "group_vars" / "trainers.yml").write_text(
        "---\n# The shape's own variables (tests/gpu/shape.py), over group_vars/all.yml.\n"
        + yaml.safe_dump(group, sort_keys=False))
    doc = {"all": {"children": {"trainers": {"hosts": hosts}},
                   "vars": {"ansible_connection": "local",
                            "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}}
    (inv / "hosts.yml").write_text("---\n# Written by tests/gpu/shape.py: %d node(s) x %d GPU(s), runtime %s%s.\n"
                                   % (nodes, gpus_per_node, runtime, ", GPUs shared" if shared else "")
                                   + yaml.safe_dump(doc, sort_keys=False))
    return {"path": str(inv), "hosts": list(hosts), "devices": devices, "shared_gpus": shared}
