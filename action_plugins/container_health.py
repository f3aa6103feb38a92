# -*- coding: utf-8 -*-
"""Run the health probe inside the training container and record every check of the container role, in one task."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: container_health
short_description: Record every check of the container role, running the in-container health probe, in one task
description:
  - "One task per node for the role's last step. Records, as C(preflight_check) does, the engine and GPU checks (from
    the engine probe's result, I(engine)), the login, the pull and in check mode the registry's answer (I(pull)), the
    image digest (I(digest)),
    the container against its wanted configuration (I(run), else I(info)), then the C(container.health.*) records:
    C(community.docker.docker_container_exec) runs the health probe (the role's C(files/container_health.py)) inside
    the training container. The verdicts are plugin_utils/container_checks.py's (verify_inputs, health_records)."
  - "Reads the role's options from the variables of the node, templated once each: C(container_name),
    C(container_image), C(container_registry_username), C(container_user), C(container_cap_add),
    C(container_no_new_privileges), C(container_ulimits), C(container_mounts), C(container_mounts_extra),
    C(container_gpus), C(container_gpu_mode), C(container_gpu_driver_bin_dir), C(container_python),
    C(container_logger_module), C(container_shm_size), C(container_health_timeout), C(container_health_inputs),
    C(container_health_cache_imports), C(cluster_code_dir), C(cluster_output_root), C(cluster_shared_root) and the fact
    C(nvidia_gpu_facts); gpu mode devices' paths come with I(engine) (its C(gpu_paths))."
  - "The probe only reads: it runs in check mode too, as a task with C(check_mode: false) would. Where the engine does
    not answer or the container is not running, every health record is C(skip) with the reason."
  - The probe's failure (no Python in the image, an exec error) is the records', never the task's.
options:
  engine:
    description: The engine probe's result (C(container_engine_probe), with its C(engine_ok), C(gpus), C(gpu_mode)).
    type: dict
    required: true
  run:
    description: The start of the training container's result in this run (C(container_start)'s, with its own read of
      the container under C(info) where the start gave none), if it ran.
    type: dict
  info:
    description: The read of the training container (C(docker_container_info)) on the read-only path
      (tasks/reads.yml), where no start ran.
    type: dict
  pull:
    description: The pull's result in this run (C(container_engine_probe)'s C(pull), with the login's under C(login)),
      if it ran.
    type: dict
  digest:
    description: This node's image verdict (C(container_digest_verdicts)' entry).
    type: dict
    default: {}
  registry:
    description: The image's registry (the login record names it).
    type: str
    default: ""
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Run the health probe inside the container and record the role's checks
  container_health:
    engine: "{{ __container_engine }}"
    run: "{{ __container_run | default(none) }}"
    info: "{{ __container_info | default(none) }}"
    pull: "{{ __container_engine.pull | default(none) }}"
    digest: "{{ _container_digests[inventory_hostname] }}"
    registry: "{{ _container_registry }}"
"""

RETURN = r"""
health:
  description: The probe's answer (C(rc), C(stdout), C(stderr), C(msg)), or C(skipped) and C(skip_reason).
  returned: always
  type: dict
preflight_records:
  description: Every record appended, I(records) first.
  returned: always
  type: list
"""

import json

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, container_checks
from ansible_collections.trainyard.core.plugins.plugin_utils.cluster_model import size_bytes

