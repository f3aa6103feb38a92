"""Recover on the survivors: who is dropped, the new ranks and head, which shards survive (module_utils/recover.py,
filter_plugins/recover_shards.py, action_plugins/recover_plan.py, library/checkpoint_shards.py)."""

from __future__ import annotations

import json

import pytest

from helpers import REPO, adhoc, load

from ansible_collections.trainyard.core.plugins.module_utils import recover as rc

bt = load("tests/data/checkpoints/build_tree.py", "build_tree")
flt = load("filter_plugins/recover_shards.py", "recover_filters")

HOSTS = ["n1", "n2", "n3", "n4"]
ADDR = {h: "10.0.0.%d" % i for i, h in enumerate(HOSTS, 1)}


def test_nothing_dropped_keeps_full_size_and_ranks():
    p = rc.plan_survivors(HOSTS, {}, {}, 1, 8, 39500, ADDR)
    assert p["survivors"] == HOSTS and p["dropped"] == [] and p["world_size"] == 32
    assert p["summary"].startswith("all 4 nodes healthy")
    assert p["models"]["n3"]["node_rank"] == 2 and p["models"]["n3"]["head"] == "n1"


def test_lost_worker_ranks_stay_contiguous_in_old_order():
    p = rc.plan_survivors(HOSTS, {"n2": "ssh: connect timed out"}, {}, 2, 8, 39500, ADDR)
    assert p["survivors"] == ["n1", "n3", "n4"]
    assert p["rank_map"] == {"n1": 0, "n3": 1, "n4": 2}
    assert {m["nnodes"] for m in p["models"].values()} == {3}
    assert p["models"]["n4"]["world_size"] == 24 and p["models"]["n4"]["hosts_by_rank"] == ["n1", "n3", "n4"]
    assert p["dropped"] == [{"host": "n2", "reason": "unreachable: ssh: connect timed out", "old_rank": 1,
                             "why": "unreachable", "detail": "ssh: connect timed out", "checks": []}]
    assert "dropped n2 (unreachable: ssh: connect timed out)" in p["summary"] and "world size 32 -> 24" in p["summary"]
    assert not p["head_moved"]


def test_lost_head_moves_head_and_master_address():
    p = rc.plan_survivors(HOSTS, {"n1": "no route to host"}, {"n3": ["nvidia_driver.xid: Xid 79"]}, 2, 1, 39500,
                          ADDR, master_addr="10.0.0.1")
    assert p["survivors"] == ["n2", "n4"] and p["head"] == "n2" and p["head_moved"]
    assert all(m["master_addr"] == "10.0.0.2" for m in p["models"].values())
    assert p["models"]["n4"]["node_rank"] == 1 and p["models"]["n2"]["data_address"] == "10.0.0.2"
    assert "head n2 (moved from n1)" in p["summary"]
    assert "n3 (failed preflight: nvidia_driver.xid: Xid 79)" in p["summary"]


def test_master_addr_kept_while_the_head_lives():
    p = rc.plan_survivors(HOSTS, {"n4": "x"}, {}, 1, 1, 39500, ADDR, master_addr="head.example")
    assert p["models"]["n1"]["master_addr"] == "head.example"


def test_a_node_both_unreachable_and_failed_is_dropped_once():
    p = rc.plan_survivors(HOSTS, {"n2": "gone"}, {"n2": ["x: y"]}, 1)
    assert [d["host"] for d in p["dropped"]] == ["n2"] and p["dropped"][0]["reason"].startswith("unreachable")


def test_never_below_min_nodes_names_each_node_and_the_fix():
    with pytest.raises(rc.RecoverError) as e:
        rc.plan_survivors(HOSTS, {"n2": "gone"}, {"n3": ["network.path_mtu: drops 9000"]}, 3)
    msg = str(e.value)
    assert "2 of 4 nodes are healthy and cluster_min_nodes is 3" in msg
    assert "n2 (unreachable: gone)" in msg and "n3 (failed preflight: network.path_mtu: drops 9000)" in msg
    assert "-e cluster_min_nodes=2" in msg and "\n" not in msg


