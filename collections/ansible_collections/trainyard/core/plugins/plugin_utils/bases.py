# -*- coding: utf-8 -*-
"""Base classes of the project's controller plugins: ``ControllerAction`` for the actions that run on the
controller only (no connection, no files; the task's arguments in, one pure function, its answer out as the
result, never a change), ``ReadingModules`` for an action that runs modules that only read (check mode too),
``AlwaysLoadedCallback`` for the callbacks loaded without being enabled."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.plugins.callback import CallbackBase

from ansible_collections.trainyard.core.plugins.plugin_utils import check_records


class ReadingModules:
    """For an action that also runs modules that only read (mixed in before ActionBase)."""

    def run_reading_module(self, name, module_args, task_vars):
        """The answer (without its invocation) of a module that only reads, run in check mode as well, as a task with
        check_mode: false runs it (the task's check mode would make a module such as command skip)."""
        check_mode = self._task.check_mode
        self._task.check_mode = False
        try:
            answer = self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)
        finally:
            self._task.check_mode = check_mode
        answer.pop("invocation", None)
        return answer


class KeepingModule:
    """For the action of a module whose task may give I(keep): values of the node that stay on the controller (they are
    not sent to the node) and come back in the result as C(kept), for a later task that runs once for every node and
    reads each node's own options there (mixed in before ActionBase)."""

    def run_keeping(self, module_name, task_vars, default=None):
        """The module's result on the task's arguments less keep, with kept (keep, or default when the task gives
        none and default is not None)."""
        args = dict(self._task.args)
        kept = args.pop("keep", None)
        result = self._execute_module(module_name=module_name, module_args=args, task_vars=task_vars)
        if kept is None:
            kept = default
        if kept is not None:
            result["kept"] = kept
        return result


class ControllerAction(ReadingModules, ActionBase):
    """Subclasses write decide(args, task_vars): the result's keys (failed and msg when it fails), or
    AnsibleActionFail for bad arguments."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def decide(self, args, task_vars):
        raise NotImplementedError

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result["changed"] = False
        result.update(self.decide(self._task.args, task_vars or {}))
        return self.publish(result, task_vars or {})

    def publish(self, result, task_vars):
        """result with the values it publishes (ansible_facts) handed to the callback preflight_records as host
        variables (plugin_utils/check_records.py, publish)."""
        return check_records.publish_task_result(result, self._task, task_vars)

    def var(self, task_vars, name, default=None):
        """A variable of this host, templated (an inventory value may be a template); default when unset."""
        if name not in task_vars:
            return default
        return self._templar.template(task_vars[name])

    def record(self, task_vars, *records):
        """preflight_check's result recording `records` for this host: an action records its checks itself."""
        from ansible.plugins.loader import action_loader

        recorder = action_loader.get("preflight_check", task=self._task, connection=self._connection,
                                     play_context=self._play_context, loader=self._loader, templar=self._templar,
                                     shared_loader_obj=self._shared_loader_obj)
        return recorder.decide({"records": list(records)}, task_vars)


def str_list(value):
    """An argument given as one string or a list of them, as a list ([] for none)."""
    if not value:
        return []
    return [value] if isinstance(value, str) else list(value)


def need_dict(value, what, hint=""):
    """value when it is a dict, else AnsibleActionFail naming what it must be and what it is (the YAML type, not
    Ansible's tagged class), then hint (what to give instead)."""
    if not isinstance(value, dict):
        kind = next((name for typ, name in ((bool, "bool"), (str, "str"), (int, "int"), (float, "float"),
                                            (list, "list")) if isinstance(value, typ)), type(value).__name__)
        raise AnsibleActionFail(f"{what} must be a dict, not {kind}{hint}")
    return value


class AlwaysLoadedCallback(CallbackBase):
    """A callback (callback_plugins/) loaded without being enabled, printing nothing; subclasses set CALLBACK_NAME."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NEEDS_ENABLED = False
