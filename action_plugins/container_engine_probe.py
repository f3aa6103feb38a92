# -*- coding: utf-8 -*-
"""The container role's first node call: refuse (the role's own option rule, an image left unset) before the role
touches anything, else ask the docker engine what community.docker.docker_host_info answers (or take the answer the
install's probe already has), read it once for every later task (plugin_utils/container_checks.py engine_view), and
where the engine answers, log in to the registry and pull the training image in the same task."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: container_engine_probe
short_description: Refuse where the container role cannot run, else probe the docker engine and pull the image
description:
  - With I(refuse) not empty, fails with its lines (one a line) and runs nothing on the node; the result carries
    C(refused=true) so a task that ignores the probe's own failures (C(failed_when)) can still stop on it.
  - Otherwise runs C(community.docker.docker_host_info) on the node with the remaining options and returns its
    result (C(can_talk_to_docker), C(host_info), ...), or returns I(answer) where it talked to the engine (nothing
    runs on the node then).
  - Either way adds what the role reads of the answer (C(engine_ok), C(engine_msg), C(runtimes), C(gpus),
    C(gpu_mode)), so that the later tasks read plain values instead of rendering the same verdicts again.
  - "With I(pull), where the engine answers: with I(login), C(community.docker.docker_login) logs in to the registry;
    then C(community.docker.docker_image_pull) pulls the image. Their answers are the result's C(pull) (the login's,
    without its arguments, under C(pull.login)); the task is changed where the pull (or the login) changed the node."
  - "In check mode, where the pull would change the node (it would pull), C(docker manifest inspect -v) asks the
    registry from the node whether the pull would work and which digest it would get, once more with C(--insecure)
    when the first read fails (a plain-HTTP registry in the engine's insecure-registries): C(pull.manifest), for the
    role's C(container.registry_reach) record (plugin_utils/container_checks.py)."
  - "Where the pull gave no image (it failed) or in check mode, C(community.docker.docker_image_info) reads the image
    the node has now (I(read)): C(pull.image_info), which the role's digest comparison reads (filter
    container_image_identities)."
  - A failed login or pull is the result's (C(pull.login.msg), C(pull.msg)), never the task's; the role's records say
    what failed. The password is the role's option C(container_registry_password), read from the node's variables by
    the action itself, so that it is in no task argument and no result.
  - "With I(gpu_paths), where the container gets GPUs in gpu mode C(devices) (the engine has no NVIDIA runtime, or
    C(container_gpu_mode: devices)): the module container_gpu_paths reads the node's NVIDIA device nodes, the
    driver's libraries in the ld cache and nvidia-smi in one call, and the result's C(gpu_paths) says what the
    container gets (C(plugin_utils/container_checks.py) C(gpu_paths): the libraries that carry the running driver's
    version, the fact C(nvidia_gpu_facts)'s C(driver_version))."
  - The probe and the reads run in check mode too; the login and the pull honour it.
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
  pull:
    description: C(docker_image_pull)'s arguments (C(name), C(pull)); left out, nothing is pulled (the read-only path).
    type: dict
  login:
    description: C(docker_login)'s arguments but the password (C(registry_url), C(username), C(reauthorize)); left
      out, there is no login. Only with I(pull).
    type: dict
  reach:
    description: In check mode, ask the registry where the pull would change the node.
    type: bool
    default: true
  read:
    description: Read the image the node has where the pull gave none or in check mode (C(pull.image_info)).
    type: bool
    default: true
  gpu_paths:
    description: C({lib_dir, nvidia_smi_paths}), the role's C(container_gpu_driver_lib_dir) and
      C(container_gpu_nvidia_smi_paths); left out, gpu mode C(devices) reads nothing here.
    type: dict
extends_documentation_fragment: [trainyard.core.attributes]
"""

EXAMPLES = r"""
- name: Probe the docker engine (refusing first where container_image is not set)
  container_engine_probe:
    refuse: "{{ _container_refusals }}"
    pull:
      name: registry.example.com/team/train:2024-11
      pull: not_present
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
gpu_paths:
  description: What gpu mode C(devices) gives the container, C({devices, driver_libs, nvidia_smi, driver_version,
    driver_lib_dir}) (C(driver_libs) as C(container_checks.driver_lib_mounts) returns it).
  returned: with I(gpu_paths), where the container gets GPUs in gpu mode devices
  type: dict
pull:
  description: The pull's answer (C(image), the pulled image's inspect data, or C(msg) where it failed), with C(login),
    C(manifest) (check mode) and C(image_info) as described above.
  returned: with I(pull), where the engine answers
  type: dict
"""

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, container_checks