_START = "container : Create the mounted directories and start the training container"
_DEVICE_GPU_SKIP = "no GPU on this node (/dev/nvidiactl absent): nothing to compare with nvidia_gpu_facts"


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        engine = bases.need_dict(args.get("engine"), "container_health: 'engine'", " (the engine probe's result)")
        opt = {name: self.var(task_vars, "container_" + name) for name in (
            "name", "image", "registry_username", "user", "cap_add", "no_new_privileges", "ulimits", "gpus",
            "gpu_mode", "gpu_driver_bin_dir", "python", "logger_module", "shm_size", "health_timeout",
            "health_inputs", "health_cache_imports")}
        mounts = list(self.var(task_vars, "container_mounts", []) or []) + list(
            self.var(task_vars, "container_mounts_extra", []) or [])
        paths = engine.get("gpu_paths") or {}  # gpu mode devices: what the engine probe read (absent elsewhere)
        verified = container_checks.verify_inputs({
            "engine": engine, "run": args.get("run"), "info": args.get("info"), "pull": args.get("pull"),
            "digest": args.get("digest") or {}, "registry": args.get("registry") or "",
            "check_mode": boolean(task_vars.get("ansible_check_mode", False), strict=False),
            "node": task_vars.get("inventory_hostname"), "image": opt["image"], "name": opt["name"],
            "registry_username": opt["registry_username"], "user": opt["user"], "cap_add": opt["cap_add"],
            "no_new_privileges": opt["no_new_privileges"], "ulimits": opt["ulimits"], "mounts": mounts,
            "container_gpus": opt["gpus"], "container_gpu_mode": opt["gpu_mode"],
            "devices": paths.get("devices"), "driver_libs": paths.get("driver_libs"),
            "driver_version": paths.get("driver_version"), "driver_lib_dir": paths.get("driver_lib_dir")})
        dirs = {k: self.var(task_vars, "cluster_" + k) for k in ("code_dir", "output_root", "shared_root")}
        gpu_mode = engine.get("gpu_mode")
        context = dict(dirs, logger_module=opt["logger_module"], python=opt["python"], shm_size=opt["shm_size"],
                       container=opt["name"], gpu_mode=gpu_mode,
                       gpu_uuids=[g.get("uuid") for g in (self.var(task_vars, "nvidia_gpu_facts") or {}).get("gpus")
                                  or []])
        if verified["running"]:
            answer = self.run_reading_module("community.docker.docker_container_exec", {
                "container": opt["name"], "timeout": opt["health_timeout"],
                "argv": [opt["python"], "-c", self._probe_script(),
                         json.dumps(self._probe_params(opt, dirs, engine, verified["inspect"]))]}, task_vars)
        else:
            answer = {"skipped": True, "skip_reason": verified["skip_reason"]}
        pending = {_START: args.get("run") or {}}
        health = [dict(r, pending_on=pending) for r in container_checks.health_records(answer, context)]
        out = self.record(task_vars, *verified["records"], *health)
        out["health"] = {k: answer[k] for k in ("rc", "stdout", "stderr", "msg", "skipped", "skip_reason") if k in answer}
        return out

    def _probe_script(self):
        with open(self._find_needle("files", "container_health.py"), encoding="utf-8") as f:
            return f.read()

    @staticmethod
    def _probe_params(opt, dirs, engine, inspect):
        """files/container_health.py's parameters."""
        inspect = inspect or {}
        # Import results are kept for this container instance only (container_health.py says why).
        instance = "/".join(str(x or "") for x in (inspect.get("Id"), (inspect.get("State") or {}).get("StartedAt"),
                                                   inspect.get("Image")))
        return dict(
            dirs,
            # The job's local inputs outside the shared root, opened as the job's user too (train_args' model, data).
            inputs=[p for p in opt["health_inputs"] or [] if str(p).startswith("/")],
            logger_module=opt["logger_module"], shm_size_bytes=int(size_bytes(opt["shm_size"], -1)),
            gpus=boolean(engine.get("gpus", False), strict=False), ulimits=opt["ulimits"],
            instance=instance if boolean(opt["health_cache_imports"], strict=False) else "",
            import_cache="/tmp/.trainyard-health-imports.json",
            nvidia_smi=opt["gpu_driver_bin_dir"] + "/nvidia-smi" if engine.get("gpu_mode") == "devices" else "",
            gpu_skip_reason=("container_gpus is none: the container gets no GPU" if opt["gpus"] == "none"
                             else _DEVICE_GPU_SKIP))
