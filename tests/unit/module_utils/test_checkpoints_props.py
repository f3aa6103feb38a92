"""Property tests: over random checkpoint trees the janitor never deletes outside the output root, never an
adapter file, never a symlink, and never touches the newest checkpoint of a run while it is incomplete
(nor, in marker mode, any incomplete checkpoint)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.trainyard.core.plugins.module_utils import checkpoints as ck

FILE_NAMES = ["adapter_model.safetensors", "adapter_config.json", "adapter_model.bin", "optimizer.pt",
              "model.safetensors", "model-00001-of-00002.safetensors", "pytorch_model.bin", "scheduler.pt",
              "rng_state_0.pth", "tokenizer.json", "latest", "zero_to_fp32.py", "training_args.bin",
              "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt",
              "mp_rank_00_model_states.pt", "notes.txt", "weird name.bin", "checkpoint-7"]
DIR_NAMES = ["global_step{n}", "global_step{n}", "lora_adapter", "sub", "checkpoint-{n}", "global_step"]
ODD_CKPT = ["checkpoint-abc", "tmp-checkpoint-{n}", "checkpoint-", "checkpoint-{n}x", "Checkpoint-{n}"]
RUN_DIRS = ["", "", "run-0", "a/b"]

entry = st.tuples(st.sampled_from(["file", "dir_file", "link_out_file", "link_out_dir", "link_in", "marker_link"]),
                  st.sampled_from(FILE_NAMES), st.sampled_from(DIR_NAMES), st.integers(0, 3000))
checkpoint = st.tuples(st.sampled_from(RUN_DIRS), st.integers(0, 60), st.sampled_from(["ok", "ok", "none", "torn"]),
                       st.lists(entry, max_size=8), st.sampled_from(["real", "real", "real+adapter_in_gs", "bare"]))
# What HF Trainer + DeepSpeed ZeRO-3 + PEFT write (tests/data/checkpoints/), sizes scaled down.
REAL = [("adapter_model.safetensors", 2663), ("adapter_config.json", 12), ("README.md", 51), ("latest", 12),
        ("rng_state_0.pth", 149), ("scheduler.pt", 14), ("training_args.bin", 63), ("zero_to_fp32.py", 385),
        ("global_step{n}/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", 7904),
        ("global_step{n}/zero_pp_rank_0_mp_rank_00_model_states.pt", 354)]
tree = st.tuples(st.lists(checkpoint, min_size=0, max_size=8),
                 st.lists(st.tuples(st.sampled_from(ODD_CKPT), st.integers(0, 60)), max_size=3),
                 st.booleans())
options = st.fixed_dictionaries({"keep_full_latest": st.booleans(), "min_size": st.sampled_from([0, 0, 100, 2000]),
                                 "completion": st.sampled_from(ck.COMPLETION_MODES),
                                 "keep": st.sampled_from([(), ("*.pt",), ("global_step*/*",)])})


def snapshot(top: Path) -> dict[str, tuple]:
    """Every entry under top (lstat, no symlink followed): kind, size, link target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st_ = os.lstat(p)
            if os.path.islink(p):
                out[p] = ("l", os.readlink(p))
            elif os.path.isdir(p):
                out[p] = ("d",)
            else:
                out[p] = ("f", st_.st_size)
    return out


