"""Checkpoint completeness and the janitor's plan/execute on real layouts (HF Trainer + ZeRO-3 + LoRA)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import load

from ansible_collections.trainyard.core.plugins.module_utils import checkpoints as ck

bt = load("tests/data/checkpoints/build_tree.py", "build_tree")
SCRIPT = Path(ck.__file__)

KEPT_NAMES = {"adapter_config.json", "adapter_model.safetensors", "README.md", "rng_state_0.pth",
              "rng_state_1.pth", "scheduler.pt", "trainer_state.json", "training_args.bin"}


def names(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def run(root, **kw):
    p = ck.plan(str(root), **kw)
    return p, ck.execute(p)


def test_fixture_listing_matches_the_shared_fixture():
    shared = Path("/work/shared/fixtures/checkpoints/hf-trainer-peft-lora-zero3-2ranks.txt")
    if shared.exists():
        assert shared.read_text() == bt.FIXTURE.read_text()
    assert len(bt.read_listing()) == 52


def test_real_layout_all_complete_prunes_older_keeps_newest_whole(tmp_path):
    root = bt.build_fixture_tree(tmp_path / "out")
    before = bt.tree_bytes(root)
    p, r = run(root)
    # checkpoint-6 is the newest: untouched. 2 and 4 lose global_step*, latest, the DeepSpeed helpers.
    assert {Path(d.checkpoint).name for d in p.deletions} == {"checkpoint-2", "checkpoint-4"}
    for n in (2, 4):
        assert names(root / f"checkpoint-{n}") == KEPT_NAMES
    assert "global_step6" in names(root / "checkpoint-6") and "latest" in names(root / "checkpoint-6")
    per_ckpt = 2 * 790405 + 2 * 35485 + 12 + 38580 + 2490
    assert r["freed"] == p.total_bytes == 2 * per_ckpt
    assert bt.tree_bytes(root) == before - 2 * per_ckpt
    assert r["errors"] == [] and r["dirs_removed"] == 2
    # Idempotent: a second pass finds nothing.
    p2, r2 = run(root)
    assert p2.deletions == [] and r2["freed"] == 0


def test_newest_incomplete_is_left_alone_and_latest_complete_kept_whole(tmp_path):
    root = tmp_path / "out"
    for s in (10, 20, 30):
        bt.write_checkpoint(root, s)
    bt.write_checkpoint(root, 40, complete=False)
    snapshot = {str(p): p.stat().st_size for p in (root / "checkpoint-40").rglob("*")}
    assert ck.latest_complete_checkpoint(str(root)) == str(root / "checkpoint-30")
    p, _ = run(root)
    assert {Path(d.checkpoint).name for d in p.deletions} == {"checkpoint-10", "checkpoint-20"}
    assert {k["path"] for k in p.kept_full} == {str(root / "checkpoint-30")}
    assert "global_step30" in names(root / "checkpoint-30")
    assert {str(p): p.stat().st_size for p in (root / "checkpoint-40").rglob("*")} == snapshot
    # Resume still points at a checkpoint that has its DeepSpeed state.
    assert (Path(ck.latest_complete_checkpoint(str(root))) / "global_step30").is_dir()


def test_keep_full_latest_off_prunes_latest_complete_but_never_newest(tmp_path):
    root = tmp_path / "out"
    for s in (10, 20):
        bt.write_checkpoint(root, s)
    bt.write_checkpoint(root, 30, complete=False)
    p, _ = run(root, keep_full_latest=False)
    assert {Path(d.checkpoint).name for d in p.deletions} == {"checkpoint-10", "checkpoint-20"}
    assert "global_step30" in names(root / "checkpoint-30")


def test_incomplete_older_checkpoint_is_not_touched_in_marker_mode(tmp_path):
    root = tmp_path / "out"
    bt.write_checkpoint(root, 10, complete=False)
    bt.write_checkpoint(root, 20)
    bt.write_checkpoint(root, 30)
    p, _ = run(root)
    # 30 is newest and latest complete; 20 is complete and older: pruned; 10 has no marker: left alone.
    assert {Path(d.checkpoint).name for d in p.deletions} == {"checkpoint-20"}
    assert "global_step10" in names(root / "checkpoint-10")
    assert "global_step20" not in names(root / "checkpoint-20")


def test_marker_must_be_a_regular_parseable_file(tmp_path):
    root = tmp_path / "out"
    bt.write_checkpoint(root, 10)
    c20 = bt.write_checkpoint(root, 20, complete=False)
    (c20 / "trainer_state.json").write_text('{"global_step": 2')  # torn write
    assert ck.latest_complete_checkpoint(str(root)) == str(root / "checkpoint-10")
    (c20 / "trainer_state.json").unlink()
    (c20 / "trainer_state.json").symlink_to(root / "checkpoint-10" / "trainer_state.json")
    assert ck.latest_complete_checkpoint(str(root)) == str(root / "checkpoint-10")
    assert ck.latest_complete_checkpoint(str(tmp_path / "missing")) is None
    empty = tmp_path / "empty"
    bt.write_checkpoint(empty, 5, complete=False)
    assert ck.latest_complete_checkpoint(str(empty)) is None


def test_symlinks_out_of_root_are_never_followed(tmp_path):
    root, outside = tmp_path / "out", tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "global_step99").mkdir()
    victim = outside / "global_step99" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    victim.write_bytes(b"x" * 1000)
    (outside / "optimizer.pt").write_bytes(b"y" * 1000)
    outside_ck = bt.write_checkpoint(outside, 1)
    for s in (10, 20, 30):
        bt.write_checkpoint(root, s)
    c10 = root / "checkpoint-10"
    (c10 / "global_step_link").symlink_to(outside / "global_step99")
    (c10 / "global_step99").symlink_to(outside / "global_step99")
    (c10 / "optimizer.pt").symlink_to(outside / "optimizer.pt")
    (root / "checkpoint-5").symlink_to(outside_ck)  # a symlinked checkpoint directory: ignored
    p, r = run(root)
    assert all(str(d.path).startswith(str(root) + "/") for d in p.deletions)
    assert victim.stat().st_size == 1000 and (outside / "optimizer.pt").stat().st_size == 1000
    assert (outside_ck / "global_step1").is_dir()
    assert (c10 / "optimizer.pt").is_symlink() and (c10 / "global_step99").is_symlink()
    assert r["errors"] == []


def test_directory_swapped_for_a_symlink_after_planning_is_refused(tmp_path):
    root, outside = tmp_path / "out", tmp_path / "elsewhere"
    for s in (10, 20):
        bt.write_checkpoint(root, s)
    p = ck.plan(str(root))
    assert p.deletions
    # Between plan and execute, global_step10 becomes a symlink to a directory with the same file names.
    gs = root / "checkpoint-10" / "global_step10"
    outside.mkdir()
    for f in gs.iterdir():
        (outside / f.name).write_bytes(b"precious")
    for f in gs.iterdir():
        f.unlink()
    gs.rmdir()
    gs.symlink_to(outside)
    r = ck.execute(p)
    assert all((outside / f).read_bytes() == b"precious" for f in os.listdir(outside))
    assert len(r["errors"]) == 4  # the four partition files, refused (ELOOP/ENOTDIR), not followed
    assert gs.is_symlink()


def test_keep_patterns_and_size_floor(tmp_path):
    root = tmp_path / "out"
    for s in (10, 20, 30):
        bt.write_checkpoint(root, s)
    p = ck.plan(str(root), keep=["*model_states.pt"], min_size=1000)
    rels = {os.path.relpath(d.path, root) for d in p.deletions}
    assert rels == {f"checkpoint-{s}/global_step{s}/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
                    for s in (10, 20) for r in (0, 1)} | {f"checkpoint-{s}/zero_to_fp32.py" for s in (10, 20)} \
        | {f"checkpoint-{s}/zero_to_torch.py" for s in (10, 20)}
    # A keep pattern on a path relative to the checkpoint.
    p = ck.plan(str(root), keep=["global_step*/*"])
    assert {Path(d.path).name for d in p.deletions} == {"latest", "zero_to_fp32.py", "zero_to_torch.py"}


def test_full_model_shards_and_optimizer_deleted_adapters_and_tokenizer_kept(tmp_path):
    root = tmp_path / "out"
    for s in (1, 2):
        c = root / f"checkpoint-{s}"
        c.mkdir(parents=True)
        for n in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                  "model.safetensors.index.json", "optimizer.pt", "pytorch_model.bin", "adapter_model.safetensors",
                  "adapter_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                  "tokenizer.model", "config.json", "notes.txt", "scaler.pt"):
            (c / n).write_bytes(b"z" * 64)
        (c / "extra_adapter").mkdir()
        (c / "extra_adapter" / "adapter_model.safetensors").write_bytes(b"a" * 64)
        (c / "extra_adapter" / "model.safetensors").write_bytes(b"a" * 64)
        (c / "trainer_state.json").write_text("{}")
    p, r = run(root)
    assert {Path(d.path).name for d in p.deletions} == {
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "optimizer.pt", "pytorch_model.bin"}
    assert {Path(d.checkpoint).name for d in p.deletions} == {"checkpoint-1"}
    assert names(root / "checkpoint-1") == {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json",
                                            "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                                            "config.json", "notes.txt", "scaler.pt", "extra_adapter",
                                            "trainer_state.json"}
    assert names(root / "checkpoint-1" / "extra_adapter") == {"adapter_model.safetensors", "model.safetensors"}


def test_best_model_checkpoint_is_kept_whole(tmp_path):
    root = tmp_path / "out"
    for s in (10, 20, 30, 40):
        bt.write_checkpoint(root, s)
    (root / "checkpoint-40" / "trainer_state.json").write_text(
        json.dumps({"global_step": 40, "best_model_checkpoint": str(root / "checkpoint-20")}))
    p = ck.plan(str(root))
    assert {Path(d.checkpoint).name for d in p.deletions} == {"checkpoint-10", "checkpoint-30"}
    assert {(Path(k["path"]).name, k["why"]) for k in p.kept_full} == {("checkpoint-20", "best_model_checkpoint")}


def test_odd_names_and_nested_runs(tmp_path):
    root = tmp_path / "out"
    for odd in ("checkpoint-abc", "tmp-checkpoint-50", "checkpoint-", "checkpoint-1x", "checkpoint--3"):
        bt.write_checkpoint(root / "odd", 1).rename(root / odd)
    for s in (10, 20):
        bt.write_checkpoint(root, s)
    for s in (1, 2, 3):
        bt.write_checkpoint(root / "run-0", s)
    p = ck.plan(str(root))
    assert {os.path.relpath(d.checkpoint, root) for d in p.deletions} == {"checkpoint-10", "run-0/checkpoint-1",
                                                                            "run-0/checkpoint-2"}
    assert ck.latest_complete_checkpoint(str(root)) == str(root / "checkpoint-20")
    # Leading zeros: numeric order, not text order.
    bt.write_checkpoint(root, 100)
    (root / "checkpoint-100").rename(root / "checkpoint-0100")
    assert ck.latest_complete_checkpoint(str(root)) == str(root / "checkpoint-0100")


def test_worker_node_without_markers_prunes_superseded_in_that_mode_only(tmp_path):
    # Non-head node of a node-local run: checkpoint-N/ holds only this node's ZeRO partitions.
    root = tmp_path / "out"
    for s in (10, 20, 30):
        gs = root / f"checkpoint-{s}" / f"global_step{s}"
        gs.mkdir(parents=True)
        for r in (2, 3):
            (gs / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"o" * 500)
            (gs / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt").write_bytes(b"m" * 50)
    assert ck.plan(str(root)).deletions == []
    p, r = run(root, completion="marker_or_superseded")
    # 30 newest (in progress as far as this node knows), 20 latest superseded (kept whole), 10 pruned.
    assert {Path(d.checkpoint).name for d in p.deletions} == {"checkpoint-10"}
    assert not (root / "checkpoint-10" / "global_step10").exists()
    assert (root / "checkpoint-20" / "global_step20").is_dir()
    assert r["freed"] == 1100
    with pytest.raises(ValueError):
        ck.plan(str(root), completion="whenever")


def test_cli_dry_run_lists_sizes_and_deletes_nothing_then_real_run_logs_bytes(tmp_path):
    root = bt.build_fixture_tree(tmp_path / "out")
    before = bt.tree_bytes(root)
    log = tmp_path / "janitor.log"
    out = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--dry-run", "--log", str(log)],
                         capture_output=True, text=True, check=True).stdout
    assert "would delete         790405 " in out and "dry run: 14 files" in out
    assert bt.tree_bytes(root) == before and not log.exists()
    out = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--log", str(log), "--json"],
                         capture_output=True, text=True, check=True).stdout
    res = json.loads(out)
    assert res["deleted"] == 14 and res["freed"] == before - bt.tree_bytes(root) > 0
    lines = log.read_text().splitlines()
    deleted = [ln for ln in lines if " deleted " in ln]
    assert len(deleted) == 14
    assert sum(int(ln.split(" deleted ")[1].split()[0]) for ln in deleted) == res["freed"]
    assert any(f"pass freed {res['freed']} bytes" in ln for ln in lines)


def test_cli_rejects_bad_arguments(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path), "--min-size", "-1"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 2 and "--root" in r.stderr


def test_cli_loop_prunes_while_training_and_stops_on_sigterm(tmp_path):
    root = tmp_path / "out"
    root.mkdir()
    log = tmp_path / "janitor.log"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--root", str(root), "--loop", "--interval", "0.2",
                             "--log", str(log)])
    try:
        for s in (10, 20, 30):
            bt.write_checkpoint(root, s)
        bt.write_checkpoint(root, 40, complete=False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (root / "checkpoint-20" / "global_step20").exists():
            time.sleep(0.1)
        assert not (root / "checkpoint-10" / "global_step10").exists()
        assert not (root / "checkpoint-20" / "global_step20").exists()
        assert (root / "checkpoint-30" / "global_step30").exists()
        assert (root / "checkpoint-40" / "global_step40").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
    assert rc == 0
    text = log.read_text()
    assert "janitor started" in text and "janitor stopped" in text and " deleted " in text


def test_execute_refuses_paths_outside_root(tmp_path):
    root = tmp_path / "out"
    root.mkdir()
    (tmp_path / "victim").write_bytes(b"v" * 10)
    p = ck.Plan(root=str(root), deletions=[ck.Deletion(path=str(tmp_path / "victim"), size=10, checkpoint="x",
                                                       reason="forged"),
                                           ck.Deletion(path=str(root / ".." / "victim"), size=10, checkpoint="x",
                                                       reason="forged")])
    r = ck.execute(p)
    assert (tmp_path / "victim").exists() and len(r["errors"]) == 2 and r["freed"] == 0


def test_deepspeed_latest_is_written_on_a_node_that_has_the_shards_but_no_tag(tmp_path):
    """DeepSpeed writes `latest` on global rank 0's node only; a worker's copy gets it from the launch."""
    cp = tmp_path / "checkpoint-10"
    (cp / "global_step10").mkdir(parents=True)
    (cp / "global_step10" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"x")
    assert ck.ensure_deepspeed_latest(str(cp)) == "global_step10"
    assert (cp / "latest").read_text() == "global_step10"
    assert ck.ensure_deepspeed_latest(str(cp)) is None  # present now: left as it is
    assert not list(cp.glob("*.trainyard-tmp"))


def test_deepspeed_latest_is_never_guessed_or_overwritten(tmp_path):
    two = tmp_path / "two"
    (two / "global_step10").mkdir(parents=True)
    (two / "global_step20").mkdir()
    assert ck.ensure_deepspeed_latest(str(two)) is None and not (two / "latest").exists()
    none = tmp_path / "none"
    none.mkdir()
    (none / "adapter_model.safetensors").write_bytes(b"x")
    assert ck.ensure_deepspeed_latest(str(none)) is None and not (none / "latest").exists()
    own = tmp_path / "own"
    (own / "global_step30").mkdir(parents=True)
    (own / "latest").write_text("global_step7")
    assert ck.ensure_deepspeed_latest(str(own)) is None and (own / "latest").read_text() == "global_step7"
    link = tmp_path / "link"
    (link / "global_step5").mkdir(parents=True)
    (link / "latest").symlink_to(tmp_path / "elsewhere")
    assert ck.ensure_deepspeed_latest(str(link)) is None and not (tmp_path / "elsewhere").exists()
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "global_step9").write_text("a file, not a tag directory")
    assert ck.ensure_deepspeed_latest(str(fake)) is None
    assert ck.ensure_deepspeed_latest(str(tmp_path / "missing")) is None
