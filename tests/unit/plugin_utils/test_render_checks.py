"""The render roles' records and texts built in Python (plugin_utils/render_checks.py, nccl_vars.role_sections, the
write guards of deepspeed_validate and llamafactory_validate): ids, statuses, details and fixes for pass, fail and
skip, every node compared once."""

import base64
import hashlib

import pytest

from helpers import load

from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars, render_checks as rc

dv = load("action_plugins/deepspeed_validate.py", "deepspeed_validate_plugin")
lf = load("action_plugins/llamafactory_validate.py", "llamafactory_validate_plugin")

PATH = "/var/lib/trainyard/job/job-ro/nccl.env"


def _written(text, path=PATH, changed=False):
    return {"changed": changed, "files": [{"path": path, "content": base64.b64encode(text.encode()).decode()}],
            "globbed": {"/sys/class/net/*": ["/sys/class/net/lo", "/sys/class/net/eth1"]}, "read": {}}


def _node(rank, text, changed=False, ifname="eth1"):
    env = {"NODE_RANK": str(rank), "NCCL_SOCKET_IFNAME": ifname}
    return {"validated": {"env": env, "path": PATH, "fabric": {"profile": "tcp"}},
            "write": None if text is None else _written(text, changed=changed), "plugin": {"skipped": True}}


def _file(rank, debug="WARN"):
    return f"# head\nNCCL_SOCKET_IFNAME=eth1\nNCCL_DEBUG={debug}\nNODE_RANK={rank}\n"


def test_env_file_text_is_the_header_what_the_file_is_and_each_section():
    text = rc.env_file_text([{"title": "data interface", "vars": {"NCCL_SOCKET_IFNAME": "eth1"}},
                             {"title": "t2", "vars": {"A": "1", "B": "x;y"}}], "job1", "#\n# Ansible managed\n#")
    assert text.startswith("#\n# Ansible managed\n#\n# NCCL / torch environment of job job1: KEY=VALUE lines")
    assert text.endswith("\n\n# data interface\nNCCL_SOCKET_IFNAME=eth1\n\n# t2\nA=1\nB=x;y\n")


def test_nccl_env_records_pass_on_every_node_the_same_file():
    nodes = {f"n{i}": _node(i, _file(i)) for i in range(3)}
    out = rc.nccl_env_records(nodes, ["n0", "n1", "n2"])
    fabric, same = out["n1"]
    assert fabric["check"] == "nccl_env.fabric" and fabric["status"] == "pass"
    assert fabric["detail"] == "profile tcp: sockets over eth1 (NCCL_SOCKET_IFNAME=eth1)" and fabric["data"] == {
        "profile": "tcp"}
    assert same["check"] == "nccl_env.consistent" and same["status"] == "pass"
    assert same["detail"].startswith(f"{PATH} sha256 ") and same["detail"].endswith(", same as 3 of 3 nodes")
    assert same["fix"] == ("Re-render it (ansible-playbook site.yml --tags nccl_env) and look for a host_vars/"
                           "group_vars value that differs on n1 (nccl_env_*, cluster_*); never edit nccl.env by hand.")
    assert same["pending_on"] == {"nccl_env : Render the NCCL/torch env file": {"changed": False}}


def test_nccl_env_records_name_the_node_that_differs_and_the_majority():
    nodes = {"n0": _node(0, _file(0)), "n1": _node(1, _file(1, "INFO"), changed=True), "n2": _node(2, _file(2))}
    out = rc.nccl_env_records(nodes, ["n0", "n1", "n2"])
    bad = out["n1"][1]
    assert bad["status"] == "fail" and bad["detail"].startswith(f"n1: {PATH} differs from the majority (n0, n2): ")
    assert "-NCCL_DEBUG=WARN" in bad["detail"] and "+NCCL_DEBUG=INFO" in bad["detail"]
    assert bad["pending_on"] == {"nccl_env : Render the NCCL/torch env file": {"changed": True}}
    assert out["n0"][1]["status"] == "pass" and out["n0"][1]["detail"].endswith("same as 2 of 3 nodes")


