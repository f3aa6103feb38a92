"""The checkpoint conversion of playbooks/recover.yml: the command the new head runs and the resume line
(plugin_utils/recover_convert.py, through filter_plugins/recover_shards.py), and the script the head runs with the
job's Python (roles/recover/files/recover_ckpt.py), passed with -c as roles/recover/tasks/recover_convert.yml does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, load

from ansible_collections.trainyard.core.plugins.plugin_utils import recover_convert as rcv

flt = load("filter_plugins/recover_shards.py", "recover_filters").FilterModule().filters()
SCRIPT = REPO / "roles/recover/files/recover_ckpt.py"
ck = load("roles/recover/files/recover_ckpt.py", "recover_ckpt")

DS = {"checkpoint": "/out/job/checkpoint-40", "name": "checkpoint-40",
      "shards": {"format": "deepspeed", "tag": "global_step40", "world_size": 0}}
EX = {"checkpoint": "/out/job/step-40", "name": "step-40", "shards": {"format": "example", "world_size": 4}}


def test_the_filters_are_these_functions():
    assert flt["trainyard_recover_convert_command"] is rcv.convert_command
    assert flt["trainyard_recover_resume_line"] is rcv.resume_line


def test_deepspeed_converts_its_tag_with_ds_to_universal():
    assert rcv.convert_command(DS, "python3", "/srv/code") == {
        "argv": ["python3", "-m", "deepspeed.checkpoint.ds_to_universal",
                 "--input_folder", "/out/job/checkpoint-40/global_step40",
                 "--output_folder", "/out/job/checkpoint-40/global_step40_universal"],
        "creates": "/out/job/checkpoint-40/global_step40_universal"}


def test_the_example_converts_itself():
    assert rcv.convert_command(EX, "/opt/venv/bin/python", "/srv/code") == {
        "argv": ["/opt/venv/bin/python", "/srv/code/ddp_train.py", "--convert", "/out/job/step-40"],
        "creates": "/out/job/step-40/universal/trainer_state.json"}


def test_resume_line_says_what_the_survivors_resume_from():
    assert rcv.resume_line(DS, "node2", "full", True, 4, 3) == (
        "Resume: /out/job/checkpoint-40 converted from world size 4 to 3")
    assert rcv.resume_line(DS, "node2", "full", False, 0, 3) == "Resume: /out/job/checkpoint-40"
    assert rcv.resume_line(DS, "node2", "weights", False, 0, 3, {"detail": "weights only: the adapter"}) == (
        "Resume: /out/job/checkpoint-40 weights only: the adapter")
    assert rcv.resume_line({}, "node2", "full") == (
        "Resume: no complete checkpoint on node2: the job starts from step 0")
    assert rcv.resume_line({}, "node3", "weights", False, 0, 2, {}) == (
        "Resume: no complete checkpoint on node3: the job starts from step 0")


def test_unfuse_turns_every_fused_group_off_and_counts_them():
    state = {"param_groups": [{"fused": True}, {"fused": False}, {}],
             "optimizer_state_dict": {"param_groups": [{"fused": True}]}}
    assert ck.unfuse(state) == 2
    assert [g.get("fused") for g in state["param_groups"]] == [False, False, None]
    assert state["optimizer_state_dict"]["param_groups"][0]["fused"] is False
    assert ck.unfuse(state) == 0 and ck.unfuse({}) == 0
    assert ck.unfuse_message(2) == "unfused 2 parameter groups" and ck.unfuse_message(0) == "not fused"


def test_saved_world_reads_dp_world_size():
    assert ck.saved_world({"dp_world_size": "4"}) == 4
    with pytest.raises(KeyError):
        ck.saved_world({})


def run_script(*args):
    # As the task runs it: the file's text with -c (sys.argv[0] is '-c').
    return subprocess.run([sys.executable, "-c", SCRIPT.read_text(encoding="utf-8"), *args],
                          capture_output=True, text=True, timeout=120)


def test_the_script_through_python_c_with_torch(tmp_path):
    torch = pytest.importorskip("torch")
    states = tmp_path / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    torch.save({"dp_world_size": 4, "module": {}}, states)
    out = run_script("world", str(states))
    assert (out.returncode, out.stdout.strip()) == (0, "4"), out.stderr

    opt = tmp_path / "optimizer_state.pt"
    torch.save({"param_groups": [{"lr": 1e-4, "fused": True}, {"lr": 1e-4, "fused": True}]}, opt)
    out = run_script("unfuse", str(opt))
    assert (out.returncode, out.stdout.strip()) == (0, "unfused 2 parameter groups"), out.stderr
    assert [g["fused"] for g in torch.load(opt, weights_only=False)["param_groups"]] == [False, False]
    before = opt.stat().st_mtime_ns
    out = run_script("unfuse", str(opt))
    assert out.stdout.strip() == "not fused" and opt.stat().st_mtime_ns == before


def test_the_script_refuses_an_unknown_command():
    out = run_script("convert", "/x")
    assert out.returncode == 2 and "usage: recover_ckpt.py world|unfuse PATH" in out.stderr


def test_recover_record_is_the_plan_with_the_resume():
    plan = {"summary": "node3 dropped", "dropped": [{"host": "node3"}], "survivors": ["node1", "node2"],
            "rank_map": {"node1": 0, "node2": 1}, "old_rank_map": {"node1": 0, "node2": 1, "node3": 2},
            "head": "node1", "head_moved": False, "world_size": 2, "world_size_before": 3, "models": {"x": 1}}
    rec = rcv.recover_record(plan, "full", "/out/ck", True, {"how": "universal"})
    assert rec == {"summary": "node3 dropped", "dropped": [{"host": "node3"}], "survivors": ["node1", "node2"],
                   "rank_map": {"node1": 0, "node2": 1}, "old_rank_map": {"node1": 0, "node2": 1, "node3": 2},
                   "head": "node1", "head_moved": False, "world_size": 2, "world_size_before": 3,
                   "resume_mode": "full", "checkpoint": "/out/ck", "converted": True, "resume": {"how": "universal"}}
    assert flt["trainyard_recover_record"] is rcv.recover_record


def test_the_script_survives_the_command_module():
    # ansible.builtin.command expands $VARS and a leading ~ in every argument (expand_argument_vars): the text the
    # task passes with -c must hold neither.
    text = SCRIPT.read_text(encoding="utf-8")
    assert "$" not in text and not text.startswith("~")
