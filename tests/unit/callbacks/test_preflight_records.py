"""The check records of a run: kept by the callback preflight_records as the host variable preflight_results, not as
a fact (plugin_utils/check_records.py), with the fact as the way back where no callback keeps them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import REPO, load

cr = load("collections/ansible_collections/trainyard/core/plugins/plugin_utils/check_records.py", "check_records_test")


def rec(check, status="pass", host="a", run="r1", **kw):
    return {"host": host, "check": check, "status": status, "run": run, "detail": kw.get("detail", ""), "fix": "",
            "data": {}}


def test_a_later_record_of_a_check_replaces_the_earlier_one_and_other_runs_are_dropped():
    previous = [rec("c.one"), rec("c.two", "fail"), rec("c.old", run="r0"), "not a record"]
    merged = cr.merge(previous, [rec("c.two", "pass"), rec("c.three")], "r1")
    assert [(r["check"], r["status"]) for r in merged] == [("c.one", "pass"), ("c.two", "pass"), ("c.three", "pass")]
    assert cr.merge(None, [rec("c.one")], "r1") == [rec("c.one")]


def test_the_records_of_a_result_its_loop_items_and_nothing_else():
    assert cr.of_result({"preflight_records": [rec("c.one"), {"check": "no status"}, "x"]}) == [rec("c.one")]
    assert cr.of_result({"results": [{"preflight_records": [rec("c.one")]}, {"skipped": True},
                                     {"preflight_records": [rec("c.two")]}]}) == [rec("c.one"), rec("c.two")]
    # A result that only mentions records deeper down (a debug of a registered result) records nothing.
    assert cr.of_result({"msg": {"preflight_records": [rec("c.one")]}}) == []
    assert cr.of_result(None) == [] and cr.of_result({"preflight_records": "x"}) == []


def test_the_keeper_files_each_record_under_its_own_node():
    k = cr.Keeper()
    assert k.add("a", [rec("c.one"), rec("c.two", host="b")]) == {"a": [rec("c.one")], "b": [rec("c.two", host="b")]}
    assert k.add("a", [rec("c.one", "fail"), {**rec("c.three"), "host": ""}]) == {
        "a": [rec("c.one", "fail"), {**rec("c.three"), "host": ""}]}
    assert k.by_host["b"] == [rec("c.two", host="b")]


def test_a_no_log_task_s_records_are_taken_from_the_fact_once_and_only_of_this_run():
    k = cr.Keeper()
    assert k.hidden("a", {cr.HIDDEN: [rec("c.one"), "x"]}) == [rec("c.one")]  # nothing held yet: any run
    k.add("a", [rec("c.one"), rec("c.two")])
    facts = {cr.HIDDEN: [rec("c.one"), rec("c.two", "fail"), rec("c.old", run="r0")]}
    # What it holds already (the fact outlives its task) and another run's (a fact cache kept between runs): not new.
    assert k.hidden("a", facts) == [rec("c.two", "fail")]
    assert k.hidden("a", None) == [] and k.hidden("a", {cr.HIDDEN: "x"}) == []


def test_a_pid_inherited_from_another_process_does_not_count(monkeypatch):
    monkeypatch.setenv(cr.CALLBACK_ENV, str(os.getppid()))
    assert cr.callback_keeps_records()
    monkeypatch.setenv(cr.CALLBACK_ENV, str(os.getpid()))  # this process's own: it forked no worker of its own
    assert not cr.callback_keeps_records()
    monkeypatch.delenv(cr.CALLBACK_ENV)
    assert not cr.callback_keeps_records()


PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Record two checks
      preflight_check:
        records:
          - {check: t.one, ok: false, detail: first}
          - {check: t.two, ok: true}
    - name: Record again, each item a check (t.one passes now)
      preflight_check:
        check: "{{ item }}"
        ok: true
      loop: [t.one, t.three]
    - name: Record in a no_log task
      preflight_check:
        check: t.secret
        ok: true
      no_log: true
    - name: Record in another no_log task
      preflight_check:
        check: t.secret2
        ok: false
      no_log: true
    - name: A no_log task that records nothing (the fact of the last one is still there)
      ansible.builtin.debug:
        msg: hidden
      no_log: true
- hosts: all
  gather_facts: false
  tasks:
    - name: Show
      ansible.builtin.debug:
        msg: "RESULT {{ {'records': preflight_results, 'fact': ansible_facts.preflight_results | default(none),
                          'report': hostvars[inventory_hostname].preflight_results | length} | to_json }}"
"""


def _play(tmp_path, **env):
    pb = tmp_path / "pb.yml"
    pb.write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", **env)
    env.pop("TRAINYARD_RECORDS_CALLBACK", None)
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "n1,", "-c", "local",
                        "-e", f"ansible_python_interpreter={sys.executable}", str(pb)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    line = next((ln for ln in r.stdout.splitlines() if "RESULT " in ln), None)
    assert line, r.stdout + r.stderr
    return json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"][len("RESULT "):])


def test_the_callback_keeps_the_records_as_a_variable_not_a_fact(tmp_path):
    got = _play(tmp_path)
    assert [(r["check"], r["status"]) for r in got["records"]] == [
        ("t.two", "pass"), ("t.one", "pass"), ("t.three", "pass"), ("t.secret", "pass"), ("t.secret2", "fail")]
    assert got["report"] == 5  # hostvars reads it too, across plays
    assert got["fact"] is None  # not a fact


def test_without_the_callback_the_records_are_a_fact_as_before(tmp_path):
    # An ansible.cfg without the project's callback_plugins: preflight_check merges the list itself.
    got = _play(tmp_path, ANSIBLE_CALLBACK_PLUGINS=str(tmp_path / "none"))
    assert [(r["check"], r["status"]) for r in got["records"]] == [
        ("t.two", "pass"), ("t.one", "pass"), ("t.three", "pass"), ("t.secret", "pass"), ("t.secret2", "fail")]
    assert got["fact"] == got["records"]
