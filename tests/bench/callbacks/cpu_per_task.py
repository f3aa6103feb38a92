# -*- coding: utf-8 -*-
"""Benchmark aid (tests/bench/scale.py): the controller and the nodes' CPU of every task, all hosts together.

Reads the cpuacct cgroup the measured ansible-playbook runs in (TRAINYARD_BENCH_CGROUP) when each task starts; with
the linear strategy a task's workers have all ended when the next task starts, so the difference is that task's
CPU (its workers, their SSH clients and the main process meanwhile). The nodes' CPU the same way from the
cpuacct.usage files named in TRAINYARD_BENCH_NODE_CGROUPS (colon-separated), and ansible-playbook's own CPU (this
process: os.times()). Writes [[task, controller CPU-s, nodes' CPU-s, ansible-playbook's CPU-s], ...] in run order
to TRAINYARD_BENCH_TASK_CPU when the playbook ends, and names the current task in TRAINYARD_BENCH_TASK for the workers (the bench's ssh wrapper logs it with every SSH execution).
"""

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
---
name: cpu_per_task
type: aggregate
short_description: Controller CPU per task from the run's cpuacct cgroup (benchmarks only)
description:
  - Enabled by tests/bench/scale.py for its measured runs; prints nothing.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "cpu_per_task"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._usage = os.path.join(os.environ["TRAINYARD_BENCH_CGROUP"], "cpuacct.usage")
        self._nodes = [p for p in os.environ.get("TRAINYARD_BENCH_NODE_CGROUPS", "").split(":") if p]
        self._rows: list[list] = []
        self._task: str | None = None
        self._since = (0.0, 0.0, 0.0)

    @staticmethod
    def _read(path: str) -> float:
        try:
            with open(path) as f:
                return int(f.read()) / 1e9
        except OSError:
            return 0.0

    def _mark(self, name: str | None) -> None:
        own = os.times()
        now = (self._read(self._usage), sum(self._read(p) for p in self._nodes), own.user + own.system)
        if self._task is not None:
            self._rows.append([self._task, round(now[0] - self._since[0], 3), round(now[1] - self._since[1], 3),
                               round(now[2] - self._since[2], 3)])
        self._task, self._since = name, now
        # the task's workers inherit it: tests/bench/scale.py's ssh wrapper logs each SSH execution's task
        os.environ["TRAINYARD_BENCH_TASK"] = name or ""

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._mark(task.get_name())

    def v2_playbook_on_handler_task_start(self, task):
        self._mark(task.get_name())

    def v2_playbook_on_stats(self, stats):
        self._mark(None)
        with open(os.environ["TRAINYARD_BENCH_TASK_CPU"], "w") as f:
            json.dump(self._rows, f)
