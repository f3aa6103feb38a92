"""The preflight report: records of this run only, unreachable nodes marked, table and Markdown of every check."""

from __future__ import annotations

import json

from helpers import load

rep = load("filter_plugins/cluster_report.py", "cluster_report")
HOSTS = ["b", "a", "c"]
MODELS = {"a": {"node_rank": 0}, "b": {"node_rank": 1}, "c": {"node_rank": 2}}


def rec(host, check, status, run="r1", **kw):
    return {"host": host, "check": check, "status": status, "detail": kw.get("detail", ""), "fix": kw.get("fix", ""),
            "data": {}, "run": run}


def test_hosts_in_rank_order_and_unreachable_marked():
    results = {"a": [rec("a", "cluster.shm", "pass")], "b": [rec("b", "cluster.shm", "fail", fix="grow it")], "c": None}
    r = rep.build_report(results, HOSTS, MODELS, run_id="r1")
    assert r["hosts"] == ["a", "b", "c"]
    assert r["summary"] == {"pass": 1, "fail": 1, "warn": 0, "skip": 0, "unreachable": 1}
    assert r["failed"] and [(f["host"], f["check"]) for f in r["failures"]] == [("b", "cluster.shm"),
                                                                                 ("c", "host.reachable")]
    json.dumps(r)  # serialisable as report.json


def test_records_of_another_run_are_ignored():
    results = {"a": [rec("a", "cluster.shm", "pass", run="old")], "b": [rec("b", "cluster.shm", "pass")],
               "c": [rec("c", "cluster.shm", "pass")]}
    r = rep.build_report(results, HOSTS, MODELS, run_id="r1")
    assert {(x["host"], x["status"]) for x in r["records"]} == {("a", "unreachable"), ("b", "pass"), ("c", "pass")}


def test_invalid_status_counts_as_failure():
    r = rep.build_report({"a": [rec("a", "x.y", "bogus")]}, ["a"], run_id="r1")
    assert r["records"][0]["status"] == "fail" and r["failed"]


def test_table_has_a_row_per_node_and_a_column_per_check():
    results = {"a": [rec("a", "cluster.shm", "pass"), rec("a", "cluster.docker", "warn")],
               "b": [rec("b", "cluster.shm", "fail")], "c": []}
    lines = rep.table(rep.build_report(results, HOSTS, MODELS, run_id="r1"))
    assert lines[0].split() == ["node", "rank", "cluster.shm", "cluster.docker", "host.reachable"]
    assert lines[2].split() == ["a", "0", "ok", "warn", "-"]
    assert lines[3].split() == ["b", "1", "FAIL", "-", "-"]
    assert lines[4].split() == ["c", "2", "UNREACH", "UNREACH", "UNREACH"]
    assert lines[-1] == "1 pass, 1 fail, 1 warn, 0 skip, 1 unreachable"


def test_failure_lines_list_every_failure_with_its_fix():
    results = {"a": [rec("a", "cluster.shm", "fail", detail="64 MiB", fix="grow it")],
               "b": [rec("b", "cluster.disk", "fail", detail="1 GiB free")], "c": [rec("c", "cluster.shm", "pass")]}
    assert rep.failure_lines(rep.build_report(results, HOSTS, MODELS, run_id="r1")) == [
        "a: cluster.shm FAIL: 64 MiB | Fix: grow it", "b: cluster.disk FAIL: 1 GiB free"]


def test_markdown_escapes_pipes_and_lists_failures():
    results = {"a": [rec("a", "cluster.shm", "fail", detail="x | y", fix="f")], "b": [], "c": []}
    md = rep.markdown(rep.build_report(results, HOSTS, MODELS, run_id="r1"))
    assert "| a | 0 | FAIL |" in md and "x \\| y" in md and "**FAILED**" in md
    assert "- **a** `cluster.shm` fail: x \\| y — fix: f" in md


def test_preflight_check_keeps_only_this_runs_records():
    pc = load("action_plugins/preflight_check.py", "preflight_check_under_test")
    assert pc._run_id({"hostvars": {"localhost": {"_cluster_run_id": "r9"}}}) == "r9"
    assert pc._run_id({"hostvars": {}}) is None
    record = pc.ActionModule._record({"check": "cluster.shm", "ok": "false", "detail": " 64 MiB\n", "fix": "grow"}, "a")
    assert record == {"host": "a", "check": "cluster.shm", "status": "fail", "detail": "64 MiB", "fix": "grow",
                      "data": {}}
    assert pc.ActionModule._record({"check": "c", "ok": True, "fix": "x"}, "a")["fix"] == ""