def test_nccl_env_records_skip_where_no_node_has_the_file_and_fail_one_without_it():
    none = rc.nccl_env_records({"n0": _node(0, None), "n1": _node(1, None)})
    assert [r["status"] for r in none["n0"]] == ["skip", "skip"]
    assert none["n0"][1]["detail"] == f"{PATH} not rendered yet on any node"
    one = rc.nccl_env_records({"n0": _node(0, _file(0)), "n1": _node(1, None)})
    assert one["n1"][1]["status"] == "fail" and "(no env file on this node)" in one["n1"][1]["detail"]


def test_nccl_env_records_the_interface_lines_may_differ_where_names_differ():
    a = "NCCL_SOCKET_IFNAME={0}\nGLOO_SOCKET_IFNAME={0}\nNODE_RANK={1}\n"
    nodes = {"n0": _node(0, a.format("eth1", 0)), "n1": _node(1, a.format("ens5", 1), ifname="ens5")}
    assert [out[1]["status"] for out in rc.nccl_env_records(nodes).values()] == ["pass", "pass"]
    same_names = {"n0": _node(0, a.format("eth1", 0)), "n1": _node(1, a.format("ens5", 1))}
    assert rc.nccl_env_records(same_names)["n1"][1]["status"] == "fail"
    # not uniform by the network role: the lines are compared with what each node should have, not across nodes
    wrong = rc.nccl_env_records(same_names, iface_uniform=False)["n1"][1]
    assert wrong["status"] == "fail" and wrong["detail"].endswith(
        "NCCL_SOCKET_IFNAME=ens5 on this node, expected NCCL_SOCKET_IFNAME=eth1")


def test_deepspeed_consistent_record_pass_fail_missing_and_skip():
    text = '{\n  "a": 1\n}\n'
    digest = hashlib.sha256(text.encode()).hexdigest()
    written = _written(text, "/x/ds_config.json")
    ok = rc.deepspeed_consistent_record(written, digest, "/x/ds_config.json")
    assert ok["check"] == "deepspeed_config.consistent" and ok["status"] == "pass"
    assert ok["detail"] == f"/x/ds_config.json sha256 {digest[:12]}, same as the majority"
    assert ok["fix"] == "Re-render it (ansible-playbook site.yml --tags deepspeed_config); never edit ds_config.json by hand."
    bad = rc.deepspeed_consistent_record(written, "f" * 64, "/x/ds_config.json")
    assert bad["status"] == "fail" and bad["detail"].endswith(", differs from the majority ffffffffffff")
    gone = rc.deepspeed_consistent_record({"read": {}}, digest, "/x/ds_config.json")
    assert (gone["status"], gone["detail"]) == ("fail", "/x/ds_config.json missing")
    skip = rc.deepspeed_consistent_record({}, "", "/x/ds_config.json")
    assert (skip["status"], skip["detail"]) == ("skip", "/x/ds_config.json not written yet on any node")
    assert rc.deepspeed_consistent_record(dict(written, changed=True), digest, "p")["pending_on"] == {
        rc.DEEPSPEED_WRITE_TASK: {"changed": True}}


def test_deepspeed_write_refuses_lora_without_gather_and_a_rejected_config():
    lora_ok, lora_bad = {"status": "pass"}, {"status": "fail", "detail": "LoRA under ZeRO-3 saves an empty adapter",
                                             "variable": "deepspeed_config_gather_16bit_weights_on_model_save"}
    good = {"ok": True, "errors": []}
    assert dv.refusals(lora_ok, good) == []
    assert dv.refusals(lora_bad, good) == [
        "LoRA under ZeRO-3 saves an empty adapter; remove deepspeed_config_gather_16bit_weights_on_model_save or "
        "set it to true."]
    rejected = {"ok": False, "errors": ["a: bad", "b: bad"]}
    assert dv.refusals(lora_ok, rejected) == ["a: bad; b: bad"]
    assert dv.refusals(lora_ok, rejected, enabled=False) == []


def test_train_args_launch_facts():
    assert lf.launch_facts("generic", "/c/ddp_train.py", ["--a", "1"]) == {
        "train_args_entrypoint": "/c/ddp_train.py", "train_args_argv": ["--a", "1"], "train_args_torchrun_args": [],
        "train_args_resume_arg": ""}
    facts = lf.launch_facts("llamafactory", "llamafactory.launcher", ["/c/lf.yaml"])
    assert facts["train_args_torchrun_args"] == ["--module"]
    assert facts["train_args_resume_arg"] == "resume_from_checkpoint="
    assert lf.launch_facts("llamafactory", "m", [], weights_from="/ckpt")["train_args_resume_arg"] == ""
    assert lf.config_text({"stage": "sft", "do_train": True, "cutoff_len": 512}) == (
        "---\nstage: sft\ndo_train: true\ncutoff_len: 512\n")


