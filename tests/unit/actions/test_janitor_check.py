"""action_plugins/janitor_check.py: the janitor's files written, its dry run and the record janitor.dry_run in one
task per node (issue 35: fewer tasks per node). Each case runs the action in a real play on this machine (the local
connection, a temporary tree); plugin_utils/janitor_checks.py's verdict is checked on the command module's answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import BIN, REPO, load

JC = load("collections/ansible_collections/trainyard/core/plugins/plugin_utils/janitor_checks.py", "janitor_checks_test")
FOUND = {"checkpoints": 3, "deletions": ["a", "b"], "total_bytes": 2048, "scan_seconds": 0.01}


def play(tmp_path: Path, dry_run: list, check: bool = False, files: list | None = None,
         user: str = "nobody", user_create: bool = False, **more) -> tuple[int, dict, dict]:
    """(rc, the janitor_check task's result, this host's facts after it) of one run."""
    root = tmp_path / "out"
    root.mkdir(exist_ok=True)
    files = files if files is not None else [{"path": str(tmp_path / "state" / "janitor.json"), "content": "{}\n",
                                              "mode": "0644"}]
    (tmp_path / "play.yml").write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False, "tasks": [
            {"name": "Copy, dry-run and record", "register": "r", "ignore_errors": True, "janitor_check": {
                "files": {"roots": [str(root)], "directories": [{"path": str(tmp_path / "state"), "mode": "0750"}],
                          "files": files},
                "dry_run": dry_run, "root": str(root), "python": "python3", "user": user,
                "user_create": user_create, "systemd": False,
                "sidecar": {"name": "janitor", "argv": ["x"]}, **more}},
            {"name": "Show", "ansible.builtin.debug": {"msg": "RESULT {{ {'r': r, 'records': preflight_results | "
                                                               "default([]), 'sidecar': janitor_sidecar | default(none)}"
                                                               " | to_json }}"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", *(["--check"] * check),
                        "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    line = next(ln for ln in p.stdout.splitlines() if "RESULT " in ln)
    got = json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"][len("RESULT "):])
    return p.returncode, got["r"], got


def printer(obj) -> list:
    return [sys.executable, "-c", f"print({json.dumps(json.dumps(obj))})"]


def test_one_task_writes_the_files_runs_the_dry_run_and_records_it_with_the_published_fact(tmp_path):
    rc, r, got = play(tmp_path, printer(FOUND))
    assert rc == 0 and r["changed"] and (tmp_path / "state" / "janitor.json").read_text() == "{}\n", r
    (rec,) = got["records"]
    assert rec["check"] == "janitor.dry_run" and rec["status"] == "pass" and rec["host"] == "localhost", rec
    assert rec["detail"] == f"{tmp_path / 'out'}: 3 checkpoints, 2 files (2048 bytes) to free now, scan 0.01 s"
    assert got["sidecar"] == {"name": "janitor", "argv": ["x"]} and r["dry_run"]["rc"] == 0
    # Converged: the files are the same, nothing changes, the dry run runs again.
    rc, r, got = play(tmp_path, printer(FOUND))
    assert rc == 0 and not r["changed"] and got["records"][0]["status"] == "pass", r


def test_a_failing_dry_run_is_the_records_failure_naming_its_error_not_the_tasks(tmp_path):
    rc, r, got = play(tmp_path, [sys.executable, "-c", "import sys; sys.exit('setpriv: no such user')"])
    assert rc == 0 and not r.get("failed"), r
    (rec,) = got["records"]
    assert rec["status"] == "fail" and "setpriv: no such user" in rec["detail"], rec
    assert "readable by nobody with CAP_DAC_OVERRIDE" in rec["fix"], rec
    rc, r, got = play(tmp_path, ["/nonexistent/python3"])
    assert got["records"][0]["status"] == "fail" and "nonexistent" in got["records"][0]["detail"], got


def test_check_mode_runs_the_dry_run_unless_the_script_is_not_there_yet_then_pending_on_this_task(tmp_path):
    rc, r, got = play(tmp_path, printer(FOUND), check=True)
    assert rc == 0 and r["changed"] and not (tmp_path / "state").exists() and "dry_run" not in r, r
    (rec,) = got["records"]
    assert rec["status"] == "pending" and rec["data"]["status_now"] == "skip", rec
    assert rec["fix"] == "the run does it: Copy, dry-run and record", rec
    play(tmp_path, printer(FOUND))  # the real run writes the files
    rc, r, got = play(tmp_path, printer(FOUND), check=True)
    assert not r["changed"] and r["dry_run"]["rc"] == 0 and got["records"][0]["status"] == "pass", r


def getent(name: str) -> bool:
    return subprocess.run(["getent", "passwd", name], capture_output=True).returncode == 0


def test_the_users_creation_is_the_same_task_converged_when_the_user_exists(tmp_path):
    # nobody exists with /usr/sbin/nologin on Debian: user_create changes nothing, the files and dry run go on.
    rc, r, got = play(tmp_path, printer(FOUND), user_create=True)
    assert rc == 0 and r["user"]["name"] == "nobody" and r["user"]["changed"] is False, r
    assert got["records"][0]["status"] == "pass"
    rc, r, got = play(tmp_path, printer(FOUND), user_create=True)
    assert rc == 0 and not r["changed"], r


def test_no_user_module_where_the_host_probe_saw_the_user_without_a_login_shell(tmp_path):
    # The cluster role's host probe read the shell (trainyard_init.users): nologin, no module run; else the module.
    name = "ty-janitor-%d" % os.getpid()
    rc, r, got = play(tmp_path, printer(FOUND), user=name, user_create=True, user_shell="/usr/sbin/nologin")
    assert rc == 0 and r["user"] == {"name": name, "changed": False, "shell": "/usr/sbin/nologin"}, r
    assert not getent(name) and got["records"][0]["status"] == "pass", r
    rc, r, got = play(tmp_path, printer(FOUND), check=True, user=name, user_create=True, user_shell="/bin/bash")
    assert r["user"]["changed"] and not getent(name), r


def test_the_mode_systemd_where_systemd_runs_the_node_and_no_sidecar_fact(tmp_path):
    rc, r, got = play(tmp_path, printer(FOUND), systemd=True)
    assert rc == 0 and r["mode"] == "systemd" and got["sidecar"] is None, r
    rc, r, got = play(tmp_path, printer(FOUND), mode="systemd")
    assert r["failed"] and "janitor_mode=systemd but systemd is not PID 1 here" in r["msg"], r
    assert "files" not in r and got["records"] == [], r


def test_check_mode_with_a_user_to_create_creates_nothing_and_is_pending_on_this_task(tmp_path):
    name = "ty-janitor-%d" % os.getpid()
    assert not getent(name)
    play(tmp_path, printer(FOUND))  # the files are there: only the user would change
    rc, r, got = play(tmp_path, printer(FOUND), check=True, user=name, user_create=True)
    assert rc == 0 and r["changed"] and r["user"]["changed"] and not getent(name), r
    (rec,) = got["records"]
    assert rec["status"] == "pending" and rec["fix"] == "the run does it: Copy, dry-run and record", rec


def test_a_user_that_cannot_be_created_fails_the_task_naming_the_variable_before_any_write(tmp_path):
    rc, r, got = play(tmp_path, printer(FOUND), user="no/such:user", user_create=True)
    assert r["failed"] and "creating the janitor's user no/such:user failed" in r["msg"], r
    assert "janitor_user" in r["msg"] and not (tmp_path / "state").exists() and got["records"] == [], r
    assert not getent("no/such:user")


def test_a_write_that_fails_fails_the_task_and_records_nothing(tmp_path):
    rc, r, got = play(tmp_path, printer(FOUND), files=[{"path": "relative/janitor.json", "content": "{}", "mode": "0644"}])
    assert r["failed"] and r["msg"] and "dry_run" not in r and got["records"] == [], r


@pytest.mark.parametrize("run,status,detail", [
    (None, "skip", JC.SKIPPED),
    ({"rc": 0, "stdout": json.dumps(FOUND)}, "pass", "/o: 3 checkpoints, 2 files (2048 bytes) to free now, scan 0.01 s"),
    ({"rc": 0, "stdout": "not json"}, "fail", "the dry run's output is not the janitor's JSON"),
    ({"rc": 0, "stdout": "{}"}, "fail", "the dry run's output is not the janitor's JSON (KeyError"),
    ({"rc": 1, "stderr": "x" * 400}, "fail", "x" * 297 + "..."),
    ({"rc": 2, "msg": "Error executing command.", "cmd": "/x/setpriv", "stderr": ""}, "fail",
     "Error executing command. (exit 2): /x/setpriv"),
])
def test_the_verdict(run, status, detail):
    rec = JC.dry_run_record(run, "/o", "python3", "u")
    assert rec["check"] == "janitor.dry_run" and rec["status"] == status and rec["detail"].startswith(detail), rec
    assert (rec["fix"] == "") == (status == "pass")
