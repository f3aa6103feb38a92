#!/usr/bin/python
# trainyard: the cluster lock file of one node (one changing operation at a time per cluster).
"""Take, refresh or give back a node's cluster lock. The decisions (stale or not, the message) are made on the
controller by the action plugin of the same name; this module only does the atomic file work on the node."""

from __future__ import annotations

DOCUMENTATION = r"""
module: cluster_lock
short_description: Take, refresh or release the cluster lock file of a node
description:
  - The lock is the file C(<path>/cluster.lock), a JSON record of its holder (user, controller host, PID and
    start time of the ansible-playbook process, playbooks, tags) and the time it was taken. It appears
    atomically and complete (a private temporary file opened C(O_CREAT|O_EXCL|O_NOFOLLOW), then C(link())).
  - I(path) is created mode C(0700) when missing; a link, a directory of another owner or one that others can
    write is refused.
  - The file's modification time is the holder's heartbeat; the module returns the ages of the lock and of the
    heartbeat as measured by the node's own clock.
  - The action plugin C(cluster_lock) wraps this module (waiting, staleness, the message); call the module
    directly only for I(state=query).
options:
  path:
    description: The lock directory on the node (C(cluster_lock_dir)).
    type: path
    required: true
  state:
    description:
      - C(present) takes the lock (or confirms this run holds it and refreshes the heartbeat); C(absent) removes
        it when it holds I(token); C(heartbeat) touches it when it holds I(token); C(query) only reads it.
    type: str
    choices: [present, absent, heartbeat, query]
    default: present
  token:
    description: The run's token (C(record.token) for I(state=present)).
    type: str
    default: ""
  record:
    description: The holder record to store (I(state=present)); must contain C(token).
    type: dict
    default: {}
  break_token:
    description: Remove the lock first when it holds exactly this token (a holder judged stale).
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    details: present reports whether the lock could be taken and who holds it; nothing is written.
  diff_mode:
    support: none
author: trainyard
"""

EXAMPLES = r"""
- name: Who holds the cluster lock of this node
  cluster_lock:
    path: /var/lib/trainyard-lock
    state: query
  register: held
"""

RETURN = r"""
acquired:
  description: This run holds the lock after the call (I(state=present)).
  returned: always
  type: bool
created:
  description: The call took the lock (it was free before).
  returned: always
  type: bool
released:
  description: The call removed this run's lock (I(state=absent)).
  returned: always
  type: bool
alive:
  description: The lock still holds I(token) (I(state=heartbeat)).
  returned: always
  type: bool
broken:
  description: The record of the stale lock removed through I(break_token), or null.
  returned: always
  type: dict
holder:
  description: The record of the lock found held by another run (or, for I(state=query), by anyone), or null.
  returned: always
  type: dict
age_s:
  description: Seconds since the holder took the lock (node clock).
  returned: always
  type: float
heartbeat_age_s:
  description: Seconds since the holder's last heartbeat (node clock).
  returned: always
  type: float
lock:
  description: Path of the lock file.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils import cluster_lock as lk


def run(module):
    p = module.params
    path, state, token = p["path"], p["state"], p["token"]
    result = {"changed": False, "acquired": False, "created": False, "released": False, "alive": False,
              "broken": None, "holder": None, "age_s": None, "heartbeat_age_s": None,
              "lock": os.path.join(path, lk.LOCK_NAME)}
    if state == "query":
        holder, age, hb = lk.read(path) if os.path.isdir(path) else (None, None, None)
        result.update(holder=holder, age_s=age, heartbeat_age_s=hb)
        return result
    if state in ("absent", "heartbeat") and not token:
        module.fail_json(msg="cluster_lock: state=%s needs token" % state, **result)
    if state == "absent":
        if module.check_mode:
            holder, _, _ = lk.read(path) if os.path.isdir(path) else (None, None, None)
            result["released"] = result["changed"] = (holder or {}).get("token") == token
            return result
        result["released"] = result["changed"] = lk.release(path, token)
        return result
    if state == "heartbeat":
        result["alive"] = lk.heartbeat(path, token) if not module.check_mode else True
        return result
    record = p["record"]
    if not record.get("token"):
        module.fail_json(msg="cluster_lock: state=present needs record.token", **result)
    out = lk.acquire(path, record, break_token=p["break_token"] or None, check_mode=module.check_mode)
    result.update(out)
    result["changed"] = bool(out["created"] or out["broken"])
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="present", choices=["present", "absent", "heartbeat", "query"]),
            token=dict(type="str", default="", no_log=False),
            record=dict(type="dict", default={}),
            break_token=dict(type="str", default="", no_log=False),
        ),
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except lk.LockError as exc:
        module.fail_json(msg="cluster lock on this node: %s" % exc)
    except OSError as exc:
        module.fail_json(msg="cluster lock on this node: %s: %s (cluster_lock_dir %s)"
                         % (exc.filename or module.params["path"], exc.strerror or exc, module.params["path"]))


if __name__ == "__main__":
    main()