def test_a_failed_check_is_printed_when_it_is_recorded(tmp_path):
    """The first failure is on the screen when its check runs, not only in the report at the end."""
    import os
    import subprocess
    import sys

    from helpers import REPO

    pb = tmp_path / "pb.yml"
    pb.write_text("""
- hosts: all
  gather_facts: false
  tasks:
    - preflight_check:
        records:
          - {check: cluster.shm, ok: false, detail: /dev/shm 64 MiB, fix: give the container shm_size 16g}
          - {check: cluster.docker, ok: true, detail: engine 27.3}
    - ansible.builtin.debug: {msg: the next task}
""")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    out = subprocess.run([str(os.path.join(os.path.dirname(sys.executable), "ansible-playbook")), "-i", "n1,",
                          "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", str(pb)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120).stdout
    line = "n1: cluster.shm FAIL: /dev/shm 64 MiB\n    fix: give the container shm_size 16g"
    assert line in out, out
    assert out.index(line) < out.index("TASK [ansible.builtin.debug]")
    assert "cluster.docker" not in out  # a passing check prints nothing


def test_what_every_node_shares_is_written_once():
    """report.json at 1,024 nodes: the run stamp is the report's run_id and hosts_by_rank its hosts (not n² names);
    the counts, failures and every other model key stay."""
    order = ["a", "b", "c"]
    models = {h: dict(MODELS[h], nnodes=3, hosts_by_rank=order) for h in MODELS}
    results = {h: [rec(h, "cluster.shm", "fail" if h == "c" else "pass")] for h in HOSTS}
    r = rep.build_report(results, HOSTS, models, run_id="r1")
    assert all("run" not in x for x in r["records"])
    assert r["cluster_model"]["b"] == {"node_rank": 1, "nnodes": 3} and r["hosts"] == order
    assert r["summary"]["fail"] == 1 and [f["host"] for f in r["failures"]] == ["c"]
    # A model whose hosts_by_rank is not the report's hosts (a recover plan) keeps it.
    models["a"]["hosts_by_rank"] = ["a", "b"]
    assert rep.build_report(results, HOSTS, models, run_id="r1")["cluster_model"]["a"]["hosts_by_rank"] == ["a", "b"]
    # Without a run id nothing was filtered by it: the stamps stay.
    assert all(x["run"] == "r1" for x in rep.build_report(results, HOSTS, models)["records"])


def test_report_models_drop_hosts_by_rank_only_where_it_is_the_whole_cluster():
    f = load("filter_plugins/cluster_report.py", "cluster_report").FilterModule().filters()["trainyard_report_models"]
    ranks = ["n2", "n1", "n3"]
    models = {"n1": {"node_rank": 1, "hosts_by_rank": list(ranks)},
              "n2": {"node_rank": 0, "hosts_by_rank": ["n2", "n1"]},  # a kept node's model after an exclusion
              "n3": {"node_rank": 2}}
    out = f(models, ranks)
    assert out == {"n1": {"node_rank": 1}, "n2": {"node_rank": 0, "hosts_by_rank": ["n2", "n1"]}, "n3": {"node_rank": 2}}
    assert models["n1"]["hosts_by_rank"] == ranks, "the input is not changed"


def test_run_links_name_the_newest_run_of_any_inventory_and_of_this_cluster():
    """runs/latest is the newest run of any inventory run from this checkout; runs/latest-<inventory directory> the
    newest of this cluster (what playbooks/export.yml reads). A run directory outside runs/ gets no link; an inventory
    directory whose name is not a plain file name gets only runs/latest."""
    assert rep.run_links("/p/runs/20261129T0400Z/", "/p/inventory/prod") == [
        {"path": "/p/runs/latest", "target": "20261129T0400Z"},
        {"path": "/p/runs/latest-prod", "target": "20261129T0400Z"}]
    assert rep.run_links("/p/runs/r1", "") == [{"path": "/p/runs/latest", "target": "r1"}]
    assert rep.run_links("/srv/reports/r1", "/p/inventory/prod") == []
    for bad in ("/p/inventory/..", "/p/inventory/a b", "/p/inventory/-x", None, "/"):
        assert rep.cluster_latest(bad) == "latest", bad
    assert rep.cluster_latest("/p/inventory/sim-tp4/") == "latest-sim-tp4"
