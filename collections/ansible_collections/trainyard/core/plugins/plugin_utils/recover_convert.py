# -*- coding: utf-8 -*-
"""Controller side of the checkpoint conversion of playbooks/recover.yml (roles/recover/tasks/recover_convert.yml):
the conversion command the new head runs, and the line that says what the survivors resume from.

Pure: a checkpoint_shards listing (the fact launch_recover_shards) and plain values in, plain values out; the
filters in filter_plugins/recover_shards.py hand them to the tasks (tests/unit/plugin_utils/test_recover_convert.py).
"""

from __future__ import annotations


def convert_command(listing, python, code_dir):
    """How the head converts the checkpoint of `listing` for any world size: {argv, creates}.

    The example entry point converts its own shards (ddp_train.py --convert, into <checkpoint>/universal); DeepSpeed's
    ds_to_universal converts <checkpoint>/<tag> into <checkpoint>/<tag>_universal. creates: the file or directory the
    conversion leaves, relative to the checkpoint (the task is skipped where it exists)."""
    listing = listing or {}
    ckpt = listing.get("checkpoint") or ""
    shards = listing.get("shards") or {}
    if shards.get("format") == "example":
        return {"argv": [python, f"{code_dir}/ddp_train.py", "--convert", ckpt],
                "creates": f"{ckpt}/universal/trainer_state.json"}
    tag = shards.get("tag") or ""
    return {"argv": [python, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", f"{ckpt}/{tag}",
                     "--output_folder", f"{ckpt}/{tag}_universal"],
            "creates": f"{ckpt}/{tag}_universal"}


def resume_line(listing, head, mode, converted=False, saved_world=0, world_size=0, weights=None):
    """'Resume: ...': the checkpoint converted from saved_world to world_size, or (weights-only) the weights every
    survivor loads, or the checkpoint as it is, or no checkpoint on the new head (the job starts from step 0)."""
    ckpt = (listing or {}).get("checkpoint") or ""
    if converted:
        what = f"{ckpt} converted from world size {saved_world} to {world_size}"
    elif mode == "weights" and ckpt:
        what = f"{ckpt} {(weights or {}).get('detail', '')}"
    else:
        what = ckpt or f"no complete checkpoint on {head}: the job starts from step 0"
    return "Resume: " + what


def recover_record(plan, mode, checkpoint="", converted=False, resume=None):
    """recover.json: recover_plan's answer (summary, dropped, survivors, rank maps, head, world sizes) with the resume
    decided (mode, checkpoint, whether it was converted, the report section's resume)."""
    plan = plan or {}
    keys = ("summary", "dropped", "survivors", "rank_map", "old_rank_map", "head", "head_moved", "world_size",
            "world_size_before")
    return dict({k: plan.get(k) for k in keys}, resume_mode=mode, checkpoint=checkpoint or "",
                converted=bool(converted), resume=resume)
