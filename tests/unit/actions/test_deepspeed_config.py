"""DeepSpeed config: the validation plugin against DeepSpeed's own classes, and role deepspeed_config rendered by the
real ansible-playbook for every shipped profile (files parsed and re-validated with DeepSpeed directly)."""

import json
import os
import subprocess
import sys

import pytest

from helpers import COLLECTIONS, REPO, load
from helpers import LocalCluster, recap_changed

dv = load("action_plugins/deepspeed_validate.py", "deepspeed_validate_plugin")

BASE = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
        "gradient_clipping": 1.0, "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True},
                              "reduce_bucket_size": "auto", "stage3_gather_16bit_weights_on_model_save": True}}


def test_the_play_builds_the_file_text_and_validates_it_once():
    """ds_config.render gives the file's text (to_nice_json's layout) and the LoRA check; validated runs DeepSpeed
    once and answers what every node records and what the write refuses (the node's name is the write's to add)."""
    import hashlib

    from ansible.plugins.filter.core import to_nice_json

    from ansible_collections.trainyard.core.plugins.plugin_utils import ds_config

    built = ds_config.render(BASE, {}, finetuning_type="lora")
    assert built["content"] == to_nice_json(BASE, indent=2) + "\n" and built["lora"]["status"] == "pass"
    with pytest.raises(ValueError, match="nope.json cannot be read"):
        ds_config.render({}, {}, "nope.json", "")
    runs = []
    answer = dv.validated(built, lambda cfg: runs.append(cfg) or {"ok": True, "errors": [], "deepspeed_version": "0.1"})
    assert runs == [json.loads(built["content"])] and answer["configs_validated"] == 1 and answer["refuse"] == []
    assert answer["majority"] == hashlib.sha256(built["content"].encode()).hexdigest()
    assert [(r["check"], r["status"]) for r in answer["records"]] == [("deepspeed_config.lora_gather", "pass"),
                                                                      ("deepspeed_config.valid", "pass")]
    assert answer["records"][1]["detail"] == 'profile , accepted by DeepSpeed 0.1, "auto" filled by trainer'
    off = dv.validated(built, None, enabled=False)
    assert off["configs_validated"] == 0 and off["records"][1]["status"] == "skip" and off["refuse"] == []
    rejected = dv.validated(built, lambda cfg: {"ok": False, "errors": ["a: bad"], "deepspeed_version": "0.1"})
    assert rejected["refuse"] == ["a: bad"] and rejected["records"][1]["status"] == "fail"


def test_fill_auto_replaces_only_hf_filled_fields():
    filled, errors = dv.fill_auto(BASE)
    assert errors == []
    assert "train_batch_size" not in filled and filled["train_micro_batch_size_per_gpu"] == 1
    assert filled["optimizer"]["params"]["betas"] == [0.9, 0.999]
    assert filled["zero_optimization"]["reduce_bucket_size"] > 0
    assert BASE["optimizer"]["params"]["lr"] == "auto", "the input is not modified"
    _, errors = dv.fill_auto({**BASE, "steps_per_print": "auto", "zero_optimization": {"sub_group_size": "auto"}})
    assert sorted(e.split(":")[0] for e in errors) == ["the config key steps_per_print",
                                                       "the config key zero_optimization.sub_group_size"]


