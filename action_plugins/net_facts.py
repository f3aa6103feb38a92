# -*- coding: utf-8 -*-
"""Action of the net_facts module: the module's network_iface, network_address and _network_mtu published as host
variables, not facts (plugin_utils/check_records.py, publish); the rest of its result as the module returns it."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.trainyard.core.plugins.plugin_utils import check_records


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(self._execute_module(module_name="net_facts", module_args=self._task.args,
                                           task_vars=task_vars))
        return check_records.publish_task_result(result, self._task, task_vars)