@pytest.mark.parametrize("bad", [0, 5, True, "2"])
def test_min_nodes_out_of_range_is_one_line(bad):
    with pytest.raises(rc.RecoverError, match=r"^Stop if cluster_min_nodes is outside 1\.\.4"):
        rc.plan_survivors(HOSTS, {}, {}, bad)


def test_failed_checks_keeps_this_runs_failures_only():
    recs = [{"check": "a.b", "status": "fail", "detail": "bad\nmore", "run_id": "r2"},
            {"check": "a.c", "status": "pass", "run_id": "r2"},
            {"check": "a.d", "status": "fail", "detail": "old", "run_id": "r1"},
            {"check": "a.e", "status": "warn", "run_id": "r2"}]
    assert rc.failed_checks(recs, "r2") == ["a.b: bad"]
    # the key preflight_check writes: a failure of an earlier run kept by the fact cache does not drop the node
    recs = [{"check": "a.b", "status": "fail", "detail": "old", "run": "r1"},
            {"check": "a.c", "status": "fail", "detail": "now", "run": "r2"}]
    assert rc.failed_checks(recs, "r2") == ["a.c: now"]


def test_shard_names():
    assert rc.shard_ranks("bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt") == ("deepspeed", 3, None)
    assert rc.shard_ranks("zero_pp_rank_12_mp_rank_00_model_states.pt") == ("deepspeed", 12, None)
    assert rc.shard_ranks("shard-rank2-of-3.pt") == ("example", 2, 3)
    assert rc.shard_ranks("pytorch_model.bin") is None and rc.shard_ranks("shard-rank2-of-3.pt.tmp") is None


def test_list_shards_of_a_real_zero3_layout(tmp_path):
    ckpt = bt.write_checkpoint(tmp_path, 4)
    got = rc.list_shards(str(ckpt))
    assert got["format"] == "deepspeed" and got["ranks"] == [0, 1] and got["tag"] == "global_step4"
    assert got["complete"] and not got["universal"]
    assert sorted(got["files"][1]) == ["global_step4/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
                                       "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt"]
    (ckpt / "global_step4_universal").mkdir()
    assert rc.list_shards(str(ckpt))["universal"]


def test_list_shards_of_the_example(tmp_path):
    ckpt = tmp_path / "checkpoint-10"
    ckpt.mkdir()
    for r in (0, 1):
        (ckpt / f"shard-rank{r}-of-3.pt").write_bytes(b"x")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 10, "world_size": 3}))
    got = rc.list_shards(str(ckpt))
    assert got["format"] == "example" and got["ranks"] == [0, 1] and got["world_size"] == 3 and got["complete"]
    assert rc.list_shards(str(tmp_path / "nope"))["ranks"] == []


def test_coverage_copies_from_survivors_and_names_the_missing():
    cov = rc.shard_coverage({"n2": [1, 2], "n3": [2, 0], "n4": [3]}, 4, "n2", prefer=["n3"])
    assert cov["on_head"] == [1, 2] and cov["copy"] == [{"rank": 0, "src": "n3"}, {"rank": 3, "src": "n4"}]
    assert cov["missing"] == []
    cov = rc.shard_coverage({"n2": [1]}, 3, "n2")
    assert cov["missing"] == [0, 2]


def test_missing_message_names_ranks_nodes_and_the_ways_on():
    msg = rc.missing_message("/o/checkpoint-20", [2, 3], 4, ["n1", "n2"], nproc_per_node=2)
    assert "rank(s) 2, 3 of 4" in msg and "saved on n2" in msg and "bring n2 back" in msg
    assert "-e launch_recover_resume=weights" in msg and "\n" not in msg


