"""Role train_args run by the real ansible-playbook: the entry point and its argument list (a list, never a shell
string) for both profiles, user extras replacing profile options, and wrong shapes refused."""

import os
import sys

from helpers import LocalCluster
from helpers import REPO, load


def _pairs(argv):
    """--opt value pairs (and bare flags) of an argument list."""
    out, i = {}, 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = True
            i += 1
    return out


def test_generic_and_llamafactory_profiles(tmp_path):
    c = LocalCluster(tmp_path)
    p = c.run(roles=["deepspeed_config", "train_args"], extra={"deepspeed_config_validate": False})
    assert p.returncode == 0, p.stdout[-3000:]
    for h in c.hosts:
        facts = p.report[h]
        assert facts["train_args_entrypoint"] == f"{tmp_path}/code/ddp_train.py"  # the launch role's example
        argv = facts["train_args_argv"]
        assert argv == ["--steps", "200", "--save-every", "10", "--sleep", "0.2", "--output-root", f"{tmp_path}/outputs"]
    entry = c.records(p, "train_args.entrypoint")["node1"]
    assert entry["status"] == "skip" and "the launch role copies its example there" in entry["detail"]

    # the GPU example with the rendered DeepSpeed config
    p = c.run(roles=["train_args"], extra={
        "train_args_entrypoint": f"{tmp_path}/code/lora_zero3_train.py",
        "train_args_options": {"--output-dir": "{{ train_args_output_dir }}",
                               "--deepspeed": "{{ train_args_deepspeed_config }}", "--save-steps": 5}})
    assert p.returncode == 0, p.stdout[-3000:]
    kv = _pairs(p.report["node3"]["train_args_argv"])
    assert kv == {"--output-dir": f"{tmp_path}/outputs", "--deepspeed": str(c.path("node3", "ds_config.json")),
                  "--save-steps": "5"}
    assert p.report["node3"]["train_args_torchrun_args"] == [] and p.report["node3"]["train_args_resume_arg"] == ""


LLAMAFACTORY = {"train_args_profile": "llamafactory", "train_args_model_name_or_path": "/srv/shared/models/llama",
                "train_args_dataset": "alpaca_en", "train_args_template": "default", "train_args_save_steps": 50}


def test_llamafactory_profile_writes_the_config_llamafactory_accepts(tmp_path):
    """The YAML config llamafactory.launcher reads, checked by LLaMA-Factory's own parser on the controller."""
    import yaml

    c = LocalCluster(tmp_path)
    p = c.run(roles=["deepspeed_config", "train_args"], extra=dict(
        LLAMAFACTORY, train_args_extra=["seed=42", "learning_rate=2e-4"],
        train_args_llamafactory_options={"max_steps": 40}))
    assert p.returncode == 0, p.stdout[-3000:]
    facts = p.report["node2"]
    cfg_path = c.path("node2", "llamafactory.yaml")
    assert facts["train_args_entrypoint"] == "llamafactory.launcher"
    assert facts["train_args_torchrun_args"] == ["--module"]
    assert facts["train_args_resume_arg"] == "resume_from_checkpoint="
    assert facts["train_args_argv"] == [str(cfg_path), "seed=42", "learning_rate=2e-4"]
    cfg = yaml.safe_load(cfg_path.read_text())
    assert cfg["stage"] == "sft" and cfg["do_train"] is True and cfg["finetuning_type"] == "lora"
    assert cfg["lora_target"] == "q_proj,v_proj,k_proj,o_proj" and cfg["template"] == "default"
    assert cfg["deepspeed"] == str(c.path("node2", "ds_config.json"))
    assert cfg["output_dir"] == f"{tmp_path}/outputs" and cfg["save_steps"] == 50 and cfg["max_steps"] == 40
    assert cfg["ddp_timeout"] == 1800 and cfg["bf16"] is True and cfg["save_only_model"] is False
    assert cfg["learning_rate"] == 1e-4 and cfg["model_name_or_path"] == "/srv/shared/models/llama"
    assert "dataset_dir" not in cfg  # empty: left out
    valid = c.records(p, "train_args.llamafactory_config")["node1"]
    assert valid["status"] == "pass" and "accepted by LLaMA-Factory 0.9.5" in valid["detail"], valid
    assert c.records(p, "train_args.entrypoint")["node2"]["status"] == "skip"


