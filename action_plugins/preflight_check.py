# -*- coding: utf-8 -*-
"""Record one preflight check result for the current host (controller side, no round trip)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_check
short_description: Record a preflight check result for the preflight report
description:
  - Appends one record (host, check, status, detail, fix, data, run) to the host variable C(preflight_results); a
    later record of the same check replaces the earlier one.
  - The task returns its new records as C(preflight_records); the callback C(preflight_records) merges them into
    C(preflight_results) in ansible-playbook's own process, a variable set as C(set_fact) sets one, not a fact
    (plugin_utils/check_records.py says why). Without that callback the merged list is returned as the fact
    C(preflight_results); a C(no_log) task, whose result the callbacks see censored, returns its new records as the
    fact C(_preflight_records_no_log), which the callback reads.
  - Each record carries the id of the run (C(_cluster_run_id), set on localhost by the validate play), since a fact
    cache kept between runs may hold an earlier run's records; they are dropped here and ignored by the report.
  - Runs on the controller only; the host is not contacted.
  - A failed check is printed at once (C(<node>) C(<check>) C(FAIL) C(<detail>) and its fix), so the first failure is on
    the screen seconds into a run; the run goes on and the report still lists every failure at the end.
  - The report play (role C(cluster), C(tasks/report.yml)) collects every host's records,
    prints them as a node x check table and fails the run when any check failed.
  - In check mode a check that reads state an earlier task of the run would change (I(pending_on) names those
    tasks and their registered results) is recorded C(pending) with the task that would satisfy it, never
    C(pass) or C(fail), since the run itself settles it. Outside check mode I(pending_on) is ignored.
options:
  check:
    description: Name of the check, C(<role>.<what>), e.g. C(network.mtu). Required unless I(records) is given.
    type: str
  records:
    description:
      - Several checks at once, each a dict with the options below (C(check), C(ok) or C(status), C(detail),
        C(fix), C(data)); one task instead of one per check.
      - "A record may name its node (C(host)): an action that runs once (C(run_once)) records for every node, and the
        callback C(preflight_records) keeps each record with its node (the project's C(ansible.cfg) loads it)."
    type: list
    elements: dict
  hosts:
    description:
      - "Record the same records for each of these nodes (each record naming its node): a task that runs once
        (C(run_once)) records a verdict every node shares, one worker for the cluster instead of one per node."
    type: list
    elements: str
  ok:
    description: Whether the check passed. Ignored when I(status) is given.
    type: bool
  status:
    description: Explicit status; C(skip) when a check cannot run, C(warn) for non-fatal findings.
    type: str
    choices: [pass, fail, warn, skip, pending]
  pending_on:
    description:
      - "Tasks this check depends on: C({task name: registered result}). In check mode, when any of these results is
        C(changed) (the run would change what the check reads), the record becomes C(pending), its detail says what
        was seen now and its fix names the task(s) that would satisfy it."
      - Given at the task level it applies to every record of the task (or to I(pending_checks) only); a record of
        I(records) may carry its own.
    type: dict
    default: {}
  pending_checks:
    description: With I(records), the checks that task-level I(pending_on) applies to (default every record).
    type: list
    elements: str
  detail:
    description: What was seen (values, not prose about the check).
    type: str
    default: ""
  fix:
    description: What the user should do when the check did not pass.
    type: str
    default: ""
  data:
    description: Structured values for the report (e.g. a pairwise matrix, versions for the drift table).
    type: dict
    default: {}
  publish:
    description:
      - "Facts of the host to set with the records (C({name: value})), for the roles after this one, so a role's last
        step needs no C(set_fact) task of its own (the janitor's C(janitor_sidecar)). Not C(preflight_results)."
    type: dict
    default: {}
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Record several checks in one task
  preflight_check:
    records:
      - {check: cluster.shm, ok: "{{ shm_ok }}", detail: "/dev/shm 64 MiB", fix: "enlarge /dev/shm"}
      - {check: cluster.docker, status: skip, detail: "launch_runtime host"}

- name: Record the MTU check
  preflight_check:
    check: network.mtu
    ok: "{{ __network_link.mtu == cluster_data_mtu }}"
    detail: "eth1 MTU {{ __network_link.mtu }}, expected {{ cluster_data_mtu }}"
    fix: "Set the MTU of eth1 to {{ cluster_data_mtu }} on this node, or change cluster_data_mtu"

- name: Record the device order (pending in check mode while the task before would write it)
  preflight_check:
    check: nvidia_driver.device_order
    ok: "{{ order == 'PCI_BUS_ID' }}"
    detail: "CUDA_DEVICE_ORDER={{ order }}"
    pending_on:
      "nvidia_driver : Configure CUDA_DEVICE_ORDER=PCI_BUS_ID": "{{ __nvidia_driver_order_line }}"
"""

RETURN = r"""
preflight_record:
  description: The record that was appended (the last one with I(records)).
  returned: always
  type: dict
preflight_records:
  description: Every record appended by this task.
  returned: always
  type: list
"""

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.utils.display import Display
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, check_records

display = Display()

_STATUSES = ("pass", "fail", "warn", "skip", "pending")
FACT = check_records.VAR


def _run_id(task_vars):
    """The run id the validate play set on localhost (names the report directory), or None."""
    hostvars = task_vars.get("hostvars")
    try:
        return str(hostvars["localhost"]["_cluster_run_id"])
    except (KeyError, TypeError, AttributeError):
        return task_vars.get("_cluster_run_id")
    except Exception:  # noqa: BLE001 - an undefined or broken template is "no run id"
        return None