def test_filter_plans_copies_per_file_and_ignores_other_checkpoints():
    listing = {
        "n1": {"checkpoint": "/o/checkpoint-10", "name": "checkpoint-10",
               "shards": {"ranks": [0, 1], "world_size": 3, "files": {"0": ["shard-rank0-of-3.pt"],
                                                                       "1": ["shard-rank1-of-3.pt"]}}},
        "n2": {"checkpoint": "/o/checkpoint-10", "name": "checkpoint-10",
               "shards": {"ranks": [1, 2], "world_size": 3, "files": {"1": ["shard-rank1-of-3.pt"],
                                                                       "2": ["shard-rank2-of-3.pt"]}}},
        "n3": {"checkpoint": "/o/checkpoint-5", "name": "checkpoint-5",
               "shards": {"ranks": [0], "files": {"0": ["shard-rank0-of-3.pt"]}}},
    }
    plan = flt.shard_plan(listing, "n1", "checkpoint-10", 3, ["n1", "n2"], ["n1", "n2", "n3"])
    assert plan["missing"] == [] and flt.shard_sources(plan) == [{"src": "n2", "files": ["shard-rank2-of-3.pt"]}]
    # one pack per node the files come from
    two = {"copy": [{"rank": 1, "src": "n2", "files": ["a1", "b1"]}, {"rank": 2, "src": "n3", "files": ["a2"]},
                    {"rank": 3, "src": "n2", "files": ["a3"]}]}
    assert flt.shard_sources(two) == [{"src": "n2", "files": ["a1", "b1", "a3"]}, {"src": "n3", "files": ["a2"]}]
    del listing["n2"]
    plan = flt.shard_plan(listing, "n1", "checkpoint-10", 3, ["n1"], ["n1", "n2", "n3"])
    assert plan["missing"] == [2] and "saved on n3" in plan["message"]


def test_checkpoint_shards_module_lists_the_latest_complete(tmp_path):
    bt.write_checkpoint(tmp_path, 2)
    bt.write_checkpoint(tmp_path, 4)
    bt.write_checkpoint(tmp_path, 6, complete=False)
    out = adhoc("checkpoint_shards", {"output_root": str(tmp_path)})
    assert out["name"] == "checkpoint-4" and out["step"] == 4 and out["shards"]["ranks"] == [0, 1]
    out = adhoc("checkpoint_shards", {"output_root": str(tmp_path), "checkpoint": "checkpoint-2"})
    assert out["step"] == 2
    out = adhoc("checkpoint_shards", {"output_root": str(tmp_path), "checkpoint": "../etc"})
    assert out.get("failed") and "checkpoint-N" in out["msg"]
    assert adhoc("checkpoint_shards", {"output_root": str(tmp_path / "none")})["checkpoint"] == ""


def test_recover_plan_action_fails_with_one_line(tmp_path):
    pb = tmp_path / "pb.yml"
    pb.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - recover_plan:\n        hosts_by_rank: [a, b, c]\n        unreachable: {c: gone}\n"
        "        records: {b: [{check: x.y, status: fail, detail: broken}]}\n        min_nodes: 2\n"
        "        model: {nproc_per_node: 1, master_port: 39500}\n")
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        str(pb)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout[-2000:]
    assert "1 of 3 nodes are healthy and cluster_min_nodes is 2" in r.stdout
    assert "b (failed preflight: x.y: broken), c (unreachable: gone)" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


# ---- bad input caught by the validation play, before any host is contacted
def _validate(**common):
    tv = load("tests/unit/plugin_utils/test_validation.py", "tv_for_recover")
    return tv.run(tv.three(**common))