def build(base: Path, spec) -> tuple[Path, Path, dict]:
    ckpts, odd, root_is_link = spec
    real_root, outside = base / "real_out", base / "outside"
    (outside / "global_step5").mkdir(parents=True)
    for n in FILE_NAMES[:6]:
        (outside / n).write_bytes(b"o" * 100)
        (outside / "global_step5" / n).write_bytes(b"o" * 100)
    (outside / "checkpoint-99").mkdir()
    (outside / "checkpoint-99" / "optimizer.pt").write_bytes(b"o" * 100)
    (outside / "checkpoint-99" / "trainer_state.json").write_text("{}")
    real_root.mkdir()
    meta = {}
    for run, step, state, entries, base_kind in ckpts:
        c = real_root / run / f"checkpoint-{step}"
        c.mkdir(parents=True, exist_ok=True)
        meta[str(c)] = state
        if base_kind != "bare":
            (c / f"global_step{step}").mkdir(exist_ok=True)
            base_files = REAL + ([("global_step{n}/adapter_model.safetensors", 2663),
                                  ("global_step{n}/lora/adapter_config.json", 5)]
                                 if base_kind.endswith("adapter_in_gs") else [])
            for rel, size in base_files:
                f = c / rel.format(n=step)
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_bytes(b"\0" * size)
        for kind, fname, dname, size in entries:
            dname = dname.format(n=step)
            try:
                if kind == "file":
                    (c / fname).write_bytes(b"\0" * size) if not (c / fname).is_dir() else None
                elif kind == "dir_file":
                    (c / dname).mkdir(exist_ok=True)
                    if (c / dname).is_dir() and not (c / dname).is_symlink():
                        (c / dname / fname).write_bytes(b"\0" * size)
                elif kind == "link_out_file":
                    (c / fname).symlink_to(outside / FILE_NAMES[size % 6])
                elif kind == "link_out_dir":
                    (c / dname).symlink_to(outside / ("global_step5" if size % 2 else "checkpoint-99"))
                elif kind == "link_in":
                    (c / fname).symlink_to(c / "trainer_state.json")
                elif kind == "marker_link":
                    (c / "trainer_state.json").symlink_to(outside / "checkpoint-99" / "trainer_state.json")
            except (FileExistsError, IsADirectoryError, NotADirectoryError):
                pass
        marker = c / "trainer_state.json"
        if not marker.exists() and not marker.is_symlink():
            if state == "ok":
                marker.write_text('{"global_step": %d}' % step)
            elif state == "torn":
                marker.write_text('{"global_st')
    for name, n in odd:
        d = real_root / name.format(n=n)
        (d / f"global_step{n}").mkdir(parents=True, exist_ok=True)
        (d / f"global_step{n}" / "optimizer.pt").write_bytes(b"\0" * 10)
        (d / "trainer_state.json").write_text("{}")
    (real_root / "checkpoint-98").symlink_to(outside / "checkpoint-99")
    root = real_root
    if root_is_link:
        root = base / "out_link"
        root.symlink_to(real_root)
    return root, outside, meta


def marker_ok(c: str) -> bool:
    p = Path(c) / "trainer_state.json"
    if p.is_symlink() or not p.is_file():
        return False
    try:
        import json
        json.loads(p.read_text())
        return True
    except ValueError:
        return False


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=tree, opts=options)
def test_janitor_safety_properties(spec, opts):
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root, outside, meta = build(base, spec)
        real_root = Path(os.path.realpath(root))
        before_outside = snapshot(outside)
        before = snapshot(real_root)
        p = ck.plan(str(root), **opts)
        r = ck.execute(p)
        after = snapshot(real_root)
        # 1. Nothing outside the root changes.
        assert snapshot(outside) == before_outside
        # 2. Every deletion was inside the root, of a regular file reached without a symlink.
        for d in p.deletions:
            assert os.path.commonpath([os.path.realpath(os.path.dirname(d.path)), str(real_root)]) == str(real_root)
            assert os.path.dirname(os.path.realpath(d.path)) == os.path.dirname(d.path)
        gone = set(before) - set(after)
        for path in gone:
            kind = before[path][0]
            assert kind in ("f", "d"), f"symlink removed: {path}"
            rel = os.path.relpath(path, real_root)
            # 3. No adapter file is ever deleted.
            assert "adapter" not in rel, f"adapter deleted: {rel}"
            assert not rel.endswith("trainer_state.json")
        assert r["errors"] == []
        # 4. The newest checkpoint of each run is never touched while incomplete; in marker mode no
        #    incomplete checkpoint is touched at all; checkpoints with odd names never are.
        groups: dict[str, list] = {}
        for c in meta:
            groups.setdefault(str(Path(c).parent), []).append(c)
        for parent, cs in groups.items():
            cs.sort(key=lambda c: int(Path(c).name.split("-")[1]))
            newest_step = int(Path(cs[-1]).name.split("-")[1])
            for c in cs:
                touched = [g for g in gone if g.startswith(c + "/")]
                step = int(Path(c).name.split("-")[1])
                if step == newest_step:  # left alone until a newer one is complete, complete or not
                    assert not touched, f"newest {c} touched: {touched}"
                if opts["completion"] == "marker" and not marker_ok(c):
                    assert not touched, f"incomplete {c} touched: {touched}"
        for g in gone:
            top = os.path.relpath(g, real_root).split(os.sep)
            assert any(part.startswith("checkpoint-") and part[11:].isdigit() for part in top), g
        # 5. Resume point: the latest complete checkpoint keeps its DeepSpeed state when asked to.
        latest = ck.latest_complete_checkpoint(str(root))
        if latest and opts["keep_full_latest"]:
            lr = os.path.realpath(latest)
            assert not [g for g in gone if g.startswith(lr + "/")], latest
        # 6. Idempotent: a second pass finds nothing more.
        assert ck.plan(str(root), **opts).deletions == []
