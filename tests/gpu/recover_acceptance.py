#!/usr/bin/env python3
"""GPU acceptance of playbooks/recover.yml: a LLaMA-Factory ZeRO-3 + LoRA job on 2 nodes continues on 1 node.

Two "nodes" on one GPU machine, each with its own training container (tests/gpu/two-nodes-container: host network,
IPC and PID, NCCL_HOSTID per node, NCCL over its socket transport on lo), as tests/gpu/acceptance.py --mode
container-llamafactory sets them up. As root on a machine with >= 1 NVIDIA GPU:

    python3 tests/gpu/recover_acceptance.py "$OUT" --engine ENGINE_DIR --site SITE_DIR [--stage prepare|run|all]

ENGINE_DIR and SITE_DIR are those of tests/gpu/container_mode.py (the docker engine's binaries; LLaMA-Factory and its
pinned packages installed with pip --target); `--stage prepare` (engine, registry, base image) and `--stage run` can
be separate calls, as there.

Steps (each one the product's own playbooks, logged as $OUT/<step>.log, timed):
  1. site.yml: both containers, LoRA + ZeRO-3 bf16 on 2 nodes (world size 2), checkpoints every 10 steps on each
     node (node-local output roots);
  2. once a checkpoint is complete on both nodes, node 1's training container is stopped (docker stop): its rank
     dies, the node fails its preflight (container.running) from then on;
  3. playbooks/recover.yml: drops gpu-node1 (failed preflight: container.running ...), ranks gpu-node0=0, copies
     rank 1's ZeRO shards from node 1's disk (the node answers; only its container is down) onto node 0, converts
     the checkpoint with DeepSpeed's ds_to_universal inside node 0's container, relaunches on 1 node (world size 1)
     with checkpoint.load_universal;
  4. the job on node 0 resumes at the checkpoint's step and trains on; the loss logged at the checkpoint's step
     (before the failure, trainer_state.json of the checkpoint) and the first losses after the resume (the resumed
     job's log) are recorded side by side.
Writes $OUT/recover_acceptance.json and $OUT/recover_figures.md (with every log and run directory beside them); exits
1 when a step fails.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import acceptance as acc_mod  # noqa: E402 - the directory above is put on sys.path first
import container_mode as cm  # noqa: E402

INV = "tests/gpu/two-nodes-container"
LOSS_RE = re.compile(r"\{'loss': [^\n]*?\}")


def losses(text: str) -> list[dict]:
    """The Trainer's per-step log dicts ({'loss': ..., 'epoch': ...}) in the order printed."""
    found = []
    for m in LOSS_RE.finditer(text):
        try:
            found.append(ast.literal_eval(m.group(0)))
        except (ValueError, SyntaxError):
            continue
    return found


