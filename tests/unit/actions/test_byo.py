"""Bring your own config: real DeepSpeed configs and cloud NCCL settings (tests/data/byo/, sources in its README)
go in unchanged, known-bad ones are refused with the right reason, and env-file values round-trip exactly."""

import base64
import json
import re
import shlex

import pytest

from ansible_collections.trainyard.core.plugins.plugin_utils import ds_config
from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars as nv
from ansible_collections.trainyard.core.plugins.plugin_utils import render_checks
from ansible_collections.trainyard.core.plugins.module_utils import launcher
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
from helpers import REPO, load


dv = load("action_plugins/deepspeed_validate.py", "deepspeed_validate_byo")
bench = load("roles/nccl_check/files/allreduce_bench.py", "allreduce_bench_byo")

BYO = REPO / "tests" / "data" / "byo"
DS_FILES = sorted((BYO / "deepspeed").glob("*.json"))
# DeepSpeed 0.19.8 itself refuses this one (reduce_bucket_size must be > 0; the file was written for an older
# DeepSpeed): the product writes it unchanged and passes DeepSpeed's own message on, naming the field.
DS_REFUSES = {"transformers_ds_config_zero3.json": "reduce_bucket_size"}
WANTS = {"bf16": True, "fp16": False, "finetuning_type": "lora", "gather_16bit": True, "node_local": True,
         "moe_leaf_classes": []}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("byocache"))


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: node}


# ------------------------------------------------------------------------------------------ DeepSpeed, accepted

def test_the_corpus_is_there():
    assert len(DS_FILES) >= 12


@pytest.mark.parametrize("path", DS_FILES, ids=lambda p: p.name)
def test_real_config_goes_in_unchanged_and_deepspeed_accepts_it(path, cache):
    user = json.loads(path.read_text())
    built = ds_config.build({"unused": 1}, {}, user, str(path), WANTS)
    config = built["config"]
    # every key and value of the user's file is there, untouched; what was added is listed, and only new keys
    leaves, user_leaves = _leaves(config), _leaves(user)
    assert {k: leaves[k] for k in user_leaves} == user_leaves
    assert set(leaves) - set(user_leaves) <= {k for a in built["added"] for k in _leaves(a["value"], a["key"])}
    assert "unused" not in config, "nothing of the variables-built config is merged in"
    # never two spellings of one field, never bf16 next to the user's fp16
    assert ds_config.duplicate_spellings(config) == []
    if ds_config.precision(user)[0] == "fp16":
        assert "bf16" not in config
    r = dv.validate(config, cache_dir=cache, source=str(path))
    if path.name in DS_REFUSES:
        assert not r["ok"] and DS_REFUSES[path.name] in r["errors"][0] and "DeepSpeed 0.19.8" in r["errors"][0]
        return
    assert r["ok"], r["errors"]


def test_short_field_names_get_no_stage3_twin_and_overrides_replace_the_users_spelling():
    user = json.loads((BYO / "deepspeed" / "axolotl_zero3.json").read_text())
    built = ds_config.build({}, {"zero_optimization": {"stage3_max_live_parameters": 5}}, user, "z3.json", WANTS)
    zero = built["config"]["zero_optimization"]
    assert zero["stage3_max_live_parameters"] == 5 and "max_live_parameters" not in zero
    assert "stage3_gather_16bit_weights_on_model_save" not in zero and zero["gather_16bit_weights_on_model_save"]
    assert built["added"] == [{"key": "checkpoint.use_node_local_storage", "value": True,
                               "why": built["added"][0]["why"]}]


def test_fp16_config_gets_no_bf16_and_the_report_says_why():
    user = json.loads((BYO / "deepspeed" / "transformers_ds_config_zero3.json").read_text())
    built = ds_config.build({}, {}, user, "ds_config_zero3.json", WANTS)
    assert "bf16" not in built["config"] and built["config"]["optimizer"] == user["optimizer"]
    assert any("precision from ds_config_zero3.json (fp16.enabled: fp16)" in k for k in built["kept"])
    # the deprecated fp16 gather spelling counts as set: no second spelling added
    assert "stage3_gather_16bit_weights_on_model_save" not in built["config"]["zero_optimization"]


def test_no_precision_is_decided_and_said():
    built = ds_config.build({}, {}, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}},
                            "mine.json", WANTS)
    assert built["config"]["bf16"] == {"enabled": True}
    assert [a["key"] for a in built["added"]] == ["bf16.enabled", "checkpoint.use_node_local_storage"]
    assert "mine.json sets no precision" in built["added"][0]["why"]
    assert "optimizer" not in built["config"], "who builds the optimizer stays the user's choice"


