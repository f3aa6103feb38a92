"""The plan of a check-mode run: pending checks, the plan collector, the report and page sections, the launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import REPO, adhoc, load

rep = load("filter_plugins/cluster_report.py", "cluster_report_plan_test")
page = load("filter_plugins/health_page.py", "health_page_plan_test")
pc = load("action_plugins/preflight_check.py", "preflight_check_plan_test")
cb = load("callback_plugins/trainyard_plan.py", "trainyard_plan_test")


def rec(host, check, status, **kw):
    return {"host": host, "check": check, "status": status, "run": "r1", "detail": kw.get("detail", ""),
            "fix": kw.get("fix", ""), "data": kw.get("data", {})}


def test_a_check_is_pending_only_when_a_task_it_depends_on_would_change():
    r = {"host": "a", "check": "nvidia_driver.device_order", "status": "fail", "detail": "not set", "fix": "set it",
         "data": {}}
    assert pc.pending_record(r, {"t": {"changed": False}}) == r
    assert pc.pending_record(r, {"t": {"skipped": True, "changed": True}}) == r
    p = pc.pending_record(r, {"nvidia_driver : Configure": {"changed": True}, "other": {"changed": False}})
    assert p["status"] == "pending" and p["detail"] == "now: not set"
    assert p["fix"] == "the run does it: nvidia_driver : Configure"
    assert p["data"]["status_now"] == "fail"
    assert pc.would_change({"results": [{"changed": False}, {"changed": True}]})


PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Write the order line
      ansible.builtin.lineinfile:
        path: {env}
        line: CUDA_DEVICE_ORDER=PCI_BUS_ID
        create: true
        mode: "0644"
      register: __order
    - name: Record
      preflight_check:
        records:
          - {{check: t.order, ok: "{{{{ lookup('file', '{env}', errors='ignore') is search('PCI_BUS_ID') }}}}"}}
          - {{check: t.other, ok: false, detail: a real fault, fix: fix it}}
        pending_checks: [t.order]
        pending_on:
          "Write the order line": "{{{{ __order }}}}"
    - name: Show
      ansible.builtin.debug:
        msg: "RESULT {{{{ {{'records': preflight_results, 'plan': trainyard_plan | default([])}} | to_json }}}}"
"""


def _play(tmp_path, *flags):
    pb = tmp_path / "pb.yml"
    pb.write_text(PLAYBOOK.format(env=tmp_path / "environment"))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "n1,", "-c", "local",
                          "-e", f"ansible_python_interpreter={sys.executable}", str(pb), *flags],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120).stdout
    line = next(ln for ln in out.splitlines() if "RESULT " in ln)
    return json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"][len("RESULT "):])


def test_check_mode_records_pending_and_the_plan_with_its_diff(tmp_path):
    got = _play(tmp_path, "--check", "--diff")
    status = {r["check"]: r for r in got["records"]}
    assert status["t.order"]["status"] == "pending"
    assert status["t.order"]["fix"] == "the run does it: Write the order line"
    assert status["t.other"]["status"] == "fail"  # not on the task's pending list: a real fault stays a fault
    assert not (tmp_path / "environment").exists()
    [entry] = got["plan"]
    assert entry["kind"] == "file" and entry["task"] == "Write the order line"
    assert entry["summary"] == f"write {tmp_path / 'environment'}"
    assert "+CUDA_DEVICE_ORDER=PCI_BUS_ID" in entry["diff"]


def test_outside_check_mode_nothing_is_pending_and_no_plan(tmp_path):
    got = _play(tmp_path)
    status = {r["check"]: r["status"] for r in got["records"]}
    assert status == {"t.order": "pass", "t.other": "fail"}
    assert got["plan"] == []


