# -*- coding: utf-8 -*-
"""Take or give back the cluster lock of a node from the controller: who and what, waiting, staleness, the
message. The file work on the node is the module cluster_lock; the heartbeat, the callback cluster_lock."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cluster_lock_guard
short_description: Take (waiting, judging staleness) or release the cluster lock of a node
description:
  - "Runs the module C(cluster_lock) on the node with this run's record: the user, the controller host and boot
    id, the PID and start time of the C(ansible-playbook) process, the playbooks on its command line and the
    tags."
  - "While another run holds the lock it retries every I(poll_s) seconds up to I(wait_s), then fails with one
    line naming the holder, what it runs, since when, and the fix. A holder that is provably dead (it ran on this
    controller in this boot and PID namespace, and its process, PID and start time, no longer runs: killed with
    C(-9)) has its lock taken over at once, with a warning naming it. A holder only judged gone (no heartbeat for
    I(stale_s) from another controller, or a controller restarted since) may be alive: it is reported at once,
    and its lock is removed only with I(break=true)."
  - "After taking a lock it returns I(cluster_lock_keeper) for the callback C(cluster_lock), which touches the node's
    lock every I(stale_s)/4 seconds (at least 1 s) from ansible-playbook's own process while the run lives, and gives
    it back when the run ends, whether it succeeded or failed. After a C(kill -9) of ansible-playbook the heartbeat
    stops with it and the lock goes stale."
options:
  path:
    description: Lock directory on the node (C(cluster_lock_dir)).
    type: path
    required: true
  state:
    description: C(present) takes the lock, C(absent) gives back this run's lock.
    type: str
    choices: [present, absent]
    default: present
  wait_s:
    description: Longest wait for a lock held by a live run, in seconds.
    type: float
    default: 60
  stale_s:
    description: A holder on another controller with no heartbeat for this long is gone, in seconds.
    type: float
    default: 300
  break:
    description: Remove a lock whose holder is judged gone by its heartbeat (never a live one).
    type: bool
    default: false
  poll_s:
    description: Seconds between tries while waiting.
    type: float
    default: 2
  try_once:
    description:
      - "One try, no wait and no failure: a lock free, this run's or of a provably dead holder is taken (as with
        I(wait_s)); one held by another run is returned in I(lock_holder) with I(acquired=false), nothing else done.
        The playbook tries every node at once this way and takes the head-first path (waiting) only when one was
        held (roles/cluster/tasks/lock.yml)."
    type: bool
    default: false
  node_released:
    description: "With I(state=absent), the node gave the lock back already (the module C(job_reset) released it in
      the same call as its last change): only the heartbeat is stopped, no round trip to the node."
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details: reports who holds the lock (a warning) and takes nothing.
"""

EXAMPLES = r"""
- name: Take the cluster lock
  cluster_lock_guard:
    path: /var/lib/trainyard-lock
    wait_s: 60
    stale_s: 300
"""

RETURN = r"""
acquired:
  description: This run holds the node's lock (never reported as a change; the lock is the run's bookkeeping).
  returned: state=present
  type: bool
created:
  description: This call took the lock (false when the run already held it).
  returned: state=present
  type: bool
released:
  description: This call removed the run's lock (state=absent).
  returned: state=absent
  type: bool
broken:
  description: The record of a lock taken over (its holder provably dead) or broken (break=true), or null.
  returned: state=present
  type: dict
record:
  description: This run's record (who and what), as stored on the node.
  returned: always
  type: dict
ansible_facts:
  description: C(cluster_lock_token), this run's token (the same on every node), set on the host (state=present).
  returned: state=present
  type: dict
cluster_lock_keeper:
  description: "For the callback C(cluster_lock): C(path), C(token), C(interval_s) and C(hold) (true: keep this node's
    lock alive and give it back at exit; false: it was given back). Not in check mode."
  returned: when the run took, held or gave back the lock
  type: dict
lock_holder:
  description: The record of the run that holds the lock, when the task failed because of it (or, with I(try_once),
    when it was not taken).
  returned: failure, or try_once when held
  type: dict
"""

