# -*- coding: utf-8 -*-
"""Run the health probe inside the training container and record every check of the container role, in one task."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: container_health
short_description: Run the in-container health probe and record the container role's checks in one task
description:
  - "One task per node for the role's last two steps: C(community.docker.docker_container_exec) runs the health probe
    inside the training container (I(exec)), then the role's records are recorded as C(preflight_check) does:
    I(records) (the engine, GPU, pull, image digest and container checks, built before) and the
    C(container.health.*) records from the probe's answer (plugin_utils/container_checks.py health_records)."
  - "The probe only reads: it runs in check mode too, as a task with C(check_mode: false) would. Without I(exec)
    (the engine does not answer, the container is not running) every health record is C(skip) with I(skip_reason)."
  - The probe's failure (no Python in the image, an exec error) is the records', never the task's.
options:
  exec:
    description: C(docker_container_exec)' arguments (C(container), C(argv), C(timeout)); omitted, the probe does not
      run.
    type: dict
  skip_reason:
    description: Why the probe does not run, when I(exec) is omitted.
    type: str
    default: the container is not running
  context:
    description: What the health verdicts compare with (C(code_dir), C(output_root), C(shared_root),
      C(logger_module), C(python), C(shm_size), C(container), C(gpu_mode), C(gpu_uuids)).
    type: dict
    required: true
  records:
    description: The role's other records, recorded first, each as C(preflight_check)'s I(records) takes them.
    type: list
    elements: dict
    default: []
  pending_on:
    description: C({task name, registered result}) that the health records are pending on in check mode (the start of
      the container).
    type: dict
    default: {}
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Run the health probe inside the container and record the role's checks
  container_health:
    exec: {container: trainyard-train, argv: [python3, -c, "print('{}')"], timeout: 60}
    context: {code_dir: /srv/code, output_root: /srv/outputs, shared_root: /srv/shared, python: python3}
    records: [{check: container.engine, status: pass, detail: docker 27.5.1}]
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

from ansible.errors import AnsibleActionFail
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, container_checks


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        records = args.get("records") or []
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise AnsibleActionFail("container_health: 'records' must be a list of records")
        context = bases.need_dict(args.get("context"), "container_health: 'context'")
        pending = bases.need_dict(args.get("pending_on") or {}, "container_health: 'pending_on'")
        if args.get("exec"):
            exec_args = bases.need_dict(args["exec"], "container_health: 'exec'", " (docker_container_exec's arguments)")
            answer = self.run_reading_module("community.docker.docker_container_exec", exec_args, task_vars)
        else:
            answer = {"skipped": True, "skip_reason": str(args.get("skip_reason") or "the container is not running")}
        health = [dict(r, pending_on=pending) for r in container_checks.health_records(answer, context)]
        out = self.record(task_vars, *records, *health)
        out["health"] = {k: answer[k] for k in ("rc", "stdout", "stderr", "msg", "skipped", "skip_reason") if k in answer}
        return out
