"""The janitor and the resume helpers against a job that cannot be trusted: trainer states of any realistic
size, symlinks planted where a host-side write lands, directories swapped for symlinks while the janitor
runs, paths handed over as data (a config file) rather than on a command line."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import load

from ansible_collections.trainyard.core.plugins.module_utils import checkpoints as ck

bt = load("tests/data/checkpoints/build_tree.py", "build_tree")
SCRIPT = Path(ck.__file__)


def trainer_state(step: int, entries: int, best: str | None) -> str:
    """What HF Trainer writes (json.dumps(indent=2, sort_keys=True)) after ``entries`` logged steps."""
    history = [{"epoch": i / 1000, "grad_norm": 0.123456789 + i, "learning_rate": 1.9999e-05,
                "loss": 2.34567 - i / 1e6, "step": i + 1, "note": "a \"quoted\" {brace} [bracket] \\ text"}
               for i in range(entries)]
    return json.dumps({"best_global_step": None, "best_metric": None, "best_model_checkpoint": best,
                       "epoch": 1.0, "eval_steps": 500, "global_step": step, "is_hyper_param_search": False,
                       "is_local_process_zero": True, "is_world_process_zero": True, "log_history": history,
                       "logging_steps": 1, "max_steps": entries, "num_train_epochs": 1,
                       "save_steps": 10, "stateful_callbacks": {"TrainerControl": {"args": {"should_save": True}}},
                       "total_flos": 1.5e18, "train_batch_size": 4, "trial_name": None, "trial_params": None},
                      indent=2, sort_keys=True)


# --------------------------------------------------------------------------- trainer_state.json of any size

def test_a_long_runs_trainer_state_marks_its_checkpoint_complete(tmp_path):
    """120k logged steps (about 30 MiB): complete, the resume point, and its best checkpoint kept whole."""
    root = tmp_path / "out"
    for s in (10, 20, 30):
        bt.write_checkpoint(root, s)
    text = trainer_state(30, 120_000, str(root / "checkpoint-10"))
    assert len(text) > 16 * 1024 * 1024
    (root / "checkpoint-30" / "trainer_state.json").write_text(text)
    assert ck.has_marker(str(root / "checkpoint-30"))
    assert ck.latest_complete_checkpoint(str(root)) == str(root / "checkpoint-30")
    assert ck.read_trainer_state(str(root / "checkpoint-30" / "trainer_state.json")) == {
        "global_step": 30, "best_model_checkpoint": str(root / "checkpoint-10")}
    p = ck.plan(str(root), completion="marker")
    assert {k["why"] for k in p.kept_full} >= {"best_model_checkpoint"}
    assert not [d for d in p.deletions if "checkpoint-10" in d.path]
    p.close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.sampled_from([0, 1, 7, 100_000, 130_000]), cut=st.floats(0.0, 0.9999),
       best=st.sampled_from([None, "checkpoint-10", "/o/run/checkpoint-20/"]), torn=st.booleans())
def test_trainer_state_read_is_exact_on_whole_files_and_refuses_every_torn_one(tmp_path, entries, cut, best, torn):
    text = trainer_state(40, entries, best)
    path = tmp_path / "trainer_state.json"
    if torn:
        n = int(len(text.rstrip()) * cut)
        path.write_text(text[:n])
        try:
            ck.read_trainer_state(str(path))
        except ValueError:
            pass
        else:
            raise AssertionError(f"a file cut at {n} of {len(text)} characters was read as complete")
    else:
        path.write_text(text)
        assert ck.read_trainer_state(str(path)) == {"global_step": 40, "best_model_checkpoint": best}


def test_trainer_state_past_the_bound_or_not_an_object_is_not_a_marker(tmp_path):
    p = tmp_path / "trainer_state.json"
    for body in ("[1, 2]", "{\"global_step\": 1} trailing", "{\"global_step\": 1,}", "{\"a\" 1}", "{"):
        p.write_text(body)
        try:
            ck.read_trainer_state(str(p))
        except ValueError:
            continue
        raise AssertionError(body)
    with open(p, "w") as f:
        f.write("{\"global_step\": 1}")
        f.truncate(ck.TRAINER_STATE_MAX_BYTES + 1)
    try:
        ck.read_trainer_state(str(p))
    except ValueError as e:
        assert "bytes" in str(e)
    else:
        raise AssertionError("no bound")


# --------------------------------------------------------------------------- host-side writes never follow links

def test_latest_tag_write_does_not_follow_a_planted_temp_symlink(tmp_path):
    root = tmp_path / "out"
    c = bt.write_checkpoint(root, 10)
    (c / "latest").unlink()
    victim = tmp_path / "etc-passwd"
    victim.write_text("root:x:0:0\n")
    for name in ("latest.trainyard-tmp", ".latest.trainyard-tmp"):
        (c / name).symlink_to(victim)
    assert ck.ensure_deepspeed_latest(str(c)) == "global_step10"
    assert victim.read_text() == "root:x:0:0\n"
    assert (c / "latest").read_text() == "global_step10" and not (c / "latest").is_symlink()
    assert sorted(p.name for p in c.iterdir() if "trainyard" in p.name) == [".latest.trainyard-tmp",
                                                                             "latest.trainyard-tmp"]


def test_latest_tag_is_not_written_through_a_symlinked_checkpoint(tmp_path):
    root, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    c = bt.write_checkpoint(elsewhere, 10)
    (c / "latest").unlink()
    root.mkdir()
    (root / "checkpoint-10").symlink_to(c)
    assert ck.ensure_deepspeed_latest(str(root / "checkpoint-10")) is None
    assert not (c / "latest").exists()


def test_janitor_log_that_is_a_symlink_is_refused_not_followed(tmp_path):
    root = tmp_path / "out"
    for s in (10, 20, 30):
        bt.write_checkpoint(root, s)
    victim = tmp_path / "shadow"
    victim.write_text("keep me\n")
    log = tmp_path / "janitor.log"
    log.symlink_to(victim)
    r = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--log", str(log)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "janitor.log" in r.stderr and "Traceback" not in r.stderr
    assert victim.read_text() == "keep me\n"
    assert (root / "checkpoint-10" / "global_step10").is_dir()  # nothing deleted without a log


# --------------------------------------------------------------------------- the root is held from plan to delete

def outside_copy(root: Path, outside: Path) -> None:
    shutil.copytree(root, outside, symlinks=True)


def tree_snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.is_symlink(), p.stat(follow_symlinks=False).st_size)
            for p in sorted(d.rglob("*"))}


def test_root_swapped_for_a_symlink_between_plan_and_delete_is_not_followed(tmp_path):
    root, outside = tmp_path / "out", tmp_path / "precious"
    for s in (10, 20, 30):
        bt.write_checkpoint(root, s)
    outside_copy(root, outside)
    before = tree_snapshot(outside)
    p = ck.plan(str(root))
    assert p.deletions
    root.rename(tmp_path / "out.moved")
    root.symlink_to(outside)
    r = ck.execute(p)
    assert tree_snapshot(outside) == before
    assert r["deleted"] == len(p.deletions)  # the held directory (now out.moved) was cleaned
    assert not (tmp_path / "out.moved" / "checkpoint-10" / "global_step10").exists()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), completion=st.sampled_from(ck.COMPLETION_MODES))
def test_janitor_never_touches_anything_outside_its_root_under_concurrent_symlink_swaps(tmp_path_factory, seed,
                                                                                         completion):
    base = tmp_path_factory.mktemp("swap")
    root, outside = base / "out", base / "outside"
    for s in (10, 20, 30, 40):
        bt.write_checkpoint(root / "run", s)
    outside_copy(root, outside)
    before = tree_snapshot(outside)
    rng = random.Random(seed)
    # Every directory the job can swap: all below the root (the root's own parent is not the job's; a root
    # swapped between plan and delete is the test above).
    dirs = [p for p in sorted(root.rglob("*")) if p.is_dir()] + [root / "run"] * 5
    stop = threading.Event()

    def swapper():
        while not stop.is_set():
            d = rng.choice(dirs)
            rel = d.relative_to(root) if d != root else Path(".")
            target = outside / rel
            aside = d.with_name(d.name + ".aside")
            try:
                os.rename(d, aside)
                os.symlink(target, d)
                os.sched_yield()
                os.unlink(d)
                os.rename(aside, d)
            except OSError:
                pass

    t = threading.Thread(target=swapper, daemon=True)
    t.start()
    try:
        for _ in range(5):
            p = ck.plan(str(root), completion=completion)
            ck.execute(p)
    finally:
        stop.set()
        t.join()
    assert tree_snapshot(outside) == before


# --------------------------------------------------------------------------- paths as data

def test_janitor_takes_its_paths_from_a_config_file(tmp_path):
    root = tmp_path / "out 100% done; $(touch pwned)"
    for s in (10, 20, 30):
        bt.write_checkpoint(root, s)
    state = tmp_path / "state %i"
    state.mkdir()
    cfg = state / "janitor.json"
    cfg.write_text(json.dumps({"root": str(root), "log": str(state / "janitor.log"), "min_size": 0,
                               "completion": "marker", "keep_full_latest": True, "keep": ["*.keepme"],
                               "interval": 60, "max_depth": 4}))
    r = subprocess.run([sys.executable, str(SCRIPT), "--config", str(cfg)], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (root / "checkpoint-10" / "global_step10").exists()
    assert (root / "checkpoint-30" / "global_step30").is_dir()
    assert "deleted" in (state / "janitor.log").read_text()
    assert not (tmp_path / "pwned").exists()


def test_janitor_config_errors_are_one_line(tmp_path):
    cfg = tmp_path / "janitor.json"
    for body, word in (("{", "janitor.json"), ('{"root": 3}', "root"), ('{"roots": "/x"}', "roots"),
                       ('{"root": "/x", "min_size": -1}', "min_size")):
        cfg.write_text(body)
        r = subprocess.run([sys.executable, str(SCRIPT), "--config", str(cfg)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and word in r.stderr and "Traceback" not in r.stderr, (body, r.stderr)
