#!/usr/bin/python
# trainyard: move checkpoint files between nodes without following a link the job planted (playbooks/recover.yml).
"""Pack files of a node's checkpoint into a private tar, or unpack such a tar into another node's checkpoint."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_copy
short_description: Pack or unpack checkpoint files, never through a symbolic link
description:
  - The job writes the checkpoint tree; recover copies shards and the converted checkpoint between nodes as root.
    This module walks the tree one component at a time with C(O_NOFOLLOW) from the trusted output root, so a
    symbolic link the job planted (a shard, a C(global_stepN) directory, the checkpoint directory itself) stops the
    copy with a one-line error naming it, and nothing is read or written through it.
  - C(state=packed) writes the named I(files) and every regular file under I(trees) into C(ckpt.tar) in a fresh
    private directory (mode 0700) and returns its path; the controller fetches it.
  - C(state=unpacked) writes the regular files of I(archive) into I(output_root)/I(name) (created when missing),
    each into a fresh temporary file, then renamed over its name, owned by the checkpoint directory's owner. A tar
    member that is a link, absolute or with C(..) stops it.
options:
  state:
    description: C(packed) on the node that holds the files, C(unpacked) on the node that gets them.
    type: str
    choices: [packed, unpacked]
    required: true
  output_root:
    description: The node's output root (C(cluster_output_root)); trusted, the part below it is not.
    type: path
    required: true
  name:
    description: The checkpoint's directory name under I(output_root) (C(checkpoint-N)).
    type: str
    required: true
  files:
    description: C(packed), paths of regular files relative to the checkpoint.
    type: list
    elements: str
    default: []
  trees:
    description: C(packed), directories relative to the checkpoint whose regular files are all packed.
    type: list
    elements: str
    default: []
  archive:
    description: C(unpacked), the tar to unpack (copied onto this node by the controller).
    type: path
  max_bytes:
    description: C(packed), the most bytes (apparent size) the packed files may hold together; 0 caps them only by
      the free space of the temporary directory (always checked). Checked before anything is written.
    type: int
    default: 0
  allow_sparse:
    description: C(packed), pack a file whose blocks on disk cover less than half its apparent size (over 1 MiB).
      Refused by default (a sparse terabyte costs the job nothing and becomes real bytes in the tar); true only on a
      compressing file system (ZFS, btrfs compression) where dense shards report fewer blocks.
    type: bool
    default: false
extends_documentation_fragment: [trainyard.core.attributes]
author: trainyard
"""

EXAMPLES = r"""
- name: Pack rank 2's shard on the node that holds it
  checkpoint_copy:
    state: packed
    output_root: /srv/outputs
    name: checkpoint-20
    files: [global_step20/zero_pp_rank_2_mp_rank_00_model_states.pt]
  register: __packed

- name: Unpack it into the head's copy of the checkpoint
  checkpoint_copy:
    state: unpacked
    output_root: /srv/outputs
    name: checkpoint-20
    archive: /tmp/trainyard-recover-x/ckpt.tar
"""

RETURN = r"""
archive:
  description: C(packed), the tar's path (in a fresh private directory; remove the directory when done).
  returned: state=packed
  type: str
files:
  description: C(packed), the relative paths packed.
  returned: state=packed
  type: list
written:
  description: C(unpacked), the relative paths written (different or missing before).
  returned: state=unpacked
  type: list
unchanged:
  description: C(unpacked), the relative paths that already held the same content.
  returned: state=unpacked
  type: list
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.trainyard.core.plugins.module_utils import ckpt_transfer as ct


def main():
    module = AnsibleModule(
        argument_spec=dict(state=dict(type="str", choices=["packed", "unpacked"], required=True),
                           output_root=dict(type="path", required=True),
                           name=dict(type="str", required=True),
                           files=dict(type="list", elements="str", default=[]),
                           trees=dict(type="list", elements="str", default=[]),
                           archive=dict(type="path"),
                           max_bytes=dict(type="int", default=0),
                           allow_sparse=dict(type="bool", default=False)),
        required_if=[("state", "unpacked", ["archive"])],
        supports_check_mode=True)
    p = module.params
    try:
        if p["state"] == "packed":
            # Packing writes only a private temporary file: it runs in check mode too (the copy's plan needs it).
            out = ct.pack(p["output_root"], p["name"], p["files"], p["trees"], max_bytes=p["max_bytes"],
                          allow_sparse=p["allow_sparse"])
            module.exit_json(changed=False, **out)
        out = ct.unpack(p["archive"], p["output_root"], p["name"], check_mode=module.check_mode)
        module.exit_json(changed=bool(out["written"]), **out)
    except ct.TransferError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