import getpass
import os
import socket
import sys
import time

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.trainyard.core.plugins.module_utils import cluster_lock
from ansible_collections.trainyard.core.plugins.plugin_utils import check_records

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _lock_module(self, task_vars, **args):
        return self._execute_module(module_name="cluster_lock", module_args=args, task_vars=task_vars)

    def run(self, tmp=None, task_vars=None):
        result = self._guard(tmp, task_vars or {})
        # cluster_lock_token as a host variable (plugin_utils/check_records.py, publish), not a fact
        return check_records.publish_task_result(result, self._task, task_vars)

    def _guard(self, tmp, task_vars):
        result = super().run(tmp, task_vars)
        lk = cluster_lock
        a = self._task.args
        path = a.get("path")
        state = a.get("state", "present")
        wait_s = float(a.get("wait_s", 60))
        stale_s = float(a.get("stale_s", 300))
        brk = boolean(a.get("break", False), strict=False)
        poll_s = max(0.2, float(a.get("poll_s", 2)))
        try_once = boolean(a.get("try_once", False), strict=False)
        node_released = boolean(a.get("node_released", False), strict=False)
        node = task_vars.get("inventory_hostname", "?")

        # That it lies outside the directories the container mounts, the validate play checked for every trainer.
        problem = lk.check_lock_dir(path, {})
        if problem:
            return dict(result, failed=True, msg=problem)
        if state not in ("present", "absent"):
            return dict(result, failed=True, msg="cluster_lock_guard: state must be present or absent, not %r" % state)

        # Worker processes are forked from ansible-playbook: its argv is ours, its PID the callback cluster_lock's
        # note (our parent's without it). A worker left behind by a killed ansible-playbook takes no lock.
        pid = int(os.environ.get(lk.PID_ENV) or os.getppid())
        ticks = lk.proc_start_ticks(pid)
        if pid == 1 or lk.pid_alive(pid, ticks) is False:
            return dict(result, failed=True, msg="cluster lock: ansible-playbook (PID %d) is gone; not taking or "
                                                 "releasing the lock of %s" % (pid, node))
        host = socket.gethostname()
        boot = lk.boot_id()
        record = lk.owner_record(getpass.getuser(), host, boot, pid, ticks, lk.playbooks_from_argv(sys.argv),
                                 task_vars.get("ansible_run_tags"), task_vars.get("ansible_skip_tags"),
                                 lk.pid_namespace())
        token = record["token"]
        result["record"] = record
        if state == "present":
            # The run's token on the host, for a module that gives the lock back in the call of the node's last
            # change (reset.yml: job_reset's release_lock).
            result["ansible_facts"] = {"cluster_lock_token": token}

        if state == "absent":
            r = {"released": False} if node_released else \
                self._lock_module(task_vars, path=path, state="absent", token=token)
            if r.get("failed"):
                return dict(result, **r)
            if not self._task.check_mode:
                # the callback stops this node's heartbeat and gives nothing back at exit
                result["cluster_lock_keeper"] = {"path": path, "token": token, "hold": False}
            # The lock is the run's bookkeeping, not a change of the cluster: a converged run reports changed=0.
            return dict(result, changed=False, released=bool(r.get("released")))

        started = time.monotonic()
        break_token = ""
        announced = False
        gone = None  # (reason, age of the lock) of a provably dead holder being taken over
        while True:
            r = self._lock_module(task_vars, path=path, state="present", record=record, break_token=break_token)
            if r.get("failed"):
                return dict(result, **r)
            if r.get("broken"):
                display.warning(lk.takeover_message(node, r["broken"], gone[1], gone[0]) if gone else
                                "%s: removed the stale cluster lock of %s" % (node, lk.describe(r["broken"])))
                result["broken"] = r["broken"]
            if r.get("acquired"):
                result.update(acquired=True, created=bool(r.get("created")), changed=False)
                if not self._task.check_mode:
                    # the callback cluster_lock keeps it alive while ansible-playbook lives, and gives it back
                    result["cluster_lock_keeper"] = {"path": path, "token": token, "hold": True,
                                                     "interval_s": lk.heartbeat_interval(stale_s)}
                return result
            holder = r.get("holder")
            if holder is None:  # freed between the tries: take it now
                continue
            verdict, reason = lk.judge(holder, r.get("heartbeat_age_s"), stale_s, host, boot)
            # Provably dead: take over; judged gone by the heartbeat: only on request. Either way the module
            # removes the lock only while it still holds the token judged here.
            if (verdict == lk.GONE or (verdict == lk.STALE and brk)) and holder.get("token") \
                    and holder["token"] != break_token and not self._task.check_mode:
                break_token = holder["token"]
                gone = (reason, r.get("age_s")) if verdict == lk.GONE else None
                continue
            lock_file = r.get("lock") or os.path.join(path, lk.LOCK_NAME)
            if try_once:
                return dict(result, acquired=False, lock_holder=holder)
            if self._task.check_mode:
                display.warning("%s: would take over the cluster lock of %s: %s" % (
                    node, lk.describe(holder, r.get("age_s")), reason) if verdict == lk.GONE else
                    lk.held_message(node, lock_file, holder, r.get("age_s"), 0,
                                    reason if verdict == lk.STALE else None))
                return dict(result, acquired=False)
            if verdict != lk.LIVE:
                return dict(result, failed=True, acquired=False, lock_holder=holder,
                            msg=lk.held_message(node, lock_file, holder, r.get("age_s"), stale_reason=reason))
            waited = time.monotonic() - started
            if waited >= wait_s:
                return dict(result, failed=True, acquired=False, lock_holder=holder,
                            msg=lk.held_message(node, lock_file, holder, r.get("age_s"), waited_s=waited))
            if not announced:
                display.display("%s: waiting up to %d s for the cluster lock held by %s"
                                % (node, wait_s, lk.describe(holder, r.get("age_s"))))
                announced = True
            time.sleep(min(poll_s, max(0.0, wait_s - waited)))