def test_an_action_that_writes_through_job_files_in_its_own_call_is_a_file_change():
    # nccl_env_validate builds the env file and writes it with job_files in one task: its result carries the write's
    # files; a changed one makes the entry a file change named by its path (whatever the action's name).
    res = {"changed": True, "files": [{"path": "/var/lib/trainyard/j/job-ro/nccl.env", "changed": True}],
           "diff": [{"before": "A=1\nNCCL_DEBUG=TRACE\n", "after": "A=1\n", "before_header": "nccl.env",
                     "after_header": "nccl.env"}]}
    assert cb.kind_of("nccl_env_validate", res) == "file"
    assert cb.summarize("nccl_env_validate", {}, res) == "write /var/lib/trainyard/j/job-ro/nccl.env"
    assert "-NCCL_DEBUG=TRACE" in cb.diff_text(res["diff"])
    assert cb.kind_of("nccl_env_validate", {"changed": True, "files": [{"path": "/x", "changed": False}]}) == "other"
    assert cb.kind_of("nccl_env_validate") == "other"


def test_plan_summaries_name_what_the_run_would_do():
    assert cb.summarize("community.docker.docker_image_pull", {"name": "reg:5055/t/train:sim", "tag": "latest"},
                        {}) == "pull reg:5055/t/train:sim"
    assert cb.summarize("community.docker.docker_container", {"name": "c"},
                        {"actions": [{"create": {}}, {"start": "x"}]}) == "create and start container c (it does not exist)"
    assert cb.summarize("community.docker.docker_container", {"name": "c"},
                        {"actions": [{"recreate": {}}], "diff": {"differences": [{"image": {}}, {"env": {}}]}}) \
        == "recreate container c (differs in: image, env)"
    assert cb.summarize("ansible.builtin.apt", {"name": ["a", "b"], "state": "present"}, {}) == "packages present: a, b"
    assert cb.summarize("torchrun_launch", {"job": "train"}, {"plan": {"summary": "relaunch job train (x)"}}) \
        == "relaunch job train (x)"
    assert cb.diff_text([{"before": "a\n", "after": "b\n", "before_header": "/f", "after_header": "/f"}]).splitlines() \
        == ["--- before: /f", "+++ after: /f", "@@ -1 +1 @@", "-a", "+b"]


def _plan_report(check_mode=True):
    results = {"a": [rec("a", "container.image_digest", "pending", fix="the run does it: pull"),
                     rec("a", "container.registry_reach", "pass", data={"registry_digest": "sha256:abc"})],
               "b": [rec("b", "container.image_digest", "pass")]}
    plans = {"a": [{"task": "container : Pull", "kind": "image", "summary": "pull x", "diff": "", "changed": True},
                   {"task": "nccl_env : Render", "kind": "file", "summary": "write /n.env", "diff": "-A=1\n+A=2\n"},
                   {"task": "launch : Start", "kind": "job", "summary": "start job train", "changed": True,
                    "job": {"action": "start"}}],
             "b": [{"task": "launch : Start", "kind": "job", "summary": "leave job train running", "changed": False,
                    "job": {"action": "leave_running"}}]}
    return rep.build_report(results, ["a", "b"], {"a": {"node_rank": 0}, "b": {"node_rank": 1}}, run_id="r1",
                            plans=plans, check_mode=check_mode)


def test_report_plan_pending_is_not_a_failure_and_pulls_carry_the_digest():
    r = _plan_report()
    assert not r["failed"] and r["summary"]["pending"] == 1
    assert [p["check"] for p in r["pending"]] == ["container.image_digest"]
    assert r["plan"]["a"][0]["digest"] == "sha256:abc"
    assert rep.plan_verdict(r) == ("Plan: 3 change(s) on 1 of 2 node(s), 1 check(s) pending on them, "
                                   "nothing that would still fail")
    lines = rep.plan_lines(r, diffs=True)
    assert "b: no change" in lines and "  job: leave job train running (no change) (task: launch : Start)" in lines
    assert "    +A=2" in lines
    md = rep.markdown(r)
    assert "## Plan (check mode: nothing was changed)" in md and "digest `sha256:abc`" in md
    assert "```diff" in md and "### Pending checks" in md
    assert "plan" not in _plan_report(check_mode=False)


