# -*- coding: utf-8 -*-
"""The plan of a check-mode run: what each task would change on each node, kept as the host fact trainyard_plan."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: trainyard_plan
type: aggregate
short_description: Collect what a check-mode run would change, per node, for the preflight report's plan
description:
  - In check mode (C(--check), or a play in check mode such as C(playbooks/plan.yml)) every task result
    that reports C(changed) is a change the real run would make. This callback turns each into a plan entry
    (C(task), C(kind) file/package/hold/image/container/job/other, C(summary), C(diff) as unified text when the
    run has C(--diff)) and keeps the node's entries in the host fact C(trainyard_plan), which the report play
    (role C(cluster), C(tasks/report.yml)) reads into the plan section of report.json, report.md and the health
    page.
  - The launch (C(torchrun_launch)) is always an entry, C(changed) false when the job is left alone; a launch
    that would stop the run (its plan's C(action) is C(blocked)) too.
  - Outside check mode it records nothing. Tasks that run for real in check mode (C(check_mode=false), the
    read-only probes) are not part of the plan.
  - Loaded without being listed in C(callbacks_enabled) (the project's ansible.cfg names C(callback_plugins/)).
"""

import difflib
import json
from collections.abc import Mapping

from ansible_collections.trainyard.core.plugins.plugin_utils import bases

FACT = "trainyard_plan"
_FILE = {"lineinfile", "blockinfile", "copy", "template", "file", "job_files", "ini_file", "replace", "get_url",
         "unarchive", "systemd_unit_file", "nvidia_gpu_facts"}  # nvidia_gpu_facts keeps CUDA_DEVICE_ORDER
_PACKAGE = {"apt", "package", "dnf", "yum", "pip"}
_HOLD = {"dpkg_selections"}
# container_engine_probe: the role's engine probe, login and pull (changed only where it pulls)
_IMAGE = {"docker_image", "docker_image_pull", "container_engine_probe"}
_CONTAINER = {"docker_container", "container_start"}  # container_start: the role's directories and container
_JOB = {"torchrun_launch"}
_MAX_DIFF = 20000


def _short(action):
    return str(action or "").rsplit(".", 1)[-1]


def kind_of(action, result=None):
    """The kind of change a task's action makes; an action that writes through job_files in its own call (its result
    carries job_files' changed `files`) is a file change too, whatever its name."""
    a = _short(action)
    for kind, names in (("file", _FILE), ("package", _PACKAGE), ("hold", _HOLD), ("image", _IMAGE),
                        ("container", _CONTAINER), ("job", _JOB)):
        if a in names:
            return kind
    if isinstance(result, Mapping) and any(isinstance(f, Mapping) and f.get("changed") and f.get("path")
                                           for f in result.get("files") or []):
        return "file"
    return "other"


def _paths(result, args):
    out = []
    for key in ("dest", "path"):
        if result.get(key):
            out.append(str(result[key]))
    for key in ("dest", "path"):
        if not out and args.get(key):
            out.append(str(args[key]))
    for d in _diff_list(result.get("diff")) if not out else []:
        for h in ("after_header", "before_header"):
            path = str(d.get(h) or "").split(" (")[0] if isinstance(d, Mapping) else ""
            if path.startswith("/") and path not in out:
                out.append(path)
    for f in result.get("files") or []:  # job_files
        if isinstance(f, Mapping) and f.get("changed") and f.get("path"):
            out.append(str(f["path"]))
    return out


def _diff_list(diff):
    if diff is None:
        return []
    return diff if isinstance(diff, list) else [diff]


def diff_text(diffs):
    """Ansible's diff dicts (before/after with headers, or prepared text) as plain unified diff text."""
    out = []
    for d in _diff_list(diffs):
        if not isinstance(d, Mapping):
            continue
        if "before" in d and "after" in d:
            sides = []
            for key in ("before", "after"):
                v = d[key]
                if isinstance(v, Mapping):
                    v = json.dumps(v, indent=2, sort_keys=True, default=str) + "\n"
                sides.append("" if v is None else str(v))
            out.extend(difflib.unified_diff(
                sides[0].splitlines(True), sides[1].splitlines(True),
                fromfile="before: %s" % d.get("before_header", ""), tofile="after: %s" % d.get("after_header", ""),
                n=3))
            if out and not out[-1].endswith("\n"):
                out[-1] += "\n"
        elif d.get("prepared"):
            out.append(str(d["prepared"]).rstrip("\n") + "\n")
    return "".join(out)


