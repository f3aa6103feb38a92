# -*- coding: utf-8 -*-
"""The module torchrun_launch as Ansible runs any module, and with confirm=true the launch's confirmation shown as
the launch role's one line per node: the node's name before a failure, the module's msg shown without -v; a start
that gave the node's cluster lock back (release_lock) tells the callback cluster_lock to stop its heartbeat. With
write_secret_env (the launch role's start), the job's secrets file is written first in the same task: the action reads
the role's launch_secret_env itself, so that no value is in a task argument, a result or the node's log."""

from __future__ import annotations

import posixpath

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
        task_vars = task_vars or {}
        write = boolean(self._task.args.pop("write_secret_env", False), strict=False)
        path = str(self._task.args.get("secret_env_file") or "")
        wrote = None
        if write and path and self._task.args.get("state", "started") == "started":
            wrote = self._write_secrets(path, task_vars)
            if wrote.get("failed"):
                return dict(failed=True, changed=False, msg="%s: writing the job's secrets to %s failed: %s (Fix: "
                            "launch_secret_env_file)" % (task_vars.get("inventory_hostname", ""), path, wrote["msg"]))
        result = super().run(tmp, task_vars)
        if wrote is not None:
            result.update(secret_env_file_changed=wrote["changed"], changed=bool(result.get("changed") or wrote["changed"]))
        if result.get("lock_released"):
            # The callback cluster_lock stops this node's heartbeat now (the run's release task finds it given back).
            lock = self._task.args.get("release_lock") or {}
            result["cluster_lock_keeper"] = {"path": lock.get("path"), "token": lock.get("token"), "hold": False}
        if not boolean(self._task.args.get("confirm", False), strict=False):
            return result
        return confirmed(result, task_vars.get("inventory_hostname", ""))

    def _write_secrets(self, path, task_vars):
        """launch_secret_env as KEY=value lines in path (0600) and its host-only directory (0700, the job's own), in one
        job_files call run as a no_log task would run it (the node logs no argument) and without diff; only whether
        it changed and a failure's message come back."""
        values = self._templar.template(task_vars.get("launch_secret_env") or {})
        content = "".join("%s=%s\n" % (k, v) for k, v in dict(values).items())
        no_log, diff = self._task.no_log, self._task.diff
        self._task.no_log, self._task.diff = True, False
        try:
            wrote = self._execute_module(module_name="job_files", task_vars=task_vars, module_args={
                "directories": [{"path": posixpath.dirname(path), "mode": "0700", "enforce_mode": True}],
                "files": [{"path": path, "content": content, "mode": "0600"}]})
        finally:
            self._task.no_log, self._task.diff = no_log, diff
        return {"changed": bool(wrote.get("changed")), "failed": bool(wrote.get("failed")),
                "msg": str(wrote.get("msg") or "")}