def test_a_launch_that_would_stop_the_run_fails_the_plan():
    plans = {"a": [{"task": "launch : Start", "kind": "job", "summary": "stop here", "changed": False,
                    "job": {"action": "blocked", "reason": "job train runs with another command"}}]}
    r = rep.build_report({"a": [rec("a", "cluster.shm", "pass")]}, ["a"], plans=plans, check_mode=True)
    assert r["failed"] and [(f["host"], f["check"]) for f in r["failures"]] == [("a", "launch.plan")]
    assert "runs with another command" in r["failures"][0]["detail"]


def test_health_page_plan_section_only_for_a_plan():
    html = page.render(_plan_report())
    assert '<section id="plan" data-changes="3" data-pending="1">' in html
    assert 'class="ok plan-empty" data-host="b"' in html
    assert "sha256:abc" in html and "+A=2" in html
    assert 'class="cell pending"' in html
    assert 'id="plan"' not in page.render(_plan_report(check_mode=False))


def test_launch_check_mode_says_start_or_relaunch_and_the_checkpoint(tmp_path):
    out = tmp_path / "out"
    ckpt = out / "checkpoint-20"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    args = {"job": "train", "state_root": str(tmp_path / "state"), "nnodes": 2, "nproc_per_node": 1, "node_rank": 0,
            "master_addr": "127.0.0.1", "entrypoint": "/srv/code/train.py", "resume_from": "auto",
            "output_root": str(out), "env_files": [str(tmp_path / "nccl.env")]}
    r = adhoc("torchrun_launch", args, "--check")
    assert r["changed"] and r["plan"]["action"] == "start", r
    assert r["plan"]["resume_from"] == str(ckpt)
    assert r["plan"]["env_files_pending"] == [str(tmp_path / "nccl.env")]
    assert r["plan"]["summary"] == f"start job train (first launch on this node), resume from {ckpt}"
    assert not (tmp_path / "state").exists()
    # An earlier launch that ended, with another command: a relaunch because the fingerprint changed.
    (tmp_path / "state" / "train").mkdir(parents=True)
    (tmp_path / "state" / "train" / "launch.json").write_text(json.dumps({
        "version": 1, "job": "train", "runtime": "host", "container": "", "pid": 999999, "pgid": 999999,
        "start_ticks": 1, "started_at": 1.0, "command": ["torchrun", "old.py"], "env_files": [], "log": "/nonexistent",
        "node_rank": 0, "master_port": 29500, "resume_from": "", "sidecars": [], "token": "t", "fingerprint": "old",
        "exit_file": "/nonexistent"}))
    r = adhoc("torchrun_launch", args, "--check")
    assert r["plan"]["action"] == "relaunch", r
    assert "the command fingerprint changed" in r["plan"]["reason"]


class _Unread:
    """A task result whose result must not be read: reading it converts the whole result in ansible-playbook's own
    process, per host and task."""

    def __init__(self, action, check_mode):
        self.task = type("T", (), {"action": action, "check_mode": check_mode, "no_log": False,
                                   "get_name": lambda self: action})()
        self.host = type("H", (), {"get_name": lambda self: "node1"})()

    @property
    def result(self):
        raise AssertionError("result read for %s" % self.task.action)


def test_callbacks_read_no_result_of_a_task_they_do_not_concern():
    lock = load("callback_plugins/cluster_lock.py", "cluster_lock_unread_test")
    lock_cb = lock.CallbackModule()
    for action in ("ansible.builtin.debug", "preflight_check", "trainyard.core.job_files"):
        lock_cb.v2_runner_on_ok(_Unread(action, False))
    plan_cb = cb.CallbackModule()
    plan_cb._vm = object()  # a play started
    for action in ("torchrun_launch", "ansible.builtin.copy"):
        plan_cb.v2_runner_on_ok(_Unread(action, False))  # outside check mode
        plan_cb.v2_runner_on_failed(_Unread(action, False))
    plan_cb.v2_runner_on_failed(_Unread("ansible.builtin.copy", True))  # not a launch
    # The guard's own result is read (the lock's heartbeat depends on it).
    try:
        lock_cb.v2_runner_on_ok(_Unread("cluster_lock_guard", False))
    except AssertionError as exc:
        assert "cluster_lock_guard" in str(exc)
    else:
        raise AssertionError("the guard's result was not read")
