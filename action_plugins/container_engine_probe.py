# -*- coding: utf-8 -*-
"""The container role's first node call: refuse (the role's own option rule, an image left unset) before the role
touches anything, else ask the docker engine what community.docker.docker_host_info answers."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: container_engine_probe
short_description: Refuse where the container role cannot run, else probe the docker engine
description:
  - With I(refuse) not empty, fails with its lines (one a line) and runs nothing on the node; the result carries
    C(refused=true) so a task that ignores the probe's own failures (C(failed_when)) can still stop on it.
  - Otherwise runs C(community.docker.docker_host_info) on the node with the remaining options and returns its
    result (C(can_talk_to_docker), C(host_info), ...).
options:
  refuse:
    description: Reasons not to touch the node (the role's C(_container_refusals)).
    type: list
    elements: str
    default: []
  docker_host:
    description: Passed to C(community.docker.docker_host_info) when given.
    type: str
extends_documentation_fragment: [trainyard.core.attributes]
"""

EXAMPLES = r"""
- name: Probe the docker engine (refusing first where container_image is not set)
  container_engine_probe:
    refuse: "{{ _container_refusals }}"
  register: __container_engine
  failed_when: __container_engine.refused | default(false)
"""

RETURN = r"""
refused:
  description: The probe refused (I(refuse) was not empty); nothing ran on the node.
  returned: when refused
  type: bool
can_talk_to_docker:
  description: As C(community.docker.docker_host_info) returns it.
  returned: when not refused
  type: bool
host_info:
  description: As C(community.docker.docker_host_info) returns it.
  returned: when the engine answers
  type: dict
"""

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        refuse = args.pop("refuse", None) or []
        if isinstance(refuse, str):
            refuse = [refuse]
        if refuse:
            result.update(failed=True, refused=True, msg="\n".join(str(r) for r in refuse))
            return result
        result.update(self._execute_module(module_name="community.docker.docker_host_info", module_args=args,
                                           task_vars=task_vars))
        return result
