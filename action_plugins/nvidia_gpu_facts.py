# -*- coding: utf-8 -*-
"""Action of the nvidia_gpu_facts module: runs the module on the node as it is; I(keep) stays on the controller, and the
result carries it as C(kept) (the role's record task, run once for every node, reads each node's options there)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        kept = args.pop("keep", None)
        result.update(self._execute_module(module_name="nvidia_gpu_facts", module_args=args, task_vars=task_vars))
        if kept is not None:
            result["kept"] = kept
        return result
