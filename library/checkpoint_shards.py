#!/usr/bin/python
# trainyard: which checkpoint shards this node holds (playbooks/recover.yml).
"""List the ranks whose checkpoint shards a node holds, for the latest complete checkpoint or a named one."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_shards
short_description: List the checkpoint shards a node holds (read-only)
description:
  - Finds the latest complete checkpoint (C(checkpoint-N) with its C(trainer_state.json)) under I(output_root), or
    the one named by I(checkpoint), and lists the ranks whose shards are in it, from the file names alone
    (DeepSpeed ZeRO C(zero_pp_rank_R_mp_rank_00_*_states.pt) under C(global_stepN/), the bundled example's
    C(shard-rankR-of-W.pt)).
  - Reads and changes nothing else; used by C(playbooks/recover.yml) to decide whether the shards of a lost node
    survive elsewhere.
options:
  output_root:
    description: The node's output root (C(cluster_output_root)).
    type: path
    required: true
  checkpoint:
    description: Checkpoint directory name (C(checkpoint-N)) to list; empty lists the latest complete one.
    type: str
    default: ""
extends_documentation_fragment: [trainyard.core.attributes]
"""

EXAMPLES = r"""
- name: List the shards of the latest complete checkpoint
  checkpoint_shards:
    output_root: "{{ cluster_output_root }}"
  register: __launch_shards
"""

RETURN = r"""
checkpoint:
  description: Path of the listed checkpoint ("" when there is none).
  returned: always
  type: str
name:
  description: Its directory name (C(checkpoint-N)).
  returned: always
  type: str
step:
  description: Its step (-1 when there is none).
  returned: always
  type: int
shards:
  description: C(format) (deepspeed, example or ""), C(ranks), C(world_size) (when recorded), C(tag), C(files)
    (rank to paths relative to the checkpoint), C(complete), C(universal) (already converted), C(weights)
    (C(adapter), C(model), C(optimizer), whether it holds the adapter, the model weights, a C(optimizer.pt)).
  returned: always
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.trainyard.core.plugins.module_utils import jobtree
from ansible_collections.trainyard.core.plugins.module_utils.checkpoints import latest_complete_checkpoint
from ansible_collections.trainyard.core.plugins.module_utils.recover import list_shards


def _is_dir(path):
    """A directory that is not a symbolic link (the job writes the output root below the trusted root)."""
    try:
        os.close(jobtree.open_root(path))
    except OSError:
        return False
    return True


def main():
    module = AnsibleModule(argument_spec=dict(output_root=dict(type="path", required=True),
                                              checkpoint=dict(type="str", default="")),
                           supports_check_mode=True)
    root = module.params["output_root"]
    name = module.params["checkpoint"].strip()
    if name and (os.sep in name or not name.startswith("checkpoint-")):
        module.fail_json(msg="checkpoint=%r: give the directory name checkpoint-N, not a path" % name)
    path = os.path.join(root, name) if name else (latest_complete_checkpoint(root) or "")
    if not path or not _is_dir(path):
        module.exit_json(changed=False, checkpoint="", name=name, step=-1,
                         shards={"format": "", "ranks": [], "world_size": None, "tag": "", "files": {},
                                 "complete": False, "universal": False,
                                 "weights": {"adapter": False, "model": False, "optimizer": False}})
    base = os.path.basename(path.rstrip("/"))
    step = int(base.split("-", 1)[1]) if base.split("-", 1)[-1].isdigit() else -1
    shards = list_shards(path)
    shards["files"] = {str(k): v for k, v in shards["files"].items()}
    module.exit_json(changed=False, checkpoint=path, name=base, step=step, shards=shards)


if __name__ == "__main__":
    main()