def test_llamafactory_misspelt_key_fails_at_render_time(tmp_path):
    c = LocalCluster(tmp_path)
    p = c.run(roles=["deepspeed_config", "train_args"], extra=dict(
        LLAMAFACTORY, train_args_llamafactory_options={"lora_targte": "all"}))
    assert p.returncode != 0
    assert "lora_targte: LLaMA-Factory 0.9.5 has no such argument; did you mean lora_target?" in p.stdout
    assert not c.path("node1", "llamafactory.yaml").exists()
    p = c.run(roles=["deepspeed_config", "train_args"], extra=dict(LLAMAFACTORY, train_args_extra=["seed=x1"]))
    assert p.returncode != 0 and "argument --seed: invalid int value: 'x1'" in p.stdout, p.stdout[-2000:]


def test_wrong_shapes_stop_in_validation():
    """The shapes are inventory rules: the validate play stops on them once, before any host is contacted (the
    list type from the argument spec, the rest from cluster_model.check_role_rules)."""
    from ansible_collections.trainyard.core.plugins.plugin_utils import cluster_model as cm
    roles = cm.load_role_specs(REPO / "roles")

    def problems(**variables):
        hv = {"n1": {"ansible_host": "198.51.100.1", **variables}}
        return " ".join(cm.validate({"trainers": ["n1"]}, hv, roles=roles))

    assert "train_args_extra is a string but must be a list" in problems(train_args_extra="--seed 42")
    assert "train_args_profile llamafactory lacks its inputs" in problems(train_args_profile="llamafactory")
    assert "train_args_entrypoint is not an absolute path" in problems(train_args_entrypoint="train.py")
    assert "not key=value overrides" in problems(**dict(LLAMAFACTORY, train_args_extra=["--seed", "42"]))


def test_parallel_nodes_validate_one_distinct_config_once(tmp_path):
    """plugin_utils/python_child.run_cached: the nodes' tasks (parallel forks) ask for the same config; one child
    runs, the others wait on its lock and read the cached answer."""
    import threading

    from ansible_collections.trainyard.core.plugins.plugin_utils import python_child

    script = tmp_path / "child.py"
    runs = tmp_path / "runs"
    script.write_text("import json, sys, time\nopen(%r, 'a').write('x')\ntime.sleep(0.5)\n"
                      "print(json.dumps({'ok': True, 'errors': [], 'v': '1'}))\n" % str(runs))
    out = []

    def ask():
        out.append(python_child.run_cached(sys.executable, str(script), {}, ["same"], cache_dir=str(tmp_path / "c"),
                                           timeout=60, env=dict(os.environ), what="X", version_key="v"))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runs.read_text() == "x" and sorted(r["cached"] for r in out) == [False] + [True] * 5


def test_train_args_records():
    lf = load("action_plugins/llamafactory_validate.py", "llamafactory_validate_records")
    fix = {"entrypoint": "put it there", "llamafactory_config": "correct it"}
    recs = lf.train_args_records("generic", None, "/c/t.py", False, "/c/ddp_train.py", ["--a", "1"], fix)
    assert [(r["check"], r["status"]) for r in recs] == [("train_args.entrypoint", "warn")]
    assert recs[0]["detail"] == "/c/t.py not on the node yet; 2 arguments (generic)" and recs[0]["fix"] == "put it there"
    recs = lf.train_args_records("generic", None, "/c/ddp_train.py", False, "/c/ddp_train.py", [], fix)
    assert recs[0]["status"] == "skip" and "launch role copies its example" in recs[0]["detail"]
    assert lf.train_args_records("generic", None, "/c/t.py", True, "", [], fix)[0]["status"] == "pass"
    recs = lf.train_args_records("llamafactory", {"ok": False, "errors": ["bad key"]}, "llamafactory.launcher", None,
                                 "", ["/c/lf.yaml"], fix, 3, 1, "/c/lf.yaml")
    assert [(r["check"], r["status"], r["detail"]) for r in recs][0] == ("train_args.llamafactory_config", "fail",
                                                                         "bad key")
    assert recs[1]["status"] == "skip" and "Python module" in recs[1]["detail"]
    ok = lf.train_args_records("llamafactory", {"ok": True, "errors": [], "llamafactory_version": "0.9"}, "m", None,
                               "", [], fix, 3, 1, "/c/lf.yaml")[0]
    assert ok["detail"] == "accepted by LLaMA-Factory 0.9 (3 keys, 1 overrides)" and ok["data"] == {"config_file": "/c/lf.yaml"}
    assert lf.train_args_records("llamafactory", None, "m", None, "", [], fix)[0]["status"] == "skip"