def test_variables_mode_fp16_override_drops_the_default_bf16_and_says_so():
    built = ds_config.build({"bf16": {"enabled": True}, "zero_optimization": {"stage": 3,
                                                                              "stage3_max_live_parameters": 1}},
                            {"fp16": {"enabled": True}, "zero_optimization": {"max_live_parameters": 2}})
    assert "bf16" not in built["config"] and built["config"]["fp16"] == {"enabled": True}
    assert built["config"]["zero_optimization"] == {"stage": 3, "max_live_parameters": 2}
    assert any("deepspeed_config_bf16" in k for k in built["kept"])


def test_alias_table_matches_the_installed_deepspeed():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    aliases = {name: f.alias for name, f in DeepSpeedZeroConfig.model_fields.items() if f.alias}
    deprecated = {name: (f.json_schema_extra or {}).get("new_param")
                  for name, f in DeepSpeedZeroConfig.model_fields.items()
                  if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("deprecated")}
    for canon, alias in aliases.items():
        assert alias in ds_config.ZERO_ALIASES[canon], (canon, alias)
    for old, new in deprecated.items():
        if new in ds_config.ZERO_ALIASES:
            assert old in ds_config.ZERO_ALIASES[new], (old, new)


# ------------------------------------------------------------------------------------------ DeepSpeed, refused

def _bad(name):
    return json.loads((BYO / "deepspeed" / "bad" / name).read_text())


def test_typo_top_level_key_is_refused_with_a_close_hint(cache):
    r = dv.validate(_bad("typo_zero_optimisation.json"), cache_dir=cache)
    assert not r["ok"] and any("zero_optimisation" in e and "did you mean zero_optimization?" in e
                               for e in r["errors"])
    no_auto = _bad("typo_zero_optimisation.json")
    no_auto["zero_optimisation"] = {"stage": 3}
    r = dv.validate(no_auto, cache_dir=cache)
    assert not r["ok"] and any("zero_optimisation: DeepSpeed 0.19.8 does not read this top-level key; did you mean "
                               "zero_optimization?" in e for e in r["errors"])


def test_unrelated_unknown_key_gets_no_hint(cache):
    r = dv.validate({**json.loads(DS_FILES[0].read_text()), "my_team_notes": 1}, cache_dir=cache)
    assert not r["ok"] and any("my_team_notes" in e and "did you mean" not in e for e in r["errors"])


def test_lora_gather_off_names_the_file_and_key():
    v = ds_config.lora_gather(_bad("lora_gather_off.json"), {}, "lora", "/home/me/z3.json")
    assert v["status"] == "fail"
    assert "/home/me/z3.json key zero_optimization.gather_16bit_weights_on_model_save" in v["detail"]


def test_fp16_and_bf16_together_are_refused_by_deepspeed(cache):
    r = dv.validate(_bad("fp16_and_bf16.json"), cache_dir=cache)
    assert not r["ok"] and any("fp16" in e and "bf" in e.lower() for e in r["errors"])


def test_auto_is_checked_against_the_integration_that_fills_it():
    cfg = _bad("auto_nothing_fills.json")
    _, errors = dv.fill_auto(cfg, "accelerate", "ds.json")
    joined = " | ".join(errors)
    assert "ds.json key optimizer.params.betas" in joined and "Hugging Face Trainer" in joined
    assert "deepspeed_config_auto_filler: trainer" in joined
    assert "ds.json key steps_per_print" in joined and "neither" in joined
    assert not any("optimizer.params.lr" in e for e in errors), "Accelerate fills lr"
    _, errors = dv.fill_auto(cfg, "trainer", "ds.json")
    assert [e.split(":")[0] for e in errors] == ["ds.json key steps_per_print"]
    _, errors = dv.fill_auto(json.loads(DS_FILES[0].read_text()), "none", "x.json")
    assert errors and all("deepspeed_config_auto_filler" in e for e in errors)


