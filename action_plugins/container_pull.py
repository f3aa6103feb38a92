# -*- coding: utf-8 -*-
"""Log in to the image registry where the role has credentials, pull the training image, and in check mode ask the
registry whether the pull would work, in one task per node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: container_pull
short_description: Log in to the registry, pull the training image, and in check mode ask the registry
description:
  - "One task per node for the container role's image steps: with I(login), C(community.docker.docker_login) logs in
    to the registry; then C(community.docker.docker_image_pull) pulls the image (I(pull)). The result is the pull's,
    with the login's (without its arguments) under C(login)."
  - "In check mode, where the pull would change the node (it would pull), C(docker manifest inspect -v) asks the
    registry from the node whether the pull would work and which digest it would get, once more with C(--insecure)
    when the first read fails (a plain-HTTP registry in the engine's insecure-registries); the answer is the
    result's C(manifest), for the role's C(container.registry_reach) record (plugin_utils/container_checks.py)."
  - "Where the pull gave no image (it failed) or in check mode (its image is the one the node would have),
    C(community.docker.docker_image_info) reads the image the node has now, run in check mode too (I(read)); the answer
    is the result's C(image_info), which the role's digest comparison reads (filter container_image_identities)."
  - A failed login or pull is the result's (C(login.msg), C(msg)), never the task's; the role's records say what
    failed.
  - The password is the role's option C(container_registry_password), read from the node's variables by the action
    itself, so that it is in no task argument and no result (the login's result is kept without its arguments).
options:
  login:
    description: C(docker_login)' arguments but the password (C(registry_url), C(username), C(reauthorize)); left out,
      there is no login.
    type: dict
  pull:
    description: C(docker_image_pull)' arguments (C(name), C(pull)).
    type: dict
    required: true
  reach:
    description: In check mode, ask the registry where the pull would change the node.
    type: bool
    default: true
  read:
    description: Read the image the node has where the pull gave none or in check mode (C(image_info)).
    type: bool
    default: true
extends_documentation_fragment: [trainyard.core.attributes]
"""

EXAMPLES = r"""
- name: Log in where there are credentials, pull the training image
  container_pull:
    login: "{{ {'registry_url': _container_registry, 'username': container_registry_username}
               if container_registry_username | length > 0 else omit }}"
    pull:
      name: "{{ container_image }}"
      pull: not_present
  register: __container_pull
"""

RETURN = r"""
image:
  description: The pulled image's inspect data, as C(docker_image_pull) returns it.
  returned: when the pull answered
  type: dict
msg:
  description: Why the pull failed.
  returned: when the pull failed
  type: str
login:
  description: The login's result (C(login_result), or C(failed) and C(msg)), without its arguments.
  returned: with I(login)
  type: dict
image_info:
  description: C(docker_image_info)'s answer for the image (C(images), or C(failed) and C(msg)), without its arguments.
  returned: with I(read), where the pull gave no image or in check mode
  type: dict
manifest:
  description: The registry's answer in check mode (C(rc), C(stdout), C(stderr) of C(docker manifest inspect -v)).
  returned: in check mode, where the pull would change the node
  type: dict
"""

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.trainyard.core.plugins.plugin_utils import bases

_ANSWER = ("rc", "stdout", "stderr", "msg")


class ActionModule(bases.ReadingModules, ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args, task_vars = self._task.args, task_vars or {}
        pull_args = bases.need_dict(args.get("pull"), "container_pull: 'pull'", " (docker_image_pull's arguments)")
        login = None
        if args.get("login"):
            login_args = dict(bases.need_dict(args["login"], "container_pull: 'login'", " (docker_login's arguments)"),
                              password=self._templar.template(task_vars.get("container_registry_password", "")))
            login = self._execute_module(module_name="community.docker.docker_login", module_args=login_args,
                                         task_vars=task_vars)
            login = {k: v for k, v in login.items() if k in ("login_result", "failed", "msg", "changed")}
        pulled = self._execute_module(module_name="community.docker.docker_image_pull", module_args=pull_args,
                                      task_vars=task_vars)
        pulled.pop("invocation", None)
        pulled.pop("failed", None)
        result.update(pulled)
        if login is not None:
            result["login"] = login
        image = str(pull_args.get("name", ""))
        if self._task.check_mode and result.get("changed") and boolean(args.get("reach", True), strict=False):
            result["manifest"] = self._manifest(image, task_vars)
        if (self._task.check_mode or not result.get("image")) and boolean(args.get("read", True), strict=False):
            result["image_info"] = self.run_reading_module("community.docker.docker_image_info", {"name": image},
                                                           task_vars)
        return result

    def _manifest(self, image, task_vars):
        """docker manifest inspect -v on the node (read-only, run in check mode too), again with --insecure when the
        first read fails."""
        answer = self.run_reading_module("ansible.legacy.command",
                                         {"argv": ["docker", "manifest", "inspect", "-v", image]}, task_vars)
        if answer.get("rc") != 0:
            answer = self.run_reading_module(
                "ansible.legacy.command", {"argv": ["docker", "manifest", "inspect", "-v", "--insecure", image]},
                task_vars)
        return {k: answer[k] for k in _ANSWER if k in answer}