_VIEW_ARGS = ("answer", "container_gpus", "container_gpu_mode", "nvidiactl", "gpu_paths")
_PULL_ARGS = ("pull", "login", "reach", "read")
_ANSWER = ("rc", "stdout", "stderr", "msg")


class ActionModule(bases.ReadingModules, ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        refuse = args.pop("refuse", None) or []
        if isinstance(refuse, str):
            refuse = [refuse]
        if refuse:
            result.update(failed=True, refused=True, msg="\n".join(str(r) for r in refuse))
            return result
        view = {k: args.pop(k, None) for k in _VIEW_ARGS}
        steps = {k: args.pop(k, None) for k in _PULL_ARGS}
        if view["nvidiactl"] is None:
            view["nvidiactl"] = self._nvidiactl(task_vars)
        answer = view["answer"] if isinstance(view["answer"], dict) else {}
        asked = not answer.get("can_talk_to_docker")
        if asked:
            answer = self.run_reading_module("community.docker.docker_host_info", args, task_vars)
        result.update(answer, asked=asked, changed=False)
        result.update(container_checks.engine_view(answer, view["container_gpus"] or "auto",
                                                   view["container_gpu_mode"] or "auto", view["nvidiactl"]))
        if view["gpu_paths"] is not None and result["gpus"] and result["gpu_mode"] == "devices":
            result["gpu_paths"] = self._gpu_paths(view["gpu_paths"], task_vars)
        if steps["pull"] and result["engine_ok"]:
            result["pull"] = self._pull(steps, task_vars)
            result["changed"] = bool(result["pull"].get("changed") or (result["pull"].get("login") or {}).get("changed"))
        return result

    def _nvidiactl(self, task_vars):
        """Whether the node has /dev/nvidiactl (a stat that reads only, run in check mode too)."""
        answer = self.run_reading_module("ansible.legacy.stat", {"path": "/dev/nvidiactl", "get_checksum": False},
                                         task_vars)
        return bool((answer.get("stat") or {}).get("exists"))

    def _gpu_paths(self, arg, task_vars):
        """gpu mode devices: the node's device nodes, driver libraries and nvidia-smi, read in one call, against the
        running driver's version."""
        arg = bases.need_dict(arg, "container_engine_probe: 'gpu_paths'", " ({lib_dir, nvidia_smi_paths})")
        smi_paths = arg.get("nvidia_smi_paths")
        read = self.run_reading_module("container_gpu_paths", {} if smi_paths is None else
                                       {"nvidia_smi_paths": smi_paths}, task_vars)
        facts = task_vars.get("nvidia_gpu_facts") or {}
        return container_checks.gpu_paths(read, facts.get("driver_version", ""),
                                          str(arg.get("lib_dir") or container_checks.DRIVER_LIB_DIR))

    def _pull(self, steps, task_vars):
        """The login (where given), the pull, in check mode the registry's answer, and the read of the image where the
        pull gave none: the pull's answer with the others under login, manifest and image_info."""
        pull_args = bases.need_dict(steps["pull"], "container_engine_probe: 'pull'", " (docker_image_pull's arguments)")
        login = None
        if steps["login"]:
            login_args = dict(bases.need_dict(steps["login"], "container_engine_probe: 'login'",
                                              " (docker_login's arguments)"),
                              password=self._templar.template(task_vars.get("container_registry_password", "")))
            login = self._execute_module(module_name="community.docker.docker_login", module_args=login_args,
                                         task_vars=task_vars)
            login = {k: v for k, v in login.items() if k in ("login_result", "failed", "msg", "changed")}
        pulled = self._execute_module(module_name="community.docker.docker_image_pull", module_args=pull_args,
                                      task_vars=task_vars)
        pulled.pop("invocation", None)
        pulled.pop("failed", None)
        if login is not None:
            pulled["login"] = login
        image = str(pull_args.get("name", ""))
        check_mode = self._task.check_mode
        if check_mode and pulled.get("changed") and boolean(steps["reach"] if steps["reach"] is not None else True,
                                                            strict=False):
            pulled["manifest"] = self._manifest(image, task_vars)
        if (check_mode or not pulled.get("image")) and boolean(steps["read"] if steps["read"] is not None else True,
                                                               strict=False):
            pulled["image_info"] = self.run_reading_module("community.docker.docker_image_info", {"name": image},
                                                           task_vars)
        return pulled

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
