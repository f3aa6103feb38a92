# -*- coding: utf-8 -*-
"""Create the janitor's user, deploy its files, dry-run it as it runs and record janitor.dry_run, in one task per
node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: janitor_check
short_description: Create the janitor's user, write its files, dry-run it on the output root and record the check
description:
  - "One task per node for four steps: with I(user_create), C(ansible.builtin.user) makes I(user) a system user (no
    home, no login shell) when it does not exist; C(job_files) writes the janitor's script, the layer it reads the
    output root through and its config (I(files)); the command module runs the janitor once as it runs (I(dry_run): C(setpriv)
    to the janitor's user, C(--dry-run --json)); the record C(janitor.dry_run) is built from its answer
    (plugin_utils/janitor_checks.py) and recorded as C(preflight_check) does, with the facts of I(publish)."
  - "The dry run only reads: it runs in check mode too, as a task with C(check_mode: false) would, except where check
    mode would write the script first (the record is then C(skip), and C(pending) because the write would change
    it)."
  - A user that cannot be created or a write that fails fails the task, with that module's message; the dry run's
    failure is the record's, not the task's.
options:
  files:
    description: C(job_files)' arguments (C(roots), C(directories), C(files)).
    type: dict
    required: true
  dry_run:
    description: The dry run's argument vector (no shell).
    type: list
    elements: str
    required: true
  root:
    description: C(janitor_root), for the record's detail.
    type: str
    required: true
  python:
    description: C(janitor_python), for the record's fix.
    type: str
    default: python3
  user:
    description: C(janitor_user), for the record's fix, and the user I(user_create) creates.
    type: str
    default: trainyard-janitor
  user_create:
    description: Create I(user) as a system user (C(janitor_user_create)) before the files are written.
    type: bool
    default: false
  publish:
    description: Facts of the host to set with the record (the launch role's C(janitor_sidecar)).
    type: dict
    default: {}
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Create the janitor's user, copy its script and config, dry-run it and record the check
  janitor_check:
    files:
      roots: [/srv/outputs]
      files: [{path: /var/lib/trainyard/job/janitor.json, content: "{}", mode: "0644"}]
    dry_run: [python3, /var/lib/trainyard/job/janitor.py, --config, /var/lib/trainyard/job/janitor.json,
              --dry-run, --json]
    root: /srv/outputs
    user: trainyard-janitor
    user_create: true
"""

RETURN = r"""
user:
  description: C(ansible.builtin.user)'s answer (C(name), C(changed), ...); absent without I(user_create).
  returned: with user_create
  type: dict
files:
  description: C(job_files)' answer for the files (each C({path, changed, ...})).
  returned: always
  type: list
dry_run:
  description: The command module's answer (C(rc), C(stdout), C(stderr)); absent where it did not run.
  returned: when the dry run ran
  type: dict
preflight_records:
  description: The record appended (C(janitor.dry_run)).
  returned: when the write succeeded
  type: list
"""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, janitor_checks


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        files = bases.need_dict(args.get("files"), "janitor_check: 'files'", " (job_files' arguments)")
        argv = args.get("dry_run")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise AnsibleActionFail("janitor_check: 'dry_run' must be the dry run's argument vector (a list of strings)")
        user = str(args.get("user") or "trainyard-janitor")
        made = None
        if boolean(args.get("user_create", False), strict=False):
            made = self._execute_module(module_name="ansible.legacy.user", task_vars=task_vars, module_args={
                "name": user, "system": True, "create_home": False, "shell": "/usr/sbin/nologin"})
            made.pop("invocation", None)
            if made.get("failed"):
                return dict(failed=True, msg="creating the janitor's user %s failed: %s (janitor_user, "
                            "janitor_user_create)" % (user, made.get("msg", "?")), user=made)
        written = self._execute_module(module_name="job_files", module_args=files, task_vars=task_vars)
        written.pop("invocation", None)
        if written.get("failed"):
            return dict(failed=True, msg=written.get("msg", "job_files failed"), files=written.get("files") or [])
        changed = bool(written.get("changed")) or bool(made and made.get("changed"))
        run = None
        if not (self._task.check_mode and changed):
            run = self._dry_run(argv, task_vars)
        record = janitor_checks.dry_run_record(run, str(args.get("root") or ""), str(args.get("python") or "python3"),
                                               user)
        # In check mode, a write that would change the script makes the record pending on this task.
        record["pending_on"] = {self._task.get_name(): {"changed": changed}}
        out = self.record(task_vars, record)
        out["ansible_facts"].update(bases.need_dict(args.get("publish") or {}, "janitor_check: 'publish'"))
        out.update(changed=changed, files=written.get("files") or [],
                   **({"diff": written["diff"]} if written.get("diff") else {}))
        if made is not None:
            out["user"] = {k: v for k, v in made.items() if k in ("name", "uid", "group", "system", "changed", "state")}
        if run is not None:
            out["dry_run"] = {k: run.get(k) for k in ("rc", "stdout", "stderr") if k in run}
        return out

    def _dry_run(self, argv, task_vars):
        """The command module's answer for argv; the dry run only reads, so it runs in check mode as well."""
        return self.run_reading_module("ansible.legacy.command", {"argv": argv, "expand_argument_vars": False},
                                       task_vars)
