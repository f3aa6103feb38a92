# -*- coding: utf-8 -*-
"""Keep this ansible-playbook run's cluster locks alive and give them back when it exits, whether it succeeded, failed
or was interrupted with Ctrl-C: a heartbeat thread in ansible-playbook's own process (plugin_utils/lock_keeper.py).
A run killed with -9 takes the thread with it: its locks go stale."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: cluster_lock
type: aggregate
short_description: Refresh this run's cluster locks while ansible-playbook lives, release them when it exits
description:
  - "Loaded without being enabled (it prints nothing but a heartbeat's failure). It reads C(cluster_lock_keeper) from
    the results of the action C(cluster_lock_guard): the locks this run took and gave back."
  - While the run holds a lock, a thread of this process touches it every C(cluster_lock_stale_s)/4 seconds (at least
    1 s) in an ad-hoc run (C(python -m ansible.cli.adhoc)) with the run's own inventory and connection options, one
    run for every node of a lock directory, through the module C(raw) running one fixed shell script (no module sent,
    no Python started on the node).
  - At exit it gives back every lock the run still holds (a run that failed before playbooks/unlock.yml, or was
    interrupted). A run killed with C(-9) leaves its locks; they go stale after C(cluster_lock_stale_s).
"""

import atexit
import os
import time

from ansible import context
from ansible.utils.display import Display
from ansible_collections.trainyard.core.plugins.module_utils import cluster_lock
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, lock_keeper

display = Display()
# action_plugins/cluster_lock_guard.py, the one action that takes and gives back the lock; torchrun_launch, whose start
# gives a node's lock back where it is the node's last change of the run (release_lock)
GUARD_ACTIONS = ("cluster_lock_guard", "torchrun_launch")
_HEARTBEAT = []  # one per ansible-playbook process, however many times the callback is loaded


def heartbeat():
    if not _HEARTBEAT:
        beat = lock_keeper.Heartbeat(lock_keeper.Keeper(), dict(context.CLIARGS))
        atexit.register(beat.release_at_exit)
        _HEARTBEAT.append(beat)
    return _HEARTBEAT[0]


class CallbackModule(bases.AlwaysLoadedCallback):
    CALLBACK_NAME = "cluster_lock"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The workers forked later read the run's PID from here (the action records it as the lock's holder).
        os.environ[cluster_lock.PID_ENV] = str(os.getpid())
        self._shown = 0

    def v2_runner_on_ok(self, result):
        # Only the actions of GUARD_ACTIONS return cluster_lock_keeper: any other task's result is never read
        # (result.result converts the whole result to plain types, per host and task, in ansible-playbook itself).
        if str(result.task.action).rsplit(".", 1)[-1] not in GUARD_ACTIONS:
            return
        keep = result.result.get("cluster_lock_keeper")
        if keep is None:
            return
        beat = heartbeat()
        beat.keeper.note(result.host.get_name(), keep, time.monotonic())
        if beat.keeper.holding():
            beat.start()

    def _show_problems(self):
        if _HEARTBEAT and len(_HEARTBEAT[0].problems) > self._shown:
            for line in _HEARTBEAT[0].problems[self._shown:]:
                display.warning(line)
            self._shown = len(_HEARTBEAT[0].problems)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._show_problems()

    def v2_playbook_on_stats(self, stats):
        self._show_problems()
