# -*- coding: utf-8 -*-
"""Create the training container's mounted directories, then start the container, in one task per node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: container_start
short_description: Create the mounted directories on the node, then start the training container
description:
  - "One task per node for the container role's two steps on the node: C(mount_dirs) creates every mount source and
    gives the job's user what it writes (I(dirs)), then, with I(start), C(community.docker.docker_container) starts
    (or recreates) the training container (I(container))."
  - A failure of the directories fails the task with C(mount_dirs)' message, and the container is not started. A
    failure of the start is the result's (C(msg), C(start_failed)), never the task's; the role's check
    C(container.running) records it.
  - "With I(read), where the start gave no container (it did not run, or failed) or in check mode (its answer is the
    container it would make), C(community.docker.docker_container_info) reads the container the node has now, run in
    check mode too; the answer is the result's C(info), which the role's C(container.running) check compares."
  - Both steps honour check mode and diff mode as their modules do.
options:
  dirs:
    description: C(mount_dirs)' arguments (C(directories), C(writable), C(uid), C(gid), C(group_dir)).
    type: dict
    required: true
  start:
    description: Start the container after the directories (the image is on the node).
    type: bool
    default: true
  container:
    description: C(community.docker.docker_container)' arguments.
    type: dict
    required: true
  read:
    description: Read the container (C(info)) where the start gave none or in check mode; false where the engine
      does not answer.
    type: bool
    default: false
extends_documentation_fragment: [trainyard.core.attributes]
"""

EXAMPLES = r"""
- name: Create the mounted directories and start the training container
  container_start:
    dirs:
      directories: [/srv/outputs, /srv/shared]
      writable: [/srv/outputs]
      uid: 65532
      gid: 65532
    start: "{{ __container_engine.pull.image is defined }}"
    container:
      name: trainyard-train
      image: registry.example.com/team/train:2024-11
      state: started
      network_mode: host
  register: __container_run
"""

RETURN = r"""
dirs:
  description: C(mount_dirs)' result (without its invocation).
  returned: always
  type: dict
container:
  description: The container's inspect data, as C(community.docker.docker_container) returns it.
  returned: when the start answered
  type: dict
msg:
  description: Why the start failed.
  returned: when the start failed
  type: str
start_failed:
  description: The start failed (C(msg) says why).
  returned: when the start ran
  type: bool
info:
  description: C(docker_container_info)'s answer (C(exists), C(container), or C(failed) and C(msg)), without its
    arguments.
  returned: with I(read), where the start gave no container or in check mode
  type: dict
"""

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.trainyard.core.plugins.plugin_utils import bases


class ActionModule(bases.ReadingModules, ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = self._steps(super().run(tmp, task_vars), task_vars)
        if (not result.get("failed") and boolean(self._task.args.get("read", False), strict=False)
                and (self._task.check_mode or "container" not in result)):
            result["info"] = self.run_reading_module("community.docker.docker_container_info",
                                                     {"name": self._task.args["container"].get("name")}, task_vars)
        return result

    def _steps(self, result, task_vars):
        """The directories, then the container: result updated with both answers."""
        args = self._task.args
        dirs_args = bases.need_dict(args.get("dirs"), "container_start: 'dirs'", " (mount_dirs' arguments)")
        container_args = bases.need_dict(args.get("container"), "container_start: 'container'",
                                         " (docker_container's arguments)")
        dirs = self._execute_module(module_name="mount_dirs", module_args=dirs_args, task_vars=task_vars)
        dirs.pop("invocation", None)
        result.update(changed=bool(dirs.get("changed")), dirs=dirs)
        if dirs.get("failed"):
            result.update(failed=True, msg=dirs.get("msg", "mount_dirs failed"))
            return result
        if not boolean(args.get("start", True), strict=False):
            return result
        started = self._execute_module(module_name="community.docker.docker_container", module_args=container_args,
                                       task_vars=task_vars)
        started.pop("invocation", None)
        failed = bool(started.pop("failed", False))
        changed = bool(started.pop("changed", False))
        result.update(started, start_failed=failed, changed=result["changed"] or changed)
        return result