SETTINGS = {"profile": "tcp", "nsocks_perthread": 4, "socket_nthreads": 4, "ib_hca": "", "ib_gid_index": "",
            "gpu_nics": "eth1,eth2,eth3,eth4", "plugin_dir": "", "tcpx_tx_bindings": "", "tcpx_rx_bindings": "",
            "p2p_disable": False, "shm_disable": False, "async_error_handling": 1, "heartbeat_timeout_s": 600,
            "collective_timeout_s": 1800, "debug": "auto", "debug_subsys": "INIT,ENV,NET", "distributed_debug": "",
            "omp_num_threads": 1, "cuda_alloc_conf": "expandable_segments:True", "flight_recorder_entries": 2000,
            "rw_dir": "/s/job/job-rw", "visible_devices": "0,1"}
MODEL = {"master_addr": "10.0.0.1", "master_port": 29500, "nnodes": 2, "nproc_per_node": 8, "world_size": 16,
         "node_rank": 1}


def test_role_sections_of_the_default_tcp_profile():
    sections, env, errors = nccl_vars.build_env(nccl_vars.role_sections(MODEL, "eth1", SETTINGS))
    assert not errors
    assert [s["title"] for s in sections] == [
        "rendezvous (from the cluster model)", "data interface", "NCCL transport (profile tcp)",
        "errors, timeouts and debugging", "devices and processes",
        "hang diagnosis (PyTorch's NCCL flight recorder, dumped on a collective timeout; per-rank progress files)"]
    assert sections[2]["vars"] == {"NCCL_IB_DISABLE": "1", "NCCL_NSOCKS_PERTHREAD": "4", "NCCL_SOCKET_NTHREADS": "4"}
    assert sections[3]["vars"] == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "600",
                                   "TRAINYARD_COLLECTIVE_TIMEOUT_S": "1800", "DEEPSPEED_TIMEOUT": "30",
                                   "NCCL_DEBUG": "WARN"}
    assert env["NODE_RANK"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/s/job/job-rw/flight_recorder/rank_"


def test_role_sections_of_the_other_profiles_and_switches():
    def transport(**over):
        return nccl_vars.role_sections(MODEL, "eth0", dict(SETTINGS, **over))[2]["vars"]

    assert transport(profile="ib", ib_hca="mlx5_0:1", ib_gid_index=3) == {"NCCL_IB_HCA": "mlx5_0:1",
                                                                         "NCCL_IB_GID_INDEX": 3}
    assert transport(profile="roce") == {"NCCL_IB_HCA": None, "NCCL_IB_GID_INDEX": None}
    assert transport(profile="efa") == {"FI_PROVIDER": "efa"}
    tcpx = transport(profile="gcp-tcpx", tcpx_tx_bindings="eth1:8-21")
    assert tcpx["NCCL_GPUDIRECTTCPX_CTRL_DEV"] == "eth0" and tcpx["NCCL_GPUDIRECTTCPX_TX_BINDINGS"] == "eth1:8-21"
    assert tcpx["NCCL_GPUDIRECTTCPX_RX_BINDINGS"] is None
    tcpxo = transport(profile="gcp-tcpxo", plugin_dir="/usr/local/nvidia/lib64")
    assert tcpxo["NCCL_TUNER_CONFIG_PATH"] == "/usr/local/nvidia/lib64/a3plus_tuner_config.textproto"
    assert transport(nsocks_perthread=0, p2p_disable=True, shm_disable=True) == {
        "NCCL_IB_DISABLE": 1, "NCCL_NSOCKS_PERTHREAD": None, "NCCL_SOCKET_NTHREADS": 4, "NCCL_P2P_DISABLE": 1,
        "NCCL_SHM_DISABLE": 1}
    debug = nccl_vars.role_sections(MODEL, "eth0", dict(SETTINGS, debug="INFO", flight_recorder_entries=0))
    assert debug[3]["vars"]["NCCL_DEBUG"] == "INFO" and debug[3]["vars"]["NCCL_DEBUG_SUBSYS"] == "INIT,ENV,NET"
    assert debug[5]["vars"] == {}


DS = {"profile": "zero3_offload", "micro_batch_size": "auto", "gradient_accumulation_steps": "auto",
      "train_batch_size": "auto", "gradient_clipping": 1.0, "steps_per_print": 100, "bf16": True, "fp16": False,
      "zero3_reduce_bucket_size": 500000000, "zero3_prefetch_bucket_size": 500000000,
      "zero3_param_persistence_threshold": 1000000, "gather_16bit": True, "node_local": True, "moe": False,
      "moe_leaf_classes": ["a.B"], "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "scheduler": {}}


def test_deepspeed_generated_config_of_each_profile():
    from ansible_collections.trainyard.core.plugins.plugin_utils import ds_config

    offload = ds_config.generated(DS)
    z = offload["zero_optimization"]
    assert z["offload_optimizer"] == z["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert z["reduce_bucket_size"] == z["stage3_prefetch_bucket_size"] == "auto" and z["stage"] == 3
    assert z["stage3_gather_16bit_weights_on_model_save"] is True and "leaf_module" not in z
    assert offload["checkpoint"] == {"use_node_local_storage": True} and offload["bf16"] == {"enabled": True}
    assert offload["optimizer"] == DS["optimizer"] and "scheduler" not in offload
    assert offload["train_micro_batch_size_per_gpu"] == "auto" and offload["wall_clock_breakdown"] is False
    z3 = ds_config.generated(dict(DS, profile="zero3", moe=True, scheduler={"type": "WarmupLR"}))
    assert "offload_param" not in z3["zero_optimization"]
    assert z3["zero_optimization"]["reduce_bucket_size"] == 500000000
    assert z3["zero_optimization"]["leaf_module"] == {"classes": ["a.B"]} and z3["scheduler"] == {"type": "WarmupLR"}
    plain = ds_config.generated(dict(DS, profile="none", optimizer={}))
    assert plain["zero_optimization"] == {"stage3_gather_16bit_weights_on_model_save": True}
    assert "optimizer" not in plain
    assert ds_config.merge({"a": {"x": 1, "y": 2}, "b": 1}, {"a": {"y": 3, "z": 4}, "c": 5}) == {
        "a": {"x": 1, "y": 3, "z": 4}, "b": 1, "c": 5}


# ----------------------------------------------------------------------------------------------- train_args.timeout
LIMITS = {"collective": 1800, "max": 7200, "above_max": False}


@pytest.mark.parametrize("config,overrides,limits,status,detail", [
    ({"ddp_timeout": 1800}, [], LIMITS, "pass", "ddp_timeout 1800 s, the job's one collective timeout"),
    ({"ddp_timeout": 1800}, ["ddp_timeout=600"], LIMITS, "warn", "ddp_timeout 600 s differs from the job's "
                                                                 "collective timeout of 1800 s"),
    # LLaMA-Factory's ZeRO-3 LoRA example: 180000000 s (5.7 years)
    ({"ddp_timeout": 180000000}, [], LIMITS, "fail", "ddp_timeout 180000000 s is above the ceiling of 7200 s"),
    ({"ddp_timeout": 1800}, ["ddp_timeout=180000000"], dict(LIMITS, above_max=True), "warn",
     "kept by nccl_env_collective_timeout_above_max: a dead rank can hang the job 180000000 s"),
    ({}, [], LIMITS, "warn", "the LLaMA-Factory config sets no ddp_timeout"),
])
def test_timeout_record_reads_what_llamafactory_will_use(config, overrides, limits, status, detail):
    rec = lf.timeout_record("llamafactory", config, overrides, limits)
    assert rec["check"] == "train_args.timeout" and rec["status"] == status, rec
    assert detail in rec["detail"], rec
    assert status == "pass" or "nccl_env_collective_timeout_s" in rec["fix"]


def test_timeout_record_skips_a_profile_that_sets_no_timeout_of_its_own():
    rec = lf.timeout_record("generic", {}, [], LIMITS)
    assert rec["status"] == "skip" and "TRAINYARD_COLLECTIVE_TIMEOUT_S (1800 s" in rec["detail"]