def test_min_nodes_and_elastic_size_are_checked_before_any_host():
    assert _validate(cluster_min_nodes=2) == []
    assert _validate(launch_rdzv_backend="c10d", launch_nnodes_min=2) == []
    (line,) = _validate(cluster_min_nodes=4)
    assert line.startswith("Stop if cluster_min_nodes is outside 1..3") and "(cluster_min_nodes = 4)" in line
    (line,) = _validate(launch_nnodes_min=2)
    assert "launch_nnodes_min is set while launch_rdzv_backend is not c10d" in line and "launch_rdzv_backend: c10d" in line
    (line,) = _validate(launch_rdzv_backend="c10d", launch_nnodes_min=5)
    assert "launch_nnodes_min is outside 1..3" in line
    (line,) = _validate(launch_recover_resume="weight")
    assert "launch_recover_resume is not one of full, weights" in line and "'weights'?" in line


def test_elastic_mode_command_line():
    from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
    cmd = tr.build_command(4, 8, 0, "10.0.0.1", 39500, "train.py", rdzv_backend="c10d", min_nnodes=2)
    assert "--nnodes=2:4" in cmd and "--rdzv_backend=c10d" in cmd and not any(a.startswith("--node_rank") for a in cmd)
    assert "--nnodes=4" in tr.build_command(4, 8, 0, "10.0.0.1", 39500, "train.py")
    with pytest.raises(tr.LaunchError, match="needs rdzv_backend=c10d"):
        tr.build_command(4, 8, 0, "10.0.0.1", 39500, "train.py", min_nnodes=2)
    with pytest.raises(tr.LaunchError, match="outside 1..4"):
        tr.build_command(4, 8, 0, "10.0.0.1", 39500, "train.py", rdzv_backend="c10d", min_nnodes=5)


def test_filter_takes_the_saved_world_size_never_the_ranks_found():
    """A lost node's ranks must not vanish: with the world size read from the checkpoint, rank 2 is missing."""
    listing = {"n1": {"checkpoint": "/o/checkpoint-4", "name": "checkpoint-4",
                      "shards": {"ranks": [0, 1], "world_size": None,
                                 "files": {"0": ["global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt"],
                                           "1": ["global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt"]}}}}
    assert flt.shard_plan(listing, "n1", "checkpoint-4", 3, ["n1"], ["n1", "n2", "n3"])["missing"] == [2]
    assert flt.shard_plan(listing, "n1", "checkpoint-4", 2, ["n1"], ["n1", "n2"])["missing"] == []


def test_unreachable_reason_keeps_the_cause_only():
    why = ('Task failed: Data could not be sent to remote host "10.0.0.3". Make sure this host can be reached over '
           'ssh: ssh: connect to host 10.0.0.3 port 22: Connection timed out')
    p = rc.plan_survivors(["a", "b", "c"], {"c": why}, {}, 1)
    assert p["dropped"][0]["reason"] == "unreachable: ssh: connect to host 10.0.0.3 port 22: Connection timed out"


def test_list_shards_never_lists_a_symlink_the_job_planted(tmp_path):
    """Root copies the listed shards between nodes: a symlinked shard or tag directory is not a shard."""
    secret = tmp_path / "secret"
    secret.write_text("root only")
    ckpt = bt.write_checkpoint(tmp_path / "out", 4)
    tag = ckpt / "global_step4"
    shard = tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard.unlink()
    shard.symlink_to(secret)
    got = rc.list_shards(str(ckpt))
    assert got["files"][1] == ["global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt"]
    # the example's world size is read from trainer_state.json, never through a link
    ex = tmp_path / "ex" / "checkpoint-5"
    ex.mkdir(parents=True)
    (ex / "trainer_state.json").write_text('{"world_size": 3}')
    assert rc.list_shards(str(ex))["world_size"] == 3
    planted = tmp_path / "planted.json"
    planted.write_text('{"world_size": 7}')
    (ex / "trainer_state.json").unlink()
    (ex / "trainer_state.json").symlink_to(planted)
    assert rc.list_shards(str(ex))["world_size"] is None
    elsewhere = tmp_path / "elsewhere"
    tag.rename(elsewhere)
    tag.symlink_to(elsewhere)
    assert rc.list_shards(str(ckpt))["ranks"] == []
