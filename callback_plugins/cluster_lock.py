# -*- coding: utf-8 -*-
"""Give back the cluster locks of this ansible-playbook run when it exits, whether it succeeded, failed or was
interrupted with Ctrl-C: removes the run's marker file, and the lock refreshers (action cluster_lock_guard)
release each node's lock when they see it gone. A run killed with -9 leaves the marker: its locks go stale."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: cluster_lock
type: aggregate
short_description: Release this run's cluster locks when ansible-playbook exits
description:
  - Loaded without being enabled (it prints nothing). At exit it removes the marker file that the action
    C(cluster_lock_guard) created for this ansible-playbook process, which tells the heartbeat refreshers to
    release the nodes' locks; it also removes markers of processes that no longer run.
"""

import atexit
import os
import time

from ansible_collections.trainyard.core.plugins.module_utils import cluster_lock
from ansible_collections.trainyard.core.plugins.module_utils.cluster_lock import MARKER_DIR
from ansible_collections.trainyard.core.plugins.plugin_utils import bases

_REGISTERED = []


def _release_at_exit(marker):
    try:
        os.unlink(marker)
    except OSError:
        pass


def _forget_dead(lk):
    """Markers (and release notes) of ansible-playbook processes killed over an hour ago (their refreshers stopped
    long since)."""
    try:
        names = os.listdir(MARKER_DIR)
    except OSError:
        return
    for name in names:
        # <pid>-<ticks>.held, and <pid>-<ticks>.<key>.released (lk.released_path) a refresher did not take
        stem = name.split(".", 1)[0] if name.endswith((".held", ".released")) else ""
        pid, _, ticks = stem.partition("-")
        path = os.path.join(MARKER_DIR, name)
        try:
            old = time.time() - os.lstat(path).st_mtime > 3600
        except OSError:
            continue
        if old and pid.isdigit() and lk.pid_alive(int(pid), int(ticks) if ticks.isdigit() else None) is False:
            try:
                os.unlink(path)
            except OSError:
                pass


class CallbackModule(bases.AlwaysLoadedCallback):
    CALLBACK_NAME = "cluster_lock"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if _REGISTERED:
            return
        lk = cluster_lock
        _forget_dead(lk)
        pid = os.getpid()
        os.environ[lk.PID_ENV] = str(pid)  # the workers forked later read the run's PID from here
        marker = lk.marker_path(MARKER_DIR, pid, lk.proc_start_ticks(pid))
        atexit.register(_release_at_exit, marker)
        _REGISTERED.append(marker)
