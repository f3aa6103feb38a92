# -*- coding: utf-8 -*-
"""The container role's first node call: refuse (the role's own option rule, an image left unset) before the role
touches anything, else ask the docker engine what community.docker.docker_host_info answers (or take the answer the
install's probe already has), and read it once for every later task (plugin_utils/container_checks.py
engine_view)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: container_engine_probe
short_description: Refuse where the container role cannot run, else probe the docker engine
description:
  - With I(refuse) not empty, fails with its lines (one a line) and runs nothing on the node; the result carries
    C(refused=true) so a task that ignores the probe's own failures (C(failed_when)) can still stop on it.
  - Otherwise runs C(community.docker.docker_host_info) on the node with the remaining options and returns its
    result (C(can_talk_to_docker), C(host_info), ...), or returns I(answer) where it talked to the engine (nothing
    runs on the node then).
  - Either way adds what the role reads of the answer (C(engine_ok), C(engine_msg), C(runtimes), C(gpus),
    C(gpu_mode)), so that the later tasks read plain values instead of rendering the same verdicts again.
options:
  refuse:
    description: Reasons not to touch the node (the role's C(_container_refusals)).
    type: list
    elements: str
    default: []
  answer:
    description: A C(docker_host_info) result of this run to use instead of asking again (the install's probe, when
      the engine was not started or restarted since); one that did not talk to the engine is asked again.
    type: dict
  container_gpus:
    description: The role's option (C(all), C(auto) or C(none)).
    type: str
    default: auto
  container_gpu_mode:
    description: The role's option (C(auto), C(runtime) or C(devices)).
    type: str
    default: auto
  nvidiactl:
    description: The node has C(/dev/nvidiactl) (an NVIDIA driver is loaded); left out, the action looks on the node
      (C(stat), in check mode too).
    type: bool
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
asked:
  description: This task asked the engine (false where I(answer) served).
  returned: when not refused
  type: bool
engine_ok:
  description: The engine answered (C(can_talk_to_docker)).
  returned: when not refused
  type: bool
engine_msg:
  description: The answer's message, whitespace-normalised (C(no answer) when it has none).
  returned: when not refused
  type: str
runtimes:
  description: The engine's runtimes.
  returned: when not refused
  type: list
gpus:
  description: The training container gets GPUs (I(container_gpus) C(all), or C(auto) with I(nvidiactl)).
  returned: when not refused
  type: bool
gpu_mode:
  description: C(runtime) or C(devices) (I(container_gpu_mode) C(auto) resolved by the engine's runtimes).
  returned: when not refused
  type: str
"""

from ansible.plugins.action import ActionBase
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, container_checks

_VIEW_ARGS = ("answer", "container_gpus", "container_gpu_mode", "nvidiactl")


class ActionModule(bases.ReadingModules, ActionBase):
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
        view = {k: args.pop(k, None) for k in _VIEW_ARGS}
        if view["nvidiactl"] is None:
            view["nvidiactl"] = self._nvidiactl(task_vars)
        answer = view["answer"] if isinstance(view["answer"], dict) else {}
        asked = not answer.get("can_talk_to_docker")
        if asked:
            answer = self._execute_module(module_name="community.docker.docker_host_info", module_args=args,
                                          task_vars=task_vars)
        result.update(answer, asked=asked)
        result.update(container_checks.engine_view(answer, view["container_gpus"] or "auto",
                                                   view["container_gpu_mode"] or "auto", view["nvidiactl"]))
        return result

    def _nvidiactl(self, task_vars):
        """Whether the node has /dev/nvidiactl (a stat that reads only, run in check mode too)."""
        answer = self.run_reading_module("ansible.legacy.stat", {"path": "/dev/nvidiactl", "get_checksum": False},
                                         task_vars)
        return bool((answer.get("stat") or {}).get("exists"))
