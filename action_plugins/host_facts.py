# -*- coding: utf-8 -*-
"""Action of the host_facts module: the controller's clock just before and just after the module runs, so the one
round trip that reads the host basics also measures the node's clock offset (the midpoint of the window) and its
error bound (half the window). The module's trainyard_init is published as a host variable, not a fact. I(keep) stays
on the controller: the result carries it as C(kept)."""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, check_records


class ActionModule(bases.KeepingModule, ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        before = time.time()
        result.update(self.run_keeping("host_facts", task_vars, default={}))
        after = time.time()
        if isinstance(result.get("time"), float):
            result["clock"] = {"offset": result["time"] - (before + after) / 2, "uncertainty": (after - before) / 2}
        # trainyard_init as a host variable, not a fact (plugin_utils/check_records.py, publish)
        return check_records.publish_task_result(result, self._task, task_vars)
