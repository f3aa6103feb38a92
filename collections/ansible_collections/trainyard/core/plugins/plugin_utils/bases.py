# -*- coding: utf-8 -*-
"""Base classes of the project's controller plugins.

``ControllerAction``: the action plugins that run on the controller only (validations, the recover plan, the
preflight records): no connection to the host, no files sent, the task's arguments read and checked, one pure
function run, its answer returned as the task's result (never a change). A plugin writes
``decide(args, task_vars)``: it returns the keys of the result (``failed`` and ``msg`` included when it fails) or
raises ``AnsibleActionFail`` for bad arguments; ``str_list`` and ``need_dict`` read arguments with one message
shape.

``AlwaysLoadedCallback``: a callback that Ansible loads from ``callback_plugins/`` without being enabled and that
prints nothing (an ``aggregate`` callback); a plugin sets ``CALLBACK_NAME``.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.plugins.callback import CallbackBase


class ControllerAction(ActionBase):
    """An action that runs on the controller only; subclasses implement decide()."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def decide(self, args, task_vars):
        raise NotImplementedError

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result["changed"] = False
        result.update(self.decide(self._task.args, task_vars or {}))
        return result


def str_list(value):
    """An argument given as one string or a list of them, as a list ([] for none)."""
    if not value:
        return []
    return [value] if isinstance(value, str) else list(value)


def need_dict(value, what):
    """value when it is a dict, else AnsibleActionFail naming what it must be and what it is (the YAML type, not
    Ansible's tagged class)."""
    if not isinstance(value, dict):
        kind = next((name for typ, name in ((bool, "bool"), (str, "str"), (int, "int"), (float, "float"),
                                            (list, "list")) if isinstance(value, typ)), type(value).__name__)
        raise AnsibleActionFail(f"{what} must be a dict, not {kind}")
    return value


class AlwaysLoadedCallback(CallbackBase):
    """A callback loaded without being enabled, printing nothing; subclasses set CALLBACK_NAME."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NEEDS_ENABLED = False
