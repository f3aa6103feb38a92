"""Role nccl_env run by the real ansible-playbook on a local 3-node "cluster" (connection local, one state dir per
node): every profile's file parsed, typos rejected with the nearest name, the across-node check, idempotence."""

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
from helpers import LocalCluster, recap_changed

COMMON = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "MASTER_ADDR": "172.29.5.11", "MASTER_PORT": "39500",
          "WORLD_SIZE": "24", "NNODES": "3", "NPROC_PER_NODE": "8", "NCCL_SOCKET_IFNAME": "eth1",
          "GLOO_SOCKET_IFNAME": "eth1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1",
          "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TRAINYARD_COLLECTIVE_TIMEOUT_S": "1800",
          "DEEPSPEED_TIMEOUT": "30"}


def _run(c, **kw):
    p = c.run(roles=["nccl_env"], **kw)
    return p


def test_tcp_profile_default_then_idempotent_first_launch_gets_info(tmp_path):
    c = LocalCluster(tmp_path)
    p = _run(c)
    assert p.returncode == 0, p.stdout[-3000:]
    envs = {h: c.env(h) for h in c.hosts}
    for rank, h in enumerate(c.hosts):
        env = envs[h]
        for k, v in COMMON.items():
            assert env[k] == v, (h, k)
        assert env["NODE_RANK"] == str(rank)
        assert env["NCCL_IB_DISABLE"] == "1"
        assert env["NCCL_NSOCKS_PERTHREAD"] == "4" and env["NCCL_SOCKET_NTHREADS"] == "4"
        # auto: the file says WARN whether or not the job ran; INFO goes to each node's first launch only
        assert env["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_SUBSYS" not in env
        assert p.report[h]["nccl_env_first_launch_env"] == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET"}
        assert "NCCL_P2P_DISABLE" not in env and "NCCL_IB_HCA" not in env and "TORCH_DISTRIBUTED_DEBUG" not in env
        assert p.report[h]["nccl_env_file"] == str(c.path(h, "nccl.env"))
    # identical except NODE_RANK (and the flight recorder's dump paths: this test gives each node its own state dir)
    fr_paths = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
                "TRAINYARD_PROGRESS_DIR")
    for e in envs.values():
        # dumps and progress files go to the job-writable directory (nccl_env_rw_dir), never the host-only one
        assert e["TORCH_FR_DUMP_TEMP_FILE"].endswith("/train/%s/flight_recorder/rank_" % tr.JOB_RW_DIR)
        assert e["TRAINYARD_PROGRESS_DIR"].endswith("/train/%s/progress" % tr.JOB_RW_DIR)
        assert e["TORCH_FR_BUFFER_SIZE"] == "2000"
        assert e["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and e["TORCH_NCCL_ENABLE_MONITORING"] == "1"
    strip = [{k: v for k, v in e.items() if k != "NODE_RANK" and k not in fr_paths} for e in envs.values()]
    assert strip[0] == strip[1] == strip[2]
    recs = c.records(p, "nccl_env.consistent")
    assert {h: r["status"] for h, r in recs.items()} == {h: "pass" for h in c.hosts}
    assert {r["status"] for r in c.records(p, "nccl_env.variables").values()} == {"pass"}

    again = _run(c)
    assert again.returncode == 0
    assert {h: recap_changed(again.stdout)[h] for h in c.hosts} == dict.fromkeys(c.hosts, 0), again.stdout[-2000:]

    # a launch in between (the launch module writes launch.json) changes nothing in the file: a re-run stays at 0
    for h in c.hosts:
        (c.path(h, "nccl.env").parent.parent / "launch.json").write_text("{}")  # host-only, beside job-ro/
    again = _run(c)
    assert again.returncode == 0
    assert {h: recap_changed(again.stdout)[h] for h in c.hosts} == dict.fromkeys(c.hosts, 0), again.stdout[-2000:]
    assert all(c.env(h)["NCCL_DEBUG"] == "WARN" for h in c.hosts)

    # a fixed level is written as it is, and there is nothing for the first launch
    p = _run(c, extra={"nccl_env_debug": "INFO"})
    assert p.returncode == 0
    assert all(c.env(h)["NCCL_DEBUG"] == "INFO" and c.env(h)["NCCL_DEBUG_SUBSYS"] == "INIT,ENV,NET" for h in c.hosts)
    assert all(p.report[h]["nccl_env_first_launch_env"] == {} for h in c.hosts)


def test_tcp_smoke_test_and_ib_profiles(tmp_path):
    c = LocalCluster(tmp_path)
    p = _run(c, extra={"nccl_env_p2p_disable": True, "nccl_env_shm_disable": True, "nccl_env_debug": "WARN",
                       "nccl_env_distributed_debug": "DETAIL", "nccl_env_collective_timeout_s": 600})
    assert p.returncode == 0, p.stdout[-3000:]
    env = c.env("node2")
    assert env["NCCL_P2P_DISABLE"] == "1" and env["NCCL_SHM_DISABLE"] == "1" and env["NCCL_IB_DISABLE"] == "1"
    assert env["NCCL_DEBUG"] == "WARN" and env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert env["TRAINYARD_COLLECTIVE_TIMEOUT_S"] == "600" and env["DEEPSPEED_TIMEOUT"] == "10"

    p = _run(c, extra={"nccl_env_profile": "ib", "nccl_env_ib_hca": "mlx5_0:1,mlx5_1:1", "nccl_env_ib_gid_index": 3})
    assert p.returncode == 0, p.stdout[-3000:]
    env = c.env("node3")
    assert "NCCL_IB_DISABLE" not in env and env["NCCL_IB_HCA"] == "mlx5_0:1,mlx5_1:1"
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert "NCCL_NSOCKS_PERTHREAD" not in env and "NCCL_P2P_DISABLE" not in env


def test_ib_without_hca_leaves_the_hcas_to_nccl(tmp_path):
    c = LocalCluster(tmp_path / "ib")
    p = _run(c, extra={"nccl_env_profile": "ib"})
    env = c.env("node1")
    assert "NCCL_IB_HCA" not in env and "NCCL_IB_DISABLE" not in env, p.stdout[-2000:]
    rec = c.records(p, "nccl_env.fabric")["node1"]
    assert rec["status"] in ("pass", "fail") and "profile ib" in rec["detail"]
    p = _run(c, extra={"nccl_env_profile": "gcp-tcpx", "nccl_env_gpu_nics": "lo",
                       "nccl_env_tcpx_tx_bindings": "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;"
                                                    "eth4:60-73,164-177"})
    env = c.env("node1")
    assert env["NCCL_GPUDIRECTTCPX_TX_BINDINGS"] == ("eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;"
                                                     "eth4:60-73,164-177"), p.stdout[-2000:]
    assert env["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"] == "lo" and env["NCCL_GPUDIRECTTCPX_CTRL_DEV"] == "eth1"
    # Socket tuning beyond NCCL's limits stops in the validate play: test_validation.py test_role_rules_*.


def test_typo_in_extra_fails_with_nearest_name_and_nothing_is_written(tmp_path):
    c = LocalCluster(tmp_path)
    p = _run(c, extra={"nccl_env_extra": {"NCCL_SOCKET_IFNAM": "eth1", "NCCL_CROSS_NIC": 1}})
    assert p.returncode != 0
    assert "NCCL_SOCKET_IFNAM is not a variable" in p.stdout and "did you mean NCCL_SOCKET_IFNAME?" in p.stdout
    assert not c.path("node1", "nccl.env").exists()
    # the escape hatch, and a user override of a role value
    p = _run(c, extra={"nccl_env_extra": {"MYLAB_SEED": 7, "NCCL_NSOCKS_PERTHREAD": 2},
                       "nccl_env_allow_unknown": ["MYLAB_*"]})
    assert p.returncode == 0, p.stdout[-3000:]
    env = c.env("node1")
    assert env["MYLAB_SEED"] == "7" and env["NCCL_NSOCKS_PERTHREAD"] == "2"
    text = c.path("node1", "nccl.env").read_text()
    assert text.count("NCCL_NSOCKS_PERTHREAD=") == 1


def test_value_no_env_file_consumer_reads_alike_is_refused(tmp_path):
    c = LocalCluster(tmp_path)
    p = _run(c, extra={"nccl_env_extra": {"NCCL_DEBUG_FILE": "'/tmp/nccl.log'"}})
    assert p.returncode != 0 and "starts with a quote" in p.stdout and "NCCL_DEBUG_FILE" in p.stdout


def test_rendezvous_variables_cannot_be_overridden(tmp_path):
    c = LocalCluster(tmp_path)
    p = _run(c, extra={"nccl_env_extra": {"MASTER_PORT": 1234}})
    assert p.returncode != 0 and "MASTER_PORT comes from the cluster model" in p.stdout


def test_missing_interface_fails_clearly(tmp_path):
    c = LocalCluster(tmp_path, cluster_data_iface="")
    p = _run(c)
    assert p.returncode != 0 and "no data interface for NCCL_SOCKET_IFNAME" in p.stdout
    # the network role's fact wins over cluster_data_iface
    c = LocalCluster(tmp_path / "b", cluster_data_iface="", network_iface="ens9", network_iface_uniform=True)
    p = _run(c)
    assert p.returncode == 0, p.stdout[-3000:]
    assert c.env("node1")["NCCL_SOCKET_IFNAME"] == "ens9" == c.env("node1")["GLOO_SOCKET_IFNAME"]


def test_edited_file_on_one_node_fails_the_consistency_check_with_a_diff(tmp_path):
    c = LocalCluster(tmp_path)
    assert _run(c).returncode == 0
    f = c.path("node2", "nccl.env")
    f.write_text(f.read_text().replace("NCCL_SOCKET_NTHREADS=4", "NCCL_SOCKET_NTHREADS=2"))
    # the read-only entry point compares what is on the nodes
    p = _run(c, entry="preflight")
    recs = c.records(p, "nccl_env.consistent")
    assert recs["node1"]["status"] == "pass" and recs["node3"]["status"] == "pass"
    bad = recs["node2"]
    assert bad["status"] == "fail"
    assert "node2" in bad["detail"] and "majority (node1, node3)" in bad["detail"]
    assert "-NCCL_SOCKET_NTHREADS=4" in bad["data"]["diff"] and "+NCCL_SOCKET_NTHREADS=2" in bad["data"]["diff"]
    assert "NCCL_SOCKET_NTHREADS=2" in f.read_text(), "preflight must not rewrite the file"
    # check mode sees the same difference, pending on the render that would repair it; a real run repairs the file
    p = _run(c, check=True)
    pending = c.records(p, "nccl_env.consistent")["node2"]
    assert pending["status"] == "pending" and "Render the NCCL/torch env file" in pending["fix"]
    assert "+NCCL_SOCKET_NTHREADS=2" in pending["data"]["diff"]
    p = _run(c)
    assert p.returncode == 0
    assert {r["status"] for r in c.records(p, "nccl_env.consistent").values()} == {"pass"}
    assert recap_changed(p.stdout)["node2"] == 1 and recap_changed(p.stdout)["node1"] == 0


def test_host_var_drift_and_per_node_interfaces(tmp_path):
    # one node with its own value: rendered as asked, but flagged as different from the majority
    c = LocalCluster(tmp_path, hostvars={"node3": {"nccl_env_omp_num_threads": 4}})
    p = _run(c)
    recs = c.records(p, "nccl_env.consistent")
    assert recs["node3"]["status"] == "fail" and "+OMP_NUM_THREADS=4" in recs["node3"]["data"]["diff"]
    assert recs["node1"]["status"] == "pass"
    # different interface names per node are expected: those lines are compared with each node's own value
    c = LocalCluster(tmp_path / "b", cluster_data_iface="",
                     hostvars={"node1": {"network_iface": "eth1"}, "node2": {"network_iface": "ens5"},
                               "node3": {"network_iface": "eth1"}}, network_iface_uniform=False)
    p = _run(c)
    assert p.returncode == 0, p.stdout[-3000:]
    assert {r["status"] for r in c.records(p, "nccl_env.consistent").values()} == {"pass"}
    assert c.env("node2")["NCCL_SOCKET_IFNAME"] == "ens5"
    f = c.path("node2", "nccl.env")
    f.write_text(f.read_text().replace("GLOO_SOCKET_IFNAME=ens5", "GLOO_SOCKET_IFNAME=eth1"))
    p = _run(c, entry="preflight")
    bad = c.records(p, "nccl_env.consistent")["node2"]
    assert bad["status"] == "fail" and "expected GLOO_SOCKET_IFNAME=ens5" in bad["data"]["diff"]


# Choices (nccl_env_profile, nccl_env_debug) and the rules the argument spec cannot state (socket tuning, timeouts) are
# the validate play's, once on the controller before any host is contacted (cluster_model.check_role_rules).
@pytest.mark.parametrize("var,value", [("nccl_env_socket_nthreads", 32), ("nccl_env_collective_timeout_s", 0)])
def test_bad_options_stop_in_validation(var, value):
    from ansible_collections.trainyard.core.plugins.plugin_utils import cluster_model as cm
    from helpers import REPO
    hv = {"n1": {"ansible_host": "198.51.100.1", var: value}}
    (line,) = cm.validate({"trainers": ["n1"]}, hv, roles=cm.load_role_specs(REPO / "roles"))
    assert line.startswith("Stop if ") and f"{var}={value}" in line and " on n1" in line


def test_one_task_builds_and_writes_and_a_refusal_still_records_its_check(tmp_path):
    """The build writes the file itself (no task of its own for the write). A node whose variables it refuses fails
    before its file is written, and its nccl_env.variables record (a failed task sets no fact) lands through the
    rescue; the other nodes go on."""
    c = LocalCluster(tmp_path, hostvars={"node2": {"nccl_env_extra": {"NCCL_SOCKET_IFNAM": "eth1"}}})
    p = _run(c)
    assert p.returncode != 0 and "did you mean NCCL_SOCKET_IFNAME?" in p.stdout, p.stdout[-3000:]
    assert "TASK [nccl_env : Render the NCCL/torch env file]" not in p.stdout
    assert "then render the NCCL/torch env file]" in p.stdout
    recs = c.records(p, "nccl_env.variables")
    assert {h: r["status"] for h, r in recs.items()} == {"node1": "pass", "node2": "fail", "node3": "pass"}, recs
    assert "NCCL_SOCKET_IFNAM" in recs["node2"]["detail"]
    assert not c.path("node2", "nccl.env").exists() and c.path("node1", "nccl.env").exists()
