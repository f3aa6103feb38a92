"""Role train_args run by the real ansible-playbook: the entry point and its argument list (a list, never a shell
string) for both profiles, user extras replacing profile options, and wrong shapes refused."""

from render_local import LocalCluster


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

    (tmp_path / "code" / "LLaMA-Factory" / "src").mkdir(parents=True)
    (tmp_path / "code" / "LLaMA-Factory" / "src" / "train.py").write_text("")
    # the GPU example with the rendered DeepSpeed config
    p = c.run(roles=["train_args"], extra={
        "train_args_entrypoint": f"{tmp_path}/code/lora_zero3_train.py",
        "train_args_options": {"--output-dir": "{{ train_args_output_dir }}",
                               "--deepspeed": "{{ train_args_deepspeed_config }}", "--save-steps": 5}})
    assert p.returncode == 0, p.stdout[-3000:]
    kv = _pairs(p.report["node3"]["train_args_argv"])
    assert kv == {"--output-dir": f"{tmp_path}/outputs", "--deepspeed": str(c.path("node3", "ds_config.json")),
                  "--save-steps": "5"}

    p = c.run(roles=["train_args"], extra={
        "train_args_profile": "llamafactory", "train_args_model_name_or_path": "/srv/shared/models/llama",
        "train_args_dataset": "alpaca_en", "train_args_save_steps": 50,
        "train_args_extra": ["--seed", "42", "--learning_rate=2e-4"]})
    assert p.returncode == 0, p.stdout[-3000:]
    facts = p.report["node2"]
    assert facts["train_args_entrypoint"] == f"{tmp_path}/code/LLaMA-Factory/src/train.py"
    argv = facts["train_args_argv"]
    kv = _pairs(argv)
    assert kv["--stage"] == "sft" and kv["--finetuning_type"] == "lora"
    assert kv["--lora_target"] == "q_proj,v_proj,k_proj,o_proj"
    assert kv["--deepspeed"] == str(c.path("node2", "ds_config.json"))
    assert kv["--output_dir"] == f"{tmp_path}/outputs" and kv["--save_only_model"] == "true"
    assert kv["--logging_dir"] == f"{tmp_path}/outputs/logs" and kv["--save_steps"] == "50"
    assert kv["--ddp_timeout"] == "1800" and kv["--model_name_or_path"] == "/srv/shared/models/llama"
    assert "--learning_rate" not in kv and argv[-3:] == ["--seed", "42", "--learning_rate=2e-4"]
    assert c.records(p, "train_args.entrypoint")["node2"]["status"] == "pass"


def test_wrong_shapes_stop(tmp_path):
    c = LocalCluster(tmp_path)
    p = c.run(roles=["train_args"], extra={"train_args_extra": "--seed 42"})
    assert p.returncode != 0 and "never one shell string" in p.stdout
    p = c.run(roles=["train_args"], extra={"train_args_profile": "llamafactory"})
    assert p.returncode != 0 and "needs train_args_model_name_or_path" in p.stdout
    p = c.run(roles=["train_args"], extra={"train_args_entrypoint": "train.py"})
    assert p.returncode != 0 and "absolute path" in p.stdout
