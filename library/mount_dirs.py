#!/usr/bin/python
# trainyard: the training container's bind-mount sources on a node, in one module call.
"""Create the container's mount sources, give the writable ones to the job's user and the job's read-only directory
the job's group, in one round trip (module_utils/mountdirs.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: mount_dirs
short_description: Create the training container's mount sources and give the job what it must write, in one call
description:
  - "Creates each directory in I(directories) as C(mkdir -p) would (missing parents too, root's, 0755); an existing
    one keeps its mode and owner. Below another writable source (a tree the job can write) every component is
    opened without following links and a symlink is refused; elsewhere the parents are the host's."
  - "Gives each source in I(writable) that the job cannot write (root's, not writable by I(uid):I(gid)) to
    I(uid):I(gid): the top directory only, never recursively, with fchown on the directory's own descriptor (as
    C(chown -h), a link is never followed). One of another owner, one already writable, a symlink and one below
    another writable source keep their owner (listed in C(left) with the reason)."
  - "Makes I(group_dir) root's with the group I(gid), group read and search, no group write."
  - "Supports check mode: nothing changes, the result says what would (C(changed) only where something would)."
  - "Every path goes through module_utils/jobtree.py (descriptors, no-follow; docs/security.md)."
options:
  directories:
    description: Directories to create (absolute paths), as C(mkdir -p).
    type: list
    elements: path
    default: []
  writable:
    description: The sources of the writable bind mounts (absolute paths); each is given to I(uid):I(gid) where the job cannot write it.
    type: list
    elements: path
    default: []
  uid:
    description: The job's uid. Left out (the job runs as root or as the image's user), nothing is given and I(group_dir) is not touched.
    type: int
  gid:
    description: The job's gid (with I(uid)).
    type: int
  group_dir:
    description: The job's read-only directory, kept root's with the group I(gid), C(g+rx), C(g-w) (created when missing).
    type: path
extends_documentation_fragment: [trainyard.core.attributes]
author: trainyard
"""

EXAMPLES = r"""
- name: Create the mounted directories and give the writable ones to the job's user
  mount_dirs:
    directories: [/srv/outputs, /srv/code, /var/lib/trainyard/train/job-ro]
    writable: [/srv/outputs, /srv/code]
    uid: 65532
    gid: 65532
    group_dir: /var/lib/trainyard/train/job-ro
"""

RETURN = r"""
created: {description: The directories made (in check mode, that would be)., returned: always, type: list, elements: str}
given: {description: The writable sources given to uid:gid (in check mode, that would be)., returned: always, type: list, elements: str}
left: {description: "C({writable source: why it keeps its owner}).", returned: always, type: dict}
group_dir:
  description: C({path, changed}) of I(group_dir), null without it or without I(uid).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils import mountdirs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(type="list", elements="path", default=[]),
            writable=dict(type="list", elements="path", default=[]),
            uid=dict(type="int"),
            gid=dict(type="int"),
            group_dir=dict(type="path"),
        ),
        required_together=[("uid", "gid")],
        supports_check_mode=True,
    )
    p = module.params
    ids = None if p["uid"] is None else (p["uid"], p["gid"])
    try:
        result = mountdirs.ensure(p["directories"], p["writable"], ids, p["group_dir"], module.check_mode)
    except ValueError as e:
        module.fail_json(msg="mount_dirs: %s: fix the mount source in container_mounts" % e)
    except OSError as e:
        module.fail_json(msg="mount_dirs: %s%s" % (e.strerror or e, ": %s" % e.filename if e.filename else ""))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