def test_auto_paths():
    assert sorted(dv.auto_paths({"a": "auto", "b": {"c": "auto", "d": 1}, "e": "autox"})) == ["a", "b.c"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dscache"))


def test_deepspeed_accepts_the_base_config(cache):
    r = dv.validate(BASE, cache_dir=cache)
    assert r["ok"], r["errors"]
    assert r["deepspeed_version"]


@pytest.mark.parametrize("mutate,expect", [
    # nested keys: DeepSpeed's own (pydantic) message
    (lambda c: c["zero_optimization"].update(stage3_gather_16bit_weights_on_model_sav=True),
     ["DeepSpeedZeroConfig", "stage3_gather_16bit_weights_on_model_sav", "Extra inputs are not permitted"]),
    (lambda c: c["zero_optimization"]["offload_param"].update(pin_memry=True), ["pin_memry", "Extra inputs"]),
    (lambda c: c["bf16"].update(enable=True), ["DeepSpeedBF16Config", "enable"]),
    (lambda c: c["zero_optimization"].update(stage="three"), ["stage", "Input should be"]),
    (lambda c: c["zero_optimization"]["offload_param"].update(device="gpu"), ["device"]),
    (lambda c: c.update(fp16={"enabled": True}), ["bfloat16 and fp16 modes cannot be simultaneously enabled"]),
    # top-level keys DeepSpeed silently ignores: reported with the nearest key DeepSpeed reads
    (lambda c: c.update(gradient_clippin=1.0), ["gradient_clippin", "did you mean gradient_clipping?"]),
    (lambda c: c.update(zero_optimisation={"stage": 3}), ["zero_optimisation", "did you mean zero_optimization?"]),
])
def test_deepspeed_rejects_mistyped_keys_with_its_message(cache, mutate, expect):
    config = json.loads(json.dumps(BASE))
    mutate(config)
    r = dv.validate(config, cache_dir=cache)
    assert not r["ok"]
    text = " ".join(r["errors"])
    for part in expect:
        assert part in text, text


def test_allow_unknown_top_level_key(cache):
    config = {**BASE, "my_tool": {"x": 1}}
    assert not dv.validate(config, cache_dir=cache)["ok"]
    assert dv.validate(config, ["my_tool"], cache_dir=cache)["ok"]


def test_results_are_cached_by_content(cache):
    config = {**BASE, "steps_per_print": 7}
    first = dv.validate(config, cache_dir=cache)
    second = dv.validate(config, cache_dir=cache)
    assert first["ok"] and not first["cached"] and second["cached"]


def test_missing_deepspeed_is_reported(tmp_path):
    r = dv.validate(BASE, python="/usr/bin/python3", cache_dir="")  # system python: no deepspeed
    assert not r["ok"] and "cannot import deepspeed" in " ".join(r["errors"])


def _deepspeed_direct(path):
    """Load a written ds_config.json with DeepSpeed itself (HF-style "auto" replaced), in a fresh process."""
    code = ("import json,sys,importlib.util as u;"
            f"s=u.spec_from_file_location('d','{REPO}/action_plugins/deepspeed_validate.py');"
            "d=u.module_from_spec(s);s.loader.exec_module(d);"
            "c=json.load(open(sys.argv[1]));f,e=d.fill_auto(c);assert not e,e;"
            "from deepspeed.runtime.config import DeepSpeedConfig as D;x=D(f);"
            "print(json.dumps({'stage':x.zero_optimization_stage,'offload_param':bool(x.zero_config.offload_param),"
            "'gather':x.zero_config.gather_16bit_weights_on_model_save,'bf16':x.bfloat16_config.enabled,"
            "'clip':x.gradient_clipping,'leaf':list(x.zero_config.leaf_module.classes)}))")
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST="9.0", PYTHONPATH=str(COLLECTIONS))
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_shipped_profile_renders_and_deepspeed_accepts_it(tmp_path):
    # zero3_offload (default)
    c = LocalCluster(tmp_path / "offload")
    p = c.run(roles=["deepspeed_config"])
    assert p.returncode == 0, p.stdout[-3000:]
    ds = c.ds("node2")
    z = ds["zero_optimization"]
    assert z["stage"] == 3 and z["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert z["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert z["stage3_gather_16bit_weights_on_model_save"] is True
    assert ds["bf16"] == {"enabled": True} and ds["gradient_clipping"] == 1.0
    assert ds["train_micro_batch_size_per_gpu"] == "auto" and ds["optimizer"]["params"]["lr"] == "auto"
    assert all(c.ds(h) == ds for h in c.hosts)
    assert {r["status"] for r in c.records(p, "deepspeed_config.valid").values()} == {"pass"}
    assert {r["status"] for r in c.records(p, "deepspeed_config.consistent").values()} == {"pass"}
    assert p.report["node1"]["deepspeed_config_file"] == str(c.path("node1", "ds_config.json"))
    direct = _deepspeed_direct(c.path("node1", "ds_config.json"))
    assert direct["stage"] == 3 and direct["offload_param"] and direct["gather"] and direct["bf16"]
    again = c.run(roles=["deepspeed_config"])
    assert {h: recap_changed(again.stdout)[h] for h in c.hosts} == dict.fromkeys(c.hosts, 0)

    # zero3 with the MoE block, fp32 and an override deep-merged
    c = LocalCluster(tmp_path / "zero3")
    p = c.run(roles=["deepspeed_config"], extra={
        "deepspeed_config_profile": "zero3", "deepspeed_config_moe": True, "deepspeed_config_bf16": False,
        "deepspeed_config_gradient_clipping": "auto",
        "deepspeed_config_overrides": {"zero_optimization": {"sub_group_size": 500000000}, "steps_per_print": 5}})
    assert p.returncode == 0, p.stdout[-3000:]
    ds = c.ds("node1")
    z = ds["zero_optimization"]
    assert "offload_param" not in z and "offload_optimizer" not in z
    assert z["reduce_bucket_size"] == 500000000 and z["stage3_prefetch_bucket_size"] == 500000000
    assert z["sub_group_size"] == 500000000 and z["stage"] == 3 and ds["steps_per_print"] == 5
    assert "MixtralSparseMoeBlock" in " ".join(z["leaf_module"]["classes"])
    assert ds["bf16"] == {"enabled": False} and ds["gradient_clipping"] == "auto"
    direct = _deepspeed_direct(c.path("node1", "ds_config.json"))
    assert direct["stage"] == 3 and not direct["offload_param"] and direct["leaf"]


def test_mistyped_override_fails_with_deepspeeds_message_and_nothing_is_written(tmp_path):
    c = LocalCluster(tmp_path)
    p = c.run(roles=["deepspeed_config"],
              extra={"deepspeed_config_overrides": {"zero_optimization": {"stage3_prefetch_bucket": 1000}}})
    assert p.returncode != 0
    assert "stage3_prefetch_bucket" in p.stdout and "Extra inputs are not permitted" in p.stdout
    assert not c.path("node1", "ds_config.json").exists()


def test_lora_with_gather_off_is_a_preflight_failure_naming_the_variable(tmp_path):
    c = LocalCluster(tmp_path)
    p = c.run(roles=["deepspeed_config"], extra={"deepspeed_config_gather_16bit_weights_on_model_save": False})
    assert p.returncode != 0 and "deepspeed_config_gather_16bit_weights_on_model_save" in p.stdout
    p = c.run(roles=["deepspeed_config"], entry="preflight", extra={
        "deepspeed_config_overrides": {"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": False}}})
    assert p.returncode != 0
    assert "deepspeed_config_overrides.zero_optimization.stage3_gather_16bit_weights_on_model_save" in p.stdout
    assert not c.path("node1", "ds_config.json").exists()
    # full fine-tuning may turn it off
    p = c.run(roles=["deepspeed_config"], extra={"deepspeed_config_gather_16bit_weights_on_model_save": False,
                                                 "deepspeed_config_finetuning_type": "full"})
    assert p.returncode == 0, p.stdout[-3000:]
    assert c.ds("node1")["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is False


def test_users_own_config_file_goes_in_unchanged_with_the_additions_listed(tmp_path):
    src = REPO / "tests" / "data" / "byo" / "deepspeed" / "axolotl_zero3.json"
    user = json.loads(src.read_text())
    c = LocalCluster(tmp_path)
    p = c.run(roles=["deepspeed_config"], extra={"deepspeed_config_base_file": str(src)})
    assert p.returncode == 0, p.stdout[-3000:]
    ds = c.ds("node1")
    added = {k: v for k, v in ds.items() if k not in user}
    assert {k: ds[k] for k in user} == user and added == {"checkpoint": {"use_node_local_storage": True}}
    rec = c.records(p, "deepspeed_config.valid")["node1"]
    assert rec["status"] == "pass" and [a["key"] for a in rec["data"]["added"]] == ["checkpoint.use_node_local_storage"]
    assert "from " + str(src) in rec["detail"] and "precision from" in rec["detail"]
    # a file that cannot be read stops before anything is written, naming the variable
    p = c.run(roles=["deepspeed_config"], extra={"deepspeed_config_base_file": str(tmp_path / "nope.json")})
    assert p.returncode != 0 and "deepspeed_config_base_file" in p.stdout and "nope.json" in p.stdout