def test_stage3_spelling_of_an_auto_key_is_filled():
    cfg = {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto"}}
    filled, errors = dv.fill_auto(cfg, "trainer")
    assert errors == [] and filled["zero_optimization"]["stage3_prefetch_bucket_size"] > 0


def test_unreadable_base_file_is_named():
    assert "x.json is not JSON" in ds_config.load("{nope", "x.json")["error"]
    assert "x.json cannot be read" in ds_config.load("", "x.json")["error"]


# ------------------------------------------------------------------------------------------ NCCL settings

def _tcpx_documented():
    text = (BYO / "nccl" / "gcp_tcpx_nccl-config.yaml.txt").read_text()
    out = {}
    for m in re.finditer(r"-x (\w+)=(\S+) \\", text):
        if m.group(1) != "LD_LIBRARY_PATH":
            out[m.group(1)] = shlex.split(m.group(2))[0]
    return out


def _tcpxo_documented():
    text = (BYO / "nccl" / "gcp_tcpxo_README.md").read_text()
    return {k: v for k, v in re.findall(r'^"(\w+)=([^"]*)"', text, re.M) if k != "LD_LIBRARY_PATH"}


def _efa_documented():
    text = (BYO / "nccl" / "aws_efa-env-var.md").read_text()
    # the page's own NCCL_MIN_CHANNELS is not a variable NCCL reads (NCCL_MIN_NCHANNELS is): refused, with that hint
    env = dict(re.findall(r"<code>(FI_\w+|NCCL_\w+)=(\w+)</code>", text))
    assert "did you mean NCCL_MIN_NCHANNELS?" in nv.check_name("NCCL_MIN_CHANNELS")
    return {k: v for k, v in env.items() if k != "NCCL_MIN_CHANNELS"}


@pytest.mark.parametrize("documented", [_tcpx_documented, _tcpxo_documented, _efa_documented],
                         ids=["gcp-tcpx", "gcp-tcpxo", "aws-efa"])
def test_documented_cloud_settings_are_accepted_and_round_trip(documented, tmp_path):
    env = documented()
    assert len(env) >= 4
    sections, flat, errors = nv.build_env([], env, (), "ib")
    assert errors == []
    assert flat == env
    # written as the role writes it, read back by the launch module, the in-container launcher and nccl_check
    path = tmp_path / "nccl.env"
    path.write_text("# comment\n" + "".join(f"{k}={v}\n" for k, v in flat.items()))
    read, problems = tr.parse_env_file(path.read_text(), str(path))
    assert problems == [] and read == env
    assert launcher.env_file(str(path)) == env
    assert bench.load_env_file(str(path)) == env


def test_tcpx_bindings_keep_their_semicolons():
    env = _tcpx_documented()
    assert env["NCCL_GPUDIRECTTCPX_TX_BINDINGS"] == "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;" \
                                                    "eth4:60-73,164-177"


@pytest.mark.parametrize("value", ["/usr/local/tcpx/lib64:/usr/local/nvidia/lib64", 'a="b"', "x #y", "$HOME/x"])
def test_values_with_paths_inner_quotes_and_dollars_round_trip(value, tmp_path):
    text, why = nv.check_value("LD_LIBRARY_PATH", value)
    assert why is None
    env, problems = tr.parse_env_file(f"LD_LIBRARY_PATH={text}\n")
    assert problems == [] and env["LD_LIBRARY_PATH"] == value


@pytest.mark.parametrize("name", ["FI_EFA_USE_DEVICE_RDMA", "FI_PROVIDER", "OFI_NCCL_PROTOCOL", "NCCL_FASTRAK_IFNAME",
                                  "NCCL_GPUDIRECTTCPX_TX_BINDINGS", "NCCL_TUNER_CONFIG_PATH",
                                  "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE", "UCX_NET_DEVICES",
                                  "SHARP_COLL_ENABLE_SAT", "UCX_IB_PCI_RELAXED_ORDERING"])
def test_fabric_component_variables_are_known(name):
    assert nv.check_name(name) is None


@pytest.mark.parametrize("name,hint", [("FI_EFA_USE_DEVICE_RMDA", "FI_EFA_USE_DEVICE_RDMA"),
                                       ("NCCL_FASTRAK_IFNAM", "NCCL_FASTRAK_IFNAME"),
                                       ("OFI_NCCL_PROTOCL", "OFI_NCCL_PROTOCOL"),
                                       ("MYLAB_SEED", None), ("FI_FOO", None), ("NCCL_MY_OWN_KNOB", None),
                                       ("SLURM_JOB_ID", None)])
def test_did_you_mean_only_when_close(name, hint):
    assert nv.suggest(name) == hint


def test_ib_disable_is_refused_under_ib_and_roce_but_not_tcp():
    for profile in ("ib", "roce"):
        _, _, errors = nv.build_env([], {"NCCL_IB_DISABLE": 1}, (), profile)
        assert errors and "fall back to TCP sockets" in errors[0]
    assert nv.build_env([], {"NCCL_IB_DISABLE": 1}, (), "tcp")[2] == []


# ------------------------------------------------------------------------------------------ fabric checks

@pytest.mark.parametrize("args,status,text", [
    (("tcp",), "skip", "no NCCL_SOCKET_IFNAME"),
    (("ib", ["mlx5_0", "mlx5_1"], {"mlx5_0": "InfiniBand", "mlx5_1": "InfiniBand"}), "pass", "mlx5_0, mlx5_1"),
    (("ib", [], {}), "fail", "no InfiniBand RDMA device"),
    (("ib", ["mlx5_0"], {"mlx5_0": "InfiniBand"}, [], None, "", "mlx5_3:1"), "fail", "names mlx5_3"),
    (("roce", ["mlx5_0"], {"mlx5_0": "InfiniBand"}), "fail", "no Ethernet RDMA device"),
    (("efa", ["rdmap16s27"], {}, [], {"rc": 0, "stdout": "/opt/amazon/ofi-nccl/lib/libnccl-net.so\n"}), "pass",
     "libnccl-net.so"),
    (("efa", ["rdmap16s27"], {}, [], {"rc": 0, "stdout": ""}, "/opt/amazon/ofi-nccl/lib"), "fail",
     "no libnccl-net*.so in /opt/amazon/ofi-nccl/lib"),
    (("gcp-tcpx", [], {}, [], {"rc": 1, "stdout": "", "stderr": "Error: No such container: t"}), "skip",
     "not running"),
    (("gcp-tcpxo", [], {}, ["eth5"], {"rc": 0, "stdout": "/usr/local/nvidia/lib64/libnccl-net.so"}), "fail",
     "GPU NICs missing: eth5"),
])
def test_fabric_verdicts(args, status, text):
    v = render_checks.nccl_fabric(*args)
    assert v["status"] == status and text in v["detail"], v
    if status == "fail":
        assert v["fix"] and "tcp" not in v["fix"].split("profile")[-1].split()[:1]


def test_fabric_verdict_from_the_env_file_task_s_own_probe():
    """The env-file task's job_files glob/read answer stands in for the separate find/slurp/stat probes."""
    b64 = lambda t: base64.b64encode(t.encode()).decode()  # noqa: E731
    probe = {"globbed": {"/sys/class/net/*": ["/sys/class/net/eth1", "/sys/class/net/lo"],
                         "/sys/class/infiniband/*": ["/sys/class/infiniband/mlx5_0", "/sys/class/infiniband/mlx5_1"]},
             "read": {"/sys/class/infiniband/mlx5_0/ports/1/link_layer": b64("InfiniBand\n"),
                      "/sys/class/infiniband/mlx5_1/ports/1/link_layer": b64("Ethernet\n")}}
    assert render_checks.nccl_fabric_probe("tcp", probe, ifname="eth1")["status"] == "pass"
    assert render_checks.nccl_fabric_probe("tcp", probe, ifname="eth9")["status"] == "fail"
    assert render_checks.nccl_fabric_probe("tcp", {"skipped": True}, ifname="eth1")["status"] == "skip"
    v = render_checks.nccl_fabric_probe("roce", probe)
    assert v["status"] == "pass" and "mlx5_0, mlx5_1" in v["detail"], v
    v = render_checks.nccl_fabric_probe("ib", dict(probe, read={}), ib_hca="mlx5_0:1")
    assert v["status"] == "pass", v
    v = render_checks.nccl_fabric_probe("gcp-tcpx", probe, {"rc": 0, "stdout": "/usr/local/tcpx/lib64/libnccl-net.so"},
                                 "eth1,eth2")
    assert v["status"] == "fail" and "GPU NICs missing: eth2" in v["detail"], v


def test_a_value_pasted_with_its_shell_quotes_is_refused_with_the_reason():
    text = (BYO / "nccl" / "gcp_tcpx_nccl-config.yaml.txt").read_text()
    raw = re.search(r"-x NCCL_GPUDIRECTTCPX_TX_BINDINGS=(\S+) \\", text).group(1)
    assert raw.startswith('"')
    _, _, errors = nv.build_env([], {"NCCL_GPUDIRECTTCPX_TX_BINDINGS": raw}, (), "gcp-tcpx")
    assert len(errors) == 1 and "starts with a quote" in errors[0] and "without the surrounding quotes" in errors[0]
