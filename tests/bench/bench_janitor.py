#!/usr/bin/env python3
"""Janitor benchmarks (figures only, no asserts).

1. Scan time: plan() (and the CLI's --dry-run, Python start included) over an output root of ~100k files:
   checkpoints of a 248-rank ZeRO-3 run (global_stepN/ with 2 partition files per rank) plus the LoRA files.
2. Peak size of the output root during a simulated 200-step run that saves every 10 steps, files of the real
   fixture's names and sizes (tests/data/checkpoints/, written in the trainer's order, marker last), with the
   janitor running every --janitor-every steps (and once in the middle of each save), against the same run
   without it. Files are sparse: sizes are the logical bytes the trainer would write.

Usage: python tests/bench/bench_janitor.py [--files 100000] [--steps 200] [--save-every 10] [--scale 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ansible.plugins.loader import init_plugin_loader

REPO = Path(__file__).resolve().parents[2]
init_plugin_loader([str(REPO / "collections")])  # the project's shared code, found as ansible-playbook finds it
from ansible_collections.trainyard.core.plugins.module_utils import checkpoints as ck  # noqa: E402

_spec = importlib.util.spec_from_file_location("build_tree", REPO / "tests/data/checkpoints/build_tree.py")
bt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bt)


def build_wide_tree(root: Path, files: int, ranks: int = 248) -> int:
    per_ckpt = 2 * ranks + 10
    n_ckpt = max(2, files // per_ckpt)
    made = 0
    for i in range(n_ckpt):
        step = (i + 1) * 10
        c = root / f"checkpoint-{step}"
        gs = c / f"global_step{step}"
        gs.mkdir(parents=True)
        for r in range(ranks):
            for name in (f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt", f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"):
                with open(gs / name, "wb") as f:
                    f.truncate(1000)
                made += 1
        for name in ("adapter_model.safetensors", "adapter_config.json", "README.md", "rng_state_0.pth",
                     "scheduler.pt", "training_args.bin", "latest", "zero_to_fp32.py", "zero_to_torch.py"):
            (c / name).write_bytes(b"x")
            made += 1
        (c / "trainer_state.json").write_text('{"global_step": %d}' % step)
        made += 1
    return made


def bench_scan(files: int, repeats: int = 3) -> None:
    with tempfile.TemporaryDirectory(prefix="janitor-bench-") as tmp:
        root = Path(tmp) / "out"
        t0 = time.monotonic()
        made = build_wide_tree(root, files)
        build_s = time.monotonic() - t0
        times, entries, dels = [], 0, 0
        for _ in range(repeats):
            t0 = time.monotonic()
            p = ck.plan(str(root))
            times.append(time.monotonic() - t0)
            entries, dels = p.scanned_files, len(p.deletions)
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, ck.__file__, "--root", str(root),
                            "--dry-run", "--json"], capture_output=True, text=True)
        cli_s = time.monotonic() - t0
        t0 = time.monotonic()
        res = ck.execute(ck.plan(str(root)))
        exec_s = time.monotonic() - t0
        print(f"scan: tree of {made} files ({build_s:.1f} s to build); plan() best {min(times):.3f} s, "
              f"median {sorted(times)[len(times) // 2]:.3f} s over {repeats} runs "
              f"({entries} entries lstat'ed, {dels} deletions planned); CLI --dry-run {cli_s:.3f} s (rc {r.returncode}); "
              f"deleting them {exec_s:.3f} s ({res['deleted']} files) [target: scan < 2 s]")


def simulate(root: Path, steps: int, save_every: int, janitor_every: int | None, scale: float) -> dict:
    template = bt.checkpoint_template()
    peak, freed, passes = 0, 0, 0
    current = 0

    def janitor():
        nonlocal freed, passes, current
        p = ck.plan(str(root))
        r = ck.execute(p)
        freed += r["freed"]
        passes += 1
        current -= r["freed"]

    for step in range(1, steps + 1):
        if step % save_every == 0:
            ck_dir = root / f"checkpoint-{step}"
            ck_dir.mkdir(parents=True)
            ordered = [e for e in template if e[2] != "trainer_state.json"] + \
                      [e for e in template if e[2] == "trainer_state.json"]
            for i, (kind, size, rel) in enumerate(ordered):
                path = ck_dir / rel.format(step=step)
                if kind == "d":
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                if rel == "trainer_state.json":
                    path.write_text(('{"global_step": %d}' % step).ljust(size))
                    current += size
                else:
                    n = int(size * scale)
                    with open(path, "wb") as f:
                        f.truncate(n)
                    current += n
                peak = max(peak, current)
                if janitor_every and i == len(ordered) // 2:
                    janitor()  # a pass lands in the middle of a save: the partial checkpoint must survive
        if janitor_every and step % janitor_every == 0:
            janitor()
        peak = max(peak, current)
    final = bt.tree_bytes(root)
    assert final == current, (final, current)
    return {"peak": peak, "final": final, "freed": freed, "passes": passes,
            "resume": ck.latest_complete_checkpoint(str(root))}


def bench_peak(steps: int, save_every: int, janitor_every: int, scale: float) -> None:
    with tempfile.TemporaryDirectory(prefix="janitor-sim-") as tmp:
        without = simulate(Path(tmp) / "a", steps, save_every, None, scale)
        with_j = simulate(Path(tmp) / "b", steps, save_every, janitor_every, scale)
        resume_ok = (Path(with_j["resume"]) / f"global_step{Path(with_j['resume']).name.split('-')[1]}").is_dir()
    mb = 1 / 1e6
    print(f"peak: {steps} steps, save every {save_every} ({steps // save_every} checkpoints, "
          f"{scale:g}x the fixture's sizes): without janitor peak {without['peak'] * mb:.2f} MB "
          f"(final {without['final'] * mb:.2f} MB); with janitor every {janitor_every} steps "
          f"peak {with_j['peak'] * mb:.2f} MB (final {with_j['final'] * mb:.2f} MB, {with_j['passes']} passes, "
          f"{with_j['freed'] * mb:.2f} MB freed) -> {without['peak'] / max(1, with_j['peak']):.1f}x smaller; "
          f"resume point {Path(with_j['resume']).name} keeps its DeepSpeed state: {resume_ok}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--janitor-every", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--skip-scan", action="store_true")
    a = ap.parse_args()
    if not a.skip_scan:
        bench_scan(a.files)
    bench_peak(a.steps, a.save_every, a.janitor_every, a.scale)
    return 0


if __name__ == "__main__":
    sys.exit(main())
