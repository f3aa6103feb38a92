# -*- coding: utf-8 -*-
"""Create the janitor's user, deploy its files, dry-run it as it runs and record janitor.dry_run, in one task per
node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: janitor_check
short_description: Create the janitor's user, write its files, dry-run it on the output root and record the check
description:
  - "One task per node for the janitor's steps: how it runs (I(mode); C(auto): systemd where systemd runs the node, as
    I(systemd) says or C(stat /run/systemd/system) reads, else a sidecar of the job), refused before anything where
    I(mode) is C(systemd) on a node without it; with I(user_create), C(ansible.builtin.user) makes I(user) a system
    user (no home, no login shell) unless I(user_shell) says it exists with that shell; C(job_files) writes the
    janitor's script, the layer it reads the output root through and its config (I(files)); the command module runs
    the janitor once as it runs (I(dry_run): C(setpriv) to the janitor's user, C(--dry-run --json)); the record
    C(janitor.dry_run) is built from its answer (plugin_utils/janitor_checks.py) and recorded as C(preflight_check)
    does, with the fact C(janitor_sidecar) (I(sidecar)) where the janitor runs as a sidecar."
  - "The dry run only reads: it runs in check mode too, as a task with C(check_mode: false) would, except where check
    mode would write the script first (the record is then C(skip), and C(pending) because the write would change
    it)."
  - A mode the node cannot run, a user that cannot be created or a write that fails fails the task, with that
    module's message; the dry run's failure is the record's, not the task's.
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
  user_shell:
    description: I(user)'s login shell as the cluster role's host probe read it (C(trainyard_init.users)); null where
      the user does not exist or nothing read it. A user whose shell is already C(/usr/sbin/nologin) is not created
      again (no C(user) module run).
    type: str
  mode:
    description: C(janitor_mode) (C(auto), C(systemd) or C(sidecar)).
    type: str
    default: auto
  systemd:
    description: Whether systemd runs the node (the cluster role's host probe, C(trainyard_init.systemd)); left out,
      the action reads C(/run/systemd/system) on the node itself.
    type: bool
  sidecar:
    description: The janitor as a sidecar of the job, set as the fact C(janitor_sidecar) (the launch role's
      C(launch_sidecars) reads it) where the janitor runs as a sidecar.
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
    sidecar: {name: janitor, argv: [python3, /var/lib/trainyard/job/janitor.py, --loop]}
"""

RETURN = r"""
mode:
  description: How the janitor runs on this node (C(systemd) or C(sidecar)).
  returned: always
  type: str
systemd:
  description: Whether systemd runs the node (I(systemd), or the action's read).
  returned: always
  type: bool
user:
  description: C(ansible.builtin.user)'s answer (C(name), C(changed), ...), or C({name, changed, shell}) where
    I(user_shell) answered; absent without I(user_create).
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


_NOLOGIN = "/usr/sbin/nologin"
_MODES = ("auto", "systemd", "sidecar")


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        files = bases.need_dict(args.get("files"), "janitor_check: 'files'", " (job_files' arguments)")
        argv = args.get("dry_run")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise AnsibleActionFail("janitor_check: 'dry_run' must be the dry run's argument vector (a list of strings)")
        mode = str(args.get("mode") or "auto")
        if mode not in _MODES:
            raise AnsibleActionFail("janitor_check: 'mode' must be one of %s, got %r (janitor_mode)"
                                    % (", ".join(_MODES), mode))
        sidecar = bases.need_dict(args.get("sidecar") or {}, "janitor_check: 'sidecar'")
        user = str(args.get("user") or "trainyard-janitor")
        systemd = self._systemd(args.get("systemd"), task_vars)
        if mode == "systemd" and not systemd:
            return dict(failed=True, systemd=False, mode=mode, msg=(
                "%s: janitor_mode=systemd but systemd is not PID 1 here (/run/systemd/system missing). Fix: set "
                "janitor_mode=auto or sidecar." % task_vars.get("inventory_hostname", "?")))
        mode = "systemd" if mode == "systemd" or (mode == "auto" and systemd) else "sidecar"
        made = None
        if boolean(args.get("user_create", False), strict=False):
            made = self._user(user, args.get("user_shell"), task_vars)
            if made.get("failed"):
                return dict(failed=True, msg="creating the janitor's user %s failed: %s (janitor_user, "
                            "janitor_user_create)" % (user, made.get("msg", "?")), user=made, systemd=systemd,
                            mode=mode)
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
        # No systemd here: the janitor runs as a sidecar of the job (the launch role's launch_sidecars reads the fact).
        if mode == "sidecar" and sidecar:
            out["ansible_facts"]["janitor_sidecar"] = sidecar
        out.update(changed=changed, files=written.get("files") or [], systemd=systemd, mode=mode,
                   **({"diff": written["diff"]} if written.get("diff") else {}))
        if made is not None:
            out["user"] = {k: v for k, v in made.items()
                           if k in ("name", "uid", "group", "system", "changed", "state", "shell")}
        if run is not None:
            out["dry_run"] = {k: run.get(k) for k in ("rc", "stdout", "stderr") if k in run}
        return out

    def _systemd(self, given, task_vars):
        """Whether systemd runs the node: the host probe's answer, else /run/systemd/system read on the node."""
        if given is not None:
            return boolean(given, strict=False)
        seen = self.run_reading_module("ansible.legacy.stat", {"path": "/run/systemd/system", "get_checksum": False},
                                       task_vars)
        return bool((seen.get("stat") or {}).get("isdir"))

    def _user(self, user, shell, task_vars):
        """The user module's answer for the janitor's user; none needed where the probe saw it with no login shell."""
        if shell == _NOLOGIN:
            return {"name": user, "changed": False, "shell": shell}
        made = self._execute_module(module_name="ansible.legacy.user", task_vars=task_vars, module_args={
            "name": user, "system": True, "create_home": False, "shell": _NOLOGIN})
        made.pop("invocation", None)
        return made

    def _dry_run(self, argv, task_vars):
        """The command module's answer for argv; the dry run only reads, so it runs in check mode as well."""
        return self.run_reading_module("ansible.legacy.command", {"argv": argv, "expand_argument_vars": False},
                                       task_vars)
