# -*- coding: utf-8 -*-
"""Action of the nvidia_gpu_facts module: runs the module on the node as it is; I(keep) stays on the controller, and the
result carries it as C(kept) (the role's record task, run once for every node, reads each node's options there)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.trainyard.core.plugins.plugin_utils import bases


class ActionModule(bases.KeepingModule, ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(self.run_keeping("nvidia_gpu_facts", task_vars))
        return result
