# -*- coding: utf-8 -*-
"""The module torchrun_launch as Ansible runs any module, and with confirm=true the launch's confirmation shown as
the launch role's one line per node: the node's name before a failure, the module's msg shown without -v."""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action.normal import ActionModule as NormalAction


def confirmed(result, host):
    """The module's result of a confirm=true call as the node's line: a failure of the confirmation ("(node rank N):
    ...") names host first; a success is shown without -v, as assert's success_msg is."""
    if result.get("failed"):
        if str(result.get("msg", "")).startswith("(node rank "):
            result["msg"] = "%s %s" % (host, result["msg"])
    elif result.get("msg"):
        result["_ansible_verbose_always"] = True
    return result


class ActionModule(NormalAction):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        if not boolean(self._task.args.get("confirm", False), strict=False):
            return result
        return confirmed(result, (task_vars or {}).get("inventory_hostname", ""))