def run(a, engine) -> int:
    f = a.results["figures"]
    a.results["data"] = cm.make_model_and_data(a.root / "shared")

    # 1. site.yml on 2 nodes
    rc, log, took = a.playbook("site", "site.yml", inventory=INV)
    if not a.check("site", rc == 0, f"site.yml rc {rc} in {took:.1f} s"):
        return 1

    # 2. a checkpoint complete on both nodes, then node 1's container stopped
    saved = a.wait(lambda: set(a.complete_steps(0)) & set(a.complete_steps(1)), 600, 0.5)
    before = max(set(a.complete_steps(0)) & set(a.complete_steps(1)), default=0)
    if not a.check("checkpoint", bool(saved), f"complete on both nodes: {sorted(saved or [])}"):
        return 1
    stop = engine.docker("stop", "-t", "1", "trainyard-gpu-accept-node1", check=False, capture_output=True, text=True)
    t_lost = time.monotonic()
    a.check("lose-node1", stop.returncode == 0, f"docker stop trainyard-gpu-accept-node1: rc {stop.returncode}")
    jsonl = a.node_dir(0, "outputs") / "trainer_log.jsonl"
    seen = len(jsonl.read_text().splitlines()) if jsonl.exists() else 0
    ckpt0 = a.node_dir(0, "outputs") / f"checkpoint-{before}"
    state = json.loads((ckpt0 / "trainer_state.json").read_text())
    hist = [h for h in state.get("log_history", []) if "loss" in h]
    loss_before = next((h for h in reversed(hist) if h.get("step") == before), hist[-1] if hist else {})
    a.results["before"] = {"checkpoint": str(ckpt0), "step": before, "loss_at_step": loss_before,
                           "last_losses": hist[-5:]}

    # 3. recover.yml
    rc, log, took = a.playbook("recover", "playbooks/recover.yml", inventory=INV)
    f["recover_s"] = round(took, 1)
    f["lost_to_relaunched_s"] = round(time.monotonic() - t_lost, 1)
    summary = re.search(r"recovering on [^\n\"]*", log)
    a.results["recover_summary"] = summary.group(0) if summary else None
    a.check("recover", rc == 0 and "Traceback" not in log, f"recover.yml rc {rc} in {took:.1f} s: "
            f"{summary.group(0) if summary else log[-800:]}")
    a.check("dropped", bool(summary) and "dropped gpu-node1 (failed preflight" in summary.group(0)
            and "ranks gpu-node0=0" in summary.group(0), summary.group(0) if summary else "no summary line")
    universal = sorted(p.name for p in ckpt0.glob("global_step*_universal"))
    a.check("converted", bool(universal) and (ckpt0 / "latest_universal").exists(),
            f"{ckpt0}: {universal}, latest_universal {(ckpt0 / 'latest_universal').exists()}")
    launch = json.loads((a.node_dir(0, "state") / "gpu-accept" / "launch.json").read_text())
    a.results["relaunch"] = {"command": launch.get("command"), "resume_from": launch.get("resume_from")}
    a.check("world-size-1", "--nnodes=1" in launch.get("command", []) and launch.get("resume_from") == str(ckpt0),
            f"command {' '.join(launch.get('command', [])[:4])} ..., resume_from {launch.get('resume_from')}")
    if rc != 0:
        return 1

    # 4. the resumed job: its step counter and its loss (LLaMA-Factory's trainer_log.jsonl on rank 0's node: one line
    #    per logged step, {"current_steps": N, "loss": ...}; the lines after those of the first run are the resumed job's)
    def resumed():
        lines = jsonl.read_text().splitlines() if jsonl.exists() else []
        new = [json.loads(x) for x in lines[seen:] if x.strip().startswith("{")]
        new = [x for x in new if "loss" in x]
        return new if len(new) >= 3 else None

    got = a.wait(resumed, 600, 2) or []
    text = a.log_of(0)
    cont = re.search(r"Continuing training from checkpoint[^\n]*|Continuing training from global step \d+", text)
    a.results["after"] = {"log_line": cont.group(0) if cont else None, "first_logged": got[:5],
                          "first_losses_stdout": losses(text.split("Continuing training", 1)[-1])[:5]}
    first = got[0] if got else {}
    a.check("resumed-step", first.get("current_steps") == before + 1,
            f"first step logged after the resume: {first.get('current_steps')} (checkpoint step {before})")
    a.check("resumed-loss", "loss" in first and bool(loss_before),
            f"loss at step {before} before the failure {loss_before.get('loss')}; at step "
            f"{first.get('current_steps')} after the resume on 1 node {first.get('loss')}")
    f["loss_before_failure"] = loss_before.get("loss")
    f["loss_first_resumed_step"] = first.get("loss")
    a.playbook("status-end", "playbooks/status.yml", inventory=INV)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--engine", type=Path, required=True, help="the docker engine's binaries (bin/, lib/)")
    p.add_argument("--site", type=Path, help="LLaMA-Factory and its pinned packages (pip --target); --stage run")
    p.add_argument("--stage", choices=["prepare", "run", "all"], default="all")
    p.add_argument("--root", type=Path, default=Path("/tmp/trainyard-gpu"), help="the nodes' files")
    p.add_argument("--work", type=Path, default=Path("/tmp/trainyard-engine"))
    args = p.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    engine = cm.Engine(args.engine.resolve(), args.work)
    facts_path = out / "prepare.json"
    facts = json.loads(facts_path.read_text()) if facts_path.exists() else {}
    facts.update(engine.up())
    if args.stage in ("prepare", "all"):
        facts.update(cm.build_base(engine, args.work))
        facts_path.write_text(json.dumps(facts, indent=2))
        if args.stage == "prepare":
            return 0
    if not args.site:
        sys.exit("--stage run needs --site DIR (LLaMA-Factory and its pinned packages installed with pip --target)")
    facts.update(cm.register_driver_dir())
    facts.update(cm.build_image(engine, args.work, args.site.resolve()))
    a = acc_mod.Acceptance(out, False, args.root, mode="container-llamafactory")
    a.results["engine"] = facts
    a.env.update(PATH=engine.env["PATH"], LD_LIBRARY_PATH=engine.env["LD_LIBRARY_PATH"])
    import shutil
    shutil.rmtree(a.root, ignore_errors=True)
    try:
        rc = run(a, engine)
    finally:
        for node in ("node0", "node1"):
            engine.docker("rm", "-f", f"trainyard-gpu-accept-{node}", check=False, capture_output=True)
    a.finish(threading.Event())
    (out / "recover_acceptance.json").write_text(json.dumps(a.results, indent=2))
    lines = ["| figure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in a.results["figures"].items()]
    (out / "recover_figures.md").write_text("\n".join(lines) + "\n")
    return rc or (0 if a.results["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