def would_change(result):
    """A registered result of a task that, in check mode, reports it would change something."""
    if not isinstance(result, dict):
        return False
    if result.get("skipped"):
        return False
    if result.get("changed"):
        return True
    return any(would_change(r) for r in result.get("results") or [])


def pending_record(record, pending_on):
    """The record as pending when any task of pending_on ({task name: registered result}) would change something."""
    if not isinstance(pending_on, dict):
        raise AnsibleActionFail("preflight_check %s: 'pending_on' must be a dict {task name: registered result}"
                                % record.get("check"))
    tasks = [str(name) for name, result in pending_on.items() if would_change(result)]
    if not tasks:
        return record
    seen = record["detail"] or record["status"]
    return dict(record, status="pending", detail="now: %s" % seen,
                fix="the run does it: %s" % "; ".join(tasks),
                data=dict(record.get("data") or {}, pending_tasks=tasks, status_now=record["status"]))


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        if args.get("records") is not None:
            if not isinstance(args["records"], list) or not all(isinstance(r, dict) for r in args["records"]):
                raise AnsibleActionFail("preflight_check: 'records' must be a list of dicts (check, ok|status, ...)")
            specs = list(args["records"])
        else:
            specs = [args]
        if args.get("hosts") is not None:
            hosts = args["hosts"]
            if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
                raise AnsibleActionFail("preflight_check: 'hosts' must be a list of node names (ansible_play_hosts)")
            specs = [dict(spec, host=h) for h in hosts for spec in specs]
        host = task_vars.get("inventory_hostname")
        run = _run_id(task_vars)
        records = [dict(self._record(spec, host), run=run) for spec in specs]
        if self._task.check_mode or getattr(self._play_context, "check_mode", False):
            records = self._pending(records, specs, args)
        for r in records:
            if r["status"] == "fail":
                display.display("%s: %s FAIL: %s%s" % (r["host"], r["check"], r["detail"],
                                                      "\n    fix: " + r["fix"] if r["fix"] else ""),
                                color=C.COLOR_ERROR)
        facts = self._publish(args.get("publish"))
        if not check_records.callback_keeps_records() and any(r["host"] != host for r in records):
            raise AnsibleActionFail(
                "preflight_check: records for other nodes (%s; a task run once for every node) are kept by the "
                "callback preflight_records, which this run does not load. Run with the project's ansible.cfg "
                "(callback_plugins = callback_plugins), or add the project's callback_plugins directory to "
                "ANSIBLE_CALLBACK_PLUGINS" % ", ".join(sorted({r["host"] for r in records if r["host"] != host})))
        if not check_records.callback_keeps_records():
            # No callback keeps them (plugin_utils/check_records.py): the records go in the fact, merged here. With a
            # persistent fact cache Ansible keeps facts returned by any action but set_fact between runs, so the
            # list may hold an earlier run's records: merge keeps only this run's.
            facts = dict(facts, **{FACT: check_records.merge(task_vars.get(FACT), records, run)})
        elif self._task.no_log:
            # The callbacks see a no_log result censored: the records reach the callback through the fact cache.
            facts = dict(facts, **{check_records.HIDDEN: records})
        return dict(
            preflight_record=records[-1] if records else {},
            preflight_records=records,
            ansible_facts=facts,
            _ansible_facts_cacheable=False,
        )

    @staticmethod
    def _publish(publish):
        """The facts of 'publish' ({} when none), or AnsibleActionFail naming what is wrong with it."""
        if publish is None:
            return {}
        if not isinstance(publish, dict) or not all(isinstance(k, str) and k for k in publish) or FACT in publish:
            raise AnsibleActionFail("preflight_check: 'publish' must map fact names to values (not %s): the records "
                                    "go in %s through 'records'" % (FACT, FACT))
        return dict(publish)

    @staticmethod
    def _pending(records, specs, args):
        """Check mode: a record whose pending_on names a task that would change something becomes pending."""
        task_level = args.get("pending_on") or {}
        only = args.get("pending_checks")
        out = []
        for rec, spec in zip(records, specs):
            deps = spec.get("pending_on") if spec is not args and spec.get("pending_on") is not None else (
                task_level if only is None or rec["check"] in only else {})
            rec = pending_record(rec, deps)
            out.append(rec)
        return out

    @staticmethod
    def _record(args, host):
        check = args.get("check")
        if not check or not isinstance(check, str):
            raise AnsibleActionFail("preflight_check: 'check' is required, e.g. check: network.mtu")
        status = args.get("status")
        if status is None:
            if "ok" not in args:
                raise AnsibleActionFail(f"preflight_check {check}: give 'ok' (bool) or 'status'")
            status = "pass" if boolean(args["ok"], strict=False) else "fail"
        status = str(status).strip()
        if status not in _STATUSES:
            raise AnsibleActionFail(
                f"preflight_check {check}: status {status!r} is not one of {', '.join(_STATUSES)}"
            )
        return {
            "host": args["host"] if isinstance(args.get("host"), str) and args["host"] else host,
            "check": check,
            "status": status,
            "detail": str(args.get("detail") or "").strip(),
            "fix": str(args.get("fix") or "").strip() if status != "pass" else "",
            "data": args.get("data") or {},
        }
