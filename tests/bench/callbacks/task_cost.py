# -*- coding: utf-8 -*-
"""Benchmark aid: what each forked worker costs, without a profiler (docs/benchmarks/task-floor/measure.py cost).

Enabled by ANSIBLE_CALLBACKS_ENABLED naming it, with TRAINYARD_BENCH_TASK_COST the output directory. Wraps the
worker's run method once, in ansible-playbook's own process before any fork, so that each worker writes <pid>.json
when it ends: its task and host, its own CPU from the fork on (getrusage), the CPU of the processes it
waited for (the ssh client of each module run) and how many modules it ran over the connection. At the end of the
playbook ansible-playbook's own CPU goes to main.json. A measurement tool, not product code: it reaches into
ansible-core's worker and action classes, which the product never does (tests/unit/layout/test_public_api_scan.py).
"""

from __future__ import annotations

import json
import os
import resource

from ansible.executor.process import worker
from ansible.plugins.action import ActionBase
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
---
name: task_cost
type: aggregate
short_description: The CPU of every forked worker and of ansible-playbook itself (benchmarks only)
description:
  - Enabled by docs/benchmarks/task-floor/measure.py for its cost run; prints nothing.
"""

_OUT = os.environ.get("TRAINYARD_BENCH_TASK_COST", "")
_run = worker.WorkerProcess.run
_execute_module = ActionBase._execute_module
_MODULES = [0]


def _counted(self, *args, **kwargs):
    _MODULES[0] += 1
    return _execute_module(self, *args, **kwargs)


def _cpu(who):
    use = resource.getrusage(who)
    return use.ru_utime + use.ru_stime


def _measured(self):
    ActionBase._execute_module = _counted
    try:
        return _run(self)
    finally:
        task, host = getattr(self, "_task"), getattr(self, "_host")
        with open(os.path.join(_OUT, "%d.json" % os.getpid()), "w") as f:
            json.dump({"task": task.get_name(), "host": host.name, "cpu_s": _cpu(resource.RUSAGE_SELF),
                       "children_cpu_s": _cpu(resource.RUSAGE_CHILDREN), "modules": _MODULES[0]}, f)


if _OUT:
    worker.WorkerProcess.run = _measured


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_cost"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_stats(self, stats):
        if _OUT:
            with open(os.path.join(_OUT, "main.json"), "w") as f:
                json.dump({"cpu_s": _cpu(resource.RUSAGE_SELF)}, f)
