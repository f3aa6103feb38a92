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
    - name: Publish a value
      preflight_check:
        check: t.pub
        ok: true
        publish: {t_pub: one, t_later: first}
    - name: Publish once for every node (run_once)
      preflight_check:
        check: t.once
        ok: true
        publish: {t_once: "{{ inventory_hostname }}"}
      run_once: true
    - name: Publish in a no_log task
      preflight_check:
        check: t.pub_secret
        ok: true
        publish: {t_secret: hidden-value, t_later: second}
      no_log: true
    - name: Publish again (later than the no_log value)
      preflight_check:
        check: t.pub_again
        ok: true
        publish: {t_later: third}
    - name: Publish for the node delegated to (delegate_facts), recording nothing
      preflight_check:
        records: []
        publish: {t_deleg: "from {{ inventory_hostname }}"}
      delegate_to: n2
      delegate_facts: true
      when: inventory_hostname == 'n1'
    - name: A no_log task that records nothing (the facts of the no_log tasks above are still there)
      ansible.builtin.debug:
        msg: hidden
      no_log: true
- hosts: all
  gather_facts: false
  tasks:
    - name: Show
      ansible.builtin.debug:
        msg: "RESULT {{ {'records': preflight_results, 'fact': ansible_facts.preflight_results | default(none),
                          'report': hostvars[inventory_hostname].preflight_results | length,
                          'published': [t_pub, t_once, t_secret, t_later, hostvars['n2'].t_once,
                                        hostvars['n1'].t_deleg | default('none'), hostvars['n2'].t_deleg],
                          'pub_fact': ansible_facts.t_pub | default(none)} | to_json }}"
"""


CHECKS = [("t.two", "pass"), ("t.one", "pass"), ("t.three", "pass"), ("t.secret", "pass"), ("t.secret2", "fail"),
          ("t.pub", "pass"), ("t.once", "pass"), ("t.pub_secret", "pass"), ("t.pub_again", "pass")]


def _play(tmp_path, **env):
    pb = tmp_path / "pb.yml"
    pb.write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", **env)
    env.pop("TRAINYARD_RECORDS_CALLBACK", None)
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "n1,n2,", "-c", "local",
                        "-e", f"ansible_python_interpreter={sys.executable}", str(pb)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert "hidden-value" not in r.stdout.split("TASK [Show]")[0] + r.stderr  # until it is shown on purpose
    # n1's line (the run_once task records on n1 only; the two hosts' results print in the order they finish).
    lines = r.stdout.splitlines()
    line = next((ln for i, ln in enumerate(lines) if "RESULT " in ln and i and lines[i - 1].startswith("ok: [n1]")),
                None)
    assert line, r.stdout + r.stderr
    return json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"][len("RESULT "):])


def test_the_callback_keeps_the_records_as_a_variable_not_a_fact(tmp_path):
    got = _play(tmp_path)
    assert [(r["check"], r["status"]) for r in got["records"]] == CHECKS
    assert got["report"] == len(CHECKS)  # hostvars reads it too, across plays
    assert got["fact"] is None  # not a fact


def test_the_callback_sets_published_values_as_variables_not_facts(tmp_path):
    # The run_once value on every node, the no_log value through its fact once (a later no_log task of another
    # module finds that fact still there: the later value stays).
    got = _play(tmp_path)
    assert got["published"] == ["one", "n1", "hidden-value", "third", "n1", "none", "from n1"]
    assert got["pub_fact"] is None


def test_without_the_callback_the_records_and_values_are_facts_as_before(tmp_path):
    # An ansible.cfg without the project's callback_plugins and with Ansible's default injection of facts (as
    # molecule's): preflight_check merges the list itself, the values are facts read by their names.
    got = _play(tmp_path, ANSIBLE_CALLBACK_PLUGINS=str(tmp_path / "none"), ANSIBLE_INJECT_FACT_VARS="True")
    assert [(r["check"], r["status"]) for r in got["records"]] == CHECKS
    assert got["fact"] == got["records"]
    assert got["published"] == ["one", "n1", "hidden-value", "third", "n1", "none", "from n1"]
    assert got["pub_fact"] == "one"


ONCE_FOR_EVERY_NODE = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Record for this node
      preflight_check: {check: t.own, ok: true}
    - name: Record for every node at once
      preflight_check:
        hosts: "{{ ansible_play_hosts }}"
        records: [{check: t.shared, ok: false, detail: "seen from {{ inventory_hostname }}"}]
      run_once: true
    - name: Show
      ansible.builtin.debug:
        msg: "RESULT {{ preflight_results | map(attribute='host') | zip(preflight_results | map(attribute='check'))
                        | map('join', ' ') | list | to_json }}"
"""


def test_a_task_run_once_records_for_every_node_each_under_its_node(tmp_path):
    """preflight_check's hosts (the cluster-wide record tasks: host_basics, nccl_env's compare): one worker, each
    node's record under its own node, its earlier records kept. Without the callback the records could only be one
    fact that Ansible copies to every node of a run_once task, so the task fails naming the fix instead."""
    pb = tmp_path / "pb.yml"
    pb.write_text(ONCE_FOR_EVERY_NODE)
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "n1,n2,", "-c", "local",
            "-e", f"ansible_python_interpreter={sys.executable}", str(pb)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env.pop("TRAINYARD_RECORDS_CALLBACK", None)
    r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    shown = [json.loads(json.loads("{" + ln.strip().rstrip(",") + "}")["msg"][len("RESULT "):])
             for ln in r.stdout.splitlines() if "RESULT " in ln]
    assert sorted(map(tuple, shown)) == [("n1 t.own", "n1 t.shared"), ("n2 t.own", "n2 t.shared")], r.stdout
    off = dict(env, ANSIBLE_CALLBACK_PLUGINS=str(tmp_path / "none"))
    r = subprocess.run(argv, cwd=REPO, env=off, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "records for other nodes (n2" in r.stdout, r.stdout
    assert "callback_plugins = callback_plugins" in r.stdout


def test_publish_hands_the_values_to_the_callback_and_keeps_the_records_fallback(monkeypatch):
    monkeypatch.setenv(cr.CALLBACK_ENV, str(os.getppid()))
    out = cr.publish({"ansible_facts": {"a": 1, cr.HIDDEN: [rec("c.one")]}, "x": 2}, ["n1", "n2"], no_log=False)
    assert out == {"ansible_facts": {cr.HIDDEN: [rec("c.one")]}, "x": 2,
                   cr.PUBLISH_KEY: {"hosts": ["n1", "n2"], "vars": {"a": 1}}}
    assert cr.published(out) == {"n1": {"a": 1}, "n2": {"a": 1}}
    assert cr.published({"results": [out, {"skipped": True}]}) == {"n1": {"a": 1}, "n2": {"a": 1}}
    assert cr.publish({"ansible_facts": {}}, ["n1"], no_log=False) == {}  # no empty entry in the fact cache
    hidden = cr.publish({"ansible_facts": {"s": "v"}}, ["n1"], no_log=True)
    assert cr.PUBLISH_KEY not in hidden and hidden["ansible_facts"][cr.HIDDEN_VARS]["vars"] == {"s": "v"}
    k = cr.Keeper()
    assert k.hidden_vars("n1", hidden["ansible_facts"]) == {"n1": {"s": "v"}}
    assert k.hidden_vars("n1", hidden["ansible_facts"]) == {}  # the same fact again: already set
    monkeypatch.delenv(cr.CALLBACK_ENV)
    assert cr.publish({"ansible_facts": {"a": 1}}, ["n1"], no_log=False) == {"ansible_facts": {"a": 1}}