def summarize(action, args, result):
    """One line that says what the real run would do (pure; unit-tested)."""
    kind = kind_of(action, result)
    args = args if isinstance(args, Mapping) else {}
    if kind == "file":
        paths = _paths(result, args)
        return "write " + (", ".join(dict.fromkeys(paths)) if paths else "a file")
    if kind == "package":
        names = args.get("name") or args.get("pkg") or []
        names = [names] if isinstance(names, str) else list(names)
        state = args.get("state") or "present"
        prepared = ""
        for d in _diff_list(result.get("diff")):
            if isinstance(d, Mapping) and d.get("prepared"):
                prepared = " ".join(str(d["prepared"]).split())[:300]
        return "packages %s: %s%s" % (state, ", ".join(map(str, names)) or "?", (" (" + prepared + ")") if prepared else "")
    if kind == "hold":
        return "dpkg selection of %s -> %s" % (args.get("name"), args.get("selection"))
    if kind == "image":
        name = str(args.get("name") or (args.get("pull") or {}).get("name") or "")
        tagged = ":" in name.rsplit("/", 1)[-1] or "@" in name
        return "pull %s%s" % (name, (":" + str(args["tag"])) if args.get("tag") and not tagged else "")
    if kind == "container":
        actions = []
        for a in result.get("actions") or []:
            if isinstance(a, Mapping):
                actions.extend("%s" % k for k in a.keys())
            else:
                actions.append(str(a))
        why = []
        d = result.get("diff") if isinstance(result.get("diff"), Mapping) else {}
        for item in d.get("differences") or []:
            if isinstance(item, Mapping):
                why.extend(str(k) for k in item.keys())
        verb = "recreate" if any("recreate" in a for a in actions) else (
            "create and start" if any("create" in a for a in actions) else ", ".join(actions) or "change")
        return "%s container %s%s" % (verb, args.get("name") or "",
                                      (" (differs in: " + ", ".join(why) + ")") if why else
                                      (" (it does not exist)" if verb.startswith("create") else ""))
    if kind == "job":
        plan = result.get("plan") if isinstance(result.get("plan"), Mapping) else {}
        if plan.get("summary"):
            return str(plan["summary"])
        return "%s job %s" % (args.get("state") or "started", args.get("job") or "")
    return "changed"


class CallbackModule(bases.AlwaysLoadedCallback):
    CALLBACK_NAME = "trainyard_plan"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._vm = None
        self._plans = {}

    def v2_playbook_on_start(self, playbook):
        # Outside --check nothing is planned (playbooks/plan.yml, whose plays are in check mode, stops first without
        # it). Switched off then, the callback costs nothing per result: Ansible copies every result, deeply, for
        # each callback that takes the event, before the callback looks at it.
        from ansible import context
        if not context.CLIARGS.get("check"):
            self.disabled = True

    def v2_playbook_on_play_start(self, play):
        self._vm = play.get_variable_manager()

    def _task_in_check_mode(self, task):
        check = getattr(task, "check_mode", None)
        if isinstance(check, bool):
            return check
        from ansible import context
        return bool(context.CLIARGS.get("check"))

    def v2_runner_on_ok(self, result):
        # The task first: a run outside check mode never reads a result (result.result converts the whole result
        # to plain types, per host and task, in ansible-playbook's own process).
        task = result.task
        if self._vm is None or not self._task_in_check_mode(task):
            return
        res = result.result
        if not res.get("changed") and not (kind_of(task.action) == "job" and isinstance(res.get("plan"), Mapping)):
            return
        host = result.host.get_name()
        action = task.action
        items = res.get("results") if isinstance(res.get("results"), list) else None
        entries = []
        for item in (items if items is not None else [res]):
            # A job left alone is part of the plan too (changed false); anything else only when it would change.
            if not isinstance(item, Mapping) or not (item.get("changed") or isinstance(item.get("plan"), Mapping)):
                continue
            if task.no_log or item.get("_ansible_no_log"):
                # Secrets never reach the plan: the task and that it would change, nothing of its arguments.
                entries.append({"task": task.get_name(), "kind": kind_of(action), "action": _short(action),
                                "summary": "changed (details hidden: no_log)", "diff": ""})
                continue
            args = (item.get("invocation") or {}).get("module_args") or task.args or {}
            kind = kind_of(action, item)
            text = diff_text(item.get("diff")) if kind not in ("container", "package") else ""
            entry = {"task": task.get_name(), "kind": kind, "action": _short(action),
                     "summary": summarize(action, args, item), "diff": text[:_MAX_DIFF],
                     "changed": bool(item.get("changed"))}
            if kind_of(action) == "job" and isinstance(item.get("plan"), Mapping):
                entry["job"] = dict(item["plan"])
            entries.append(entry)
        self._add(host, entries)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        """A launch that would stop the run (the job runs with another command) is part of the plan too."""
        task = result.task
        if self._vm is None or not self._task_in_check_mode(task) or kind_of(task.action) != "job":
            return
        res = result.result
        if not isinstance(res.get("plan"), Mapping):
            return
        self._add(result.host.get_name(), [{
            "task": task.get_name(), "kind": "job", "action": _short(task.action), "summary": res["plan"].get("summary", ""),
            "diff": "", "changed": False, "job": dict(res["plan"])}])

    def _add(self, host, entries):
        if not entries:
            return
        plan = self._plans.setdefault(host, [])
        plan.extend(entries)
        self._vm.set_nonpersistent_facts(host, {FACT: list(plan)})
