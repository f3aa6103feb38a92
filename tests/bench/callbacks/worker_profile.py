# -*- coding: utf-8 -*-
"""Benchmark aid: cProfile, in CPU time, of every worker Ansible forks (docs/benchmarks/task-floor/measure.py profile).

Enabled by ANSIBLE_CALLBACKS_ENABLED naming it, with TRAINYARD_BENCH_WORKER_PROFILE the output directory and, if set,
TRAINYARD_BENCH_WORKER_PROFILE_TASK a part of the task names to profile (every task otherwise). Wraps the worker's
run method once, in ansible-playbook's own process before any fork, so that each profiled worker writes <pid>.prof
(pstats) and <pid>.task (the task's name) when it ends. A measurement tool, not product code: it reaches into
ansible-core's worker class, which the product never does (tests/unit/layout/test_public_api_scan.py).
"""

from __future__ import annotations

import cProfile
import os
import time

from ansible.executor.process import worker
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
---
name: worker_profile
type: aggregate
short_description: cProfile of every forked worker (benchmarks only)
description:
  - Enabled by docs/benchmarks/task-floor/measure.py for its profiled run; prints nothing.
"""

_OUT = os.environ.get("TRAINYARD_BENCH_WORKER_PROFILE", "")
_TASK = os.environ.get("TRAINYARD_BENCH_WORKER_PROFILE_TASK", "")
_run = worker.WorkerProcess.run


def _profiled(self):
    if _TASK not in (getattr(self, "_task").get_name() or ""):
        return _run(self)
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    try:
        return _run(self)
    finally:
        prof.disable()
        pid = os.getpid()
        prof.dump_stats(os.path.join(_OUT, "%d.prof" % pid))
        with open(os.path.join(_OUT, "%d.task" % pid), "w") as f:
            f.write(getattr(self, "_task").get_name())


if _OUT:
    worker.WorkerProcess.run = _profiled


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "worker_profile"
    CALLBACK_NEEDS_ENABLED = True
