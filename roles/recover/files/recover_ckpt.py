# -*- coding: utf-8 -*-
"""Read or mend a DeepSpeed checkpoint file for playbooks/recover.yml (roles/recover/tasks/recover_convert.yml), with
the job's own Python and torch (inside the training container when the job runs in one).

The task passes this file's text to the interpreter with -c (nothing is written on the node for it):
  world PATH   prints the data-parallel world size a ZeRO model-states file (*_model_states.pt) was saved with;
  unfuse PATH  sets fused: false in every parameter group of a converted optimizer_state.pt (the universal loader
               restores the Adam step counters on the CPU, which torch's fused AdamW refuses), saves the file only
               when it changed, and prints "unfused N parameter groups" or "not fused".

The decisions are the pure functions below (unit-tested without torch: tests/unit/plugin_utils/test_recover_convert.py).
"""

from __future__ import annotations

import sys


def saved_world(state):
    """The dp_world_size a model-states dict records."""
    return int(state["dp_world_size"])


def unfuse(state):
    """Turn the fused flag off in every parameter group of an optimizer state dict (the top-level param_groups and
    optimizer_state_dict's); returns how many groups changed."""
    changed = 0
    nested = (state.get("optimizer_state_dict") or {}).get("param_groups") or []
    for groups in (state.get("param_groups") or [], nested):
        for group in groups:
            if group.get("fused"):
                group["fused"] = False
                changed += 1
    return changed


def unfuse_message(changed):
    return ("unfused %d parameter groups" % changed) if changed else "not fused"


def main(argv, torch=None):
    if len(argv) != 2 or argv[0] not in ("world", "unfuse"):
        sys.stderr.write("usage: recover_ckpt.py world|unfuse PATH\n")
        return 2
    if torch is None:
        import torch
    command, path = argv
    state = torch.load(path, map_location="cpu", weights_only=False)
    if command == "world":
        print(saved_world(state))
        return 0
    changed = unfuse(state)
    if changed:
        torch.save(state, path)
    print(unfuse_message(changed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
