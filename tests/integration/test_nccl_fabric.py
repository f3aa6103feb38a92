"""nccl_env.fabric on the simulated cluster: a profile the nodes cannot serve (efa with no EFA device, gcp-tcpx with
neither the GPU NICs nor the plugin library) fails the preflight report, which site.yml runs before its Launch play, naming
every node, what is missing and the fix; the tcp profile finds the data interface and passes."""

from __future__ import annotations

import json
import re

PLAYBOOK = "tests/integration/playbooks/nccl_fabric.yml"


def _run(cluster, tmp_path, profile, *args):
    r = cluster.playbook(PLAYBOOK, "-e", f"cluster_run_dir={tmp_path}", "-e", f"nccl_env_profile={profile}", *args)
    report = json.loads((tmp_path / "report.json").read_text())
    fabric = {x["host"]: x for x in report["records"] if x["check"] == "nccl_env.fabric"}
    assert set(fabric) == set(cluster.nodes), r.stdout[-4000:]
    return r, fabric


def _gate(output):
    """The failure list of the report's gate ("Stop if any check failed"), as it is printed."""
    return output[output.index("Stop if any check failed"):]


def test_efa_on_nodes_without_efa_fails_before_launch_naming_node_device_and_fix(cluster, tmp_path):
    r, fabric = _run(cluster, tmp_path, "efa")
    assert r.returncode != 0
    gate = _gate(r.stdout)
    for node in cluster.nodes:
        assert fabric[node]["status"] == "fail"
        assert re.search(rf"{re.escape(node)}: nccl_env\.fabric FAIL: profile efa: no EFA device under "
                         rf"/sys/class/infiniband", gate), gate[:3000]
        assert "Attach EFA interfaces to the instance and install the EFA driver" in fabric[node]["fix"]
    assert "PLAY [Launch" not in r.stdout


def test_tcpx_without_gpu_nics_or_plugin_fails_naming_them(cluster, tmp_path):
    # launch_runtime host: the plugin is looked for on the node itself (no training container to exec into)
    r, fabric = _run(cluster, tmp_path, "gcp-tcpx", "-e", "launch_runtime=host", "-e", "container_enabled=false")
    assert r.returncode != 0
    gate = _gate(r.stdout)
    for node in cluster.nodes:
        detail = fabric[node]["detail"]
        assert fabric[node]["status"] == "fail", detail
        assert "GPU NICs missing: eth2, eth3, eth4 (nccl_env_gpu_nics)" in detail  # eth1 is the data network
        assert "no libnccl-net*.so in /usr/local/tcpx/lib64" in detail
        assert f"{node}: nccl_env.fabric FAIL: profile gcp-tcpx" in gate
        assert "mount the TCPX plugin into the image" in fabric[node]["fix"]


def test_tcp_finds_the_data_interface_and_passes(cluster, tmp_path):
    r, fabric = _run(cluster, tmp_path, "tcp")
    assert r.returncode == 0, r.stdout[-4000:]
    for node in cluster.nodes:
        assert fabric[node]["status"] == "pass"
        assert fabric[node]["detail"] == "profile tcp: sockets over eth1 (NCCL_SOCKET_IFNAME=eth1)"
