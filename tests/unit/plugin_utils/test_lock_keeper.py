"""plugin_utils/lock_keeper.py: the cluster lock's heartbeat in ansible-playbook's own process: the ad-hoc command it
runs (the run's inventory and connection options, never a prompt), the shell script of one beat (run here by a real
sh on real lock files), which locks it beats and when, what it gives back at exit."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time

import pytest

from ansible_collections.trainyard.core.plugins.plugin_utils import lock_keeper as kp

CLIARGS = {"inventory": ("inventory/sim/hosts.yml",), "extra_vars": ("cluster_lock_stale_s=8", "@vars.yml"),
           "remote_user": "ubuntu", "connection": "ssh", "private_key_file": "/k/id", "timeout": 10,
           "ssh_common_args": "-o ProxyJump=bastion", "become": True, "become_user": "root",
           "vault_ids": ["dev@prompt-free"], "vault_password_files": ["/v/pass"], "module_path": ["/m1", "/m2"],
           "ask_pass": True, "become_ask_pass": True, "ask_vault_pass": True, "tags": ("launch",),
           "skip_tags": ("x",), "subset": "node1", "check": True, "diff": True, "forks": 3, "verbosity": 2}


def test_adhoc_argv_repeats_the_inventory_and_connection_options_and_nothing_else():
    argv = kp.adhoc_argv(CLIARGS, ["node1", "node2"], {"path": "/l", "state": "heartbeat", "token": "t"}, "/py")
    assert argv[:4] == ["/py", "-m", "ansible.cli.adhoc", "node1,node2"]
    for opt in ("--inventory=inventory/sim/hosts.yml", "--extra-vars=cluster_lock_stale_s=8", "--extra-vars=@vars.yml",
                "--user=ubuntu", "--connection=ssh", "--private-key=/k/id", "--timeout=10",
                "--ssh-common-args=-o ProxyJump=bastion", "--become", "--become-user=root",
                "--vault-id=dev@prompt-free", "--vault-password-file=/v/pass", "--module-path=/m1:/m2",
                "--module-name=cluster_lock"):
        assert opt in argv, opt
    # a child never asks, runs no tags, no check mode, no --limit (it names its hosts)
    text = " ".join(argv)
    for absent in ("ask", "-k", "-K", "-J", "tags", "limit", "check", "diff", "forks", "-v", "node1 ", "one-line"):
        assert absent not in argv and "--" + absent not in text, absent
    assert json.loads(argv[-1].split("=", 1)[1]) == {"path": "/l", "state": "heartbeat", "token": "t"}


def test_adhoc_argv_with_no_options_names_only_the_hosts_and_the_module():
    argv = kp.adhoc_argv({}, ["n1"], {"path": "/l"}, "/py")
    assert argv == ["/py", "-m", "ansible.cli.adhoc", "n1", "--module-name=cluster_lock", '--args={"path": "/l"}']


def test_beat_argv_runs_the_fixed_script_through_raw_with_the_run_options():
    argv = kp.beat_argv(CLIARGS, ["n1", "n2"], "/var/lib/trainyard-lock", "0a1b", "/py")
    assert argv[:4] == ["/py", "-m", "ansible.cli.adhoc", "n1,n2"]
    assert "--module-name=raw" in argv and "--become" in argv and "--inventory=inventory/sim/hosts.yml" in argv
    command = argv[-1].split("=", 1)[1]
    assert shlex.split(command) == ["sh", "-c", kp.BEAT_SCRIPT, "trainyard-lock-beat", "/var/lib/trainyard-lock",
                                    "0a1b"]


def test_first_problem_names_the_first_node_that_did_not_answer():
    ok = 'n1 | SUCCESS => {"alive": true}\nn2 | SUCCESS => {"alive": true}\n'
    assert kp.first_problem(0, ok) is None
    bad = ok + 'n3 | UNREACHABLE!: Failed to connect to the host via ssh: timeout\n'
    assert kp.first_problem(4, bad) == "n3 | UNREACHABLE!: Failed to connect to the host via ssh: timeout"
    assert kp.first_problem(1, "") == "exit status 1"
    assert len(kp.first_problem(2, "x" * 1000)) == 300
    # ad-hoc's default output: a node's header line, then its output and Ansible's error text
    raw = ("n1 | CHANGED | rc=0 >>\n\n[ERROR]: Task failed: Action failed: non-zero return code\n"
           "n2 | FAILED | rc=1 >>\nnon-zero return code\nn3 | UNREACHABLE! => {\n    \"changed\": false\n}\n")
    assert kp.first_problem(2, raw) == "n2: the lock file is gone or holds another run's token"
    assert kp.first_problem(4, raw.replace("n2 | FAILED | rc=1 >>\n", "")).startswith("n3 | UNREACHABLE!")


RECORD = {"host": 'ctl "token": "t1"', "pid": 1, "token": "0a1b2c", "version": 1}


def beat(lock_dir, token):
    """One heartbeat by a real sh, as the raw module runs it on a node (the command through a shell), in the lock
    directory's parent (where a name that ran as code would leave its file)."""
    return subprocess.run(["sh", "-c", kp.beat_command(lock_dir, token)], cwd=lock_dir.parent, capture_output=True,
                          text=True).returncode


def planted(lock_dir, record=RECORD, age_s=600):
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    lock = lock_dir / "cluster.lock"
    lock.write_text(json.dumps(record, sort_keys=True))  # as module_utils/cluster_lock writes it
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


@pytest.mark.parametrize("name", ["lock", "with space", "it's $(touch pwned) `id`;\nx", "-dash"])
def test_beat_script_touches_only_a_lock_of_its_token_whatever_the_directory_is_called(tmp_path, name):
    lock = planted(tmp_path / name)
    before = lock.stat().st_mtime
    assert beat(tmp_path / "other", "0a1b2c") == 1  # no lock there
    assert beat(tmp_path / name, "0a1b2") == 1 and lock.stat().st_mtime == before  # a prefix of the token
    assert beat(tmp_path / name, "t1") == 1 and lock.stat().st_mtime == before  # a token inside a value
    assert beat(tmp_path / name, "0a1b2c") == 0 and lock.stat().st_mtime > before + 500
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted({name, "cluster.lock"}), "the name ran as code"


def test_beat_script_refuses_a_link_and_never_creates_a_lock(tmp_path):
    target = planted(tmp_path / "elsewhere")
    before = target.stat().st_mtime
    (tmp_path / "lock").mkdir()
    (tmp_path / "lock" / "cluster.lock").symlink_to(target)
    assert beat(tmp_path / "lock", "0a1b2c") == 1 and target.stat().st_mtime == before
    (tmp_path / "empty").mkdir()
    assert beat(tmp_path / "empty", "0a1b2c") == 1 and not (tmp_path / "empty" / "cluster.lock").exists()


def held(host, path="/l", token="t1", interval=2.0, hold=True):
    return host, {"path": path, "token": token, "interval_s": interval, "hold": hold}


def test_keeper_beats_every_interval_one_run_per_lock_dir_and_token():
    k = kp.Keeper()
    for host in ("n2", "n1"):
        k.note(*held(host), now=0.0)
    k.note(*held("n3", path="/other", interval=5.0), now=0.0)
    assert k.holding() and k.due(1.9) == []
    assert k.due(2.0) == [(["n1", "n2"], {"path": "/l", "state": "heartbeat", "token": "t1"})]
    assert k.due(3.0) == []  # next at 4.0
    assert [h for h, _ in k.due(5.0)] == [["n1", "n2"], ["n3"]]


def test_keeper_stops_beating_a_lock_given_back_and_releases_the_rest_at_exit():
    k = kp.Keeper()
    for host in ("n1", "n2", "n3"):
        k.note(*held(host), now=0.0)
    k.note(*held("n2", hold=False), now=1.0)  # unlock.yml gave n2's back
    assert k.due(2.0) == [(["n1", "n3"], {"path": "/l", "state": "heartbeat", "token": "t1"})]
    assert k.release_all() == [(["n1", "n3"], {"path": "/l", "state": "absent", "token": "t1"})]
    assert not k.holding() and k.due(100.0) == [] and k.release_all() == []


def test_keeper_holds_nothing_after_every_lock_is_given_back():
    k = kp.Keeper()
    k.note(*held("n1"), now=0.0)
    k.note(*held("n1", hold=False), now=1.0)
    assert not k.holding() and k.due(10.0) == [] and k.release_all() == []
    k.note("n1", None, now=2.0)
    k.note("n1", {"hold": True}, now=2.0)  # no path: not a lock
    assert not k.holding()


def test_heartbeat_runs_due_beats_reports_the_first_failure_and_releases_at_exit():
    calls = []
    now = [0.0]

    def run(argv):
        module = next(a.split("=", 1)[1] for a in argv if a.startswith("--module-name="))
        calls.append("heartbeat" if module == "raw" else json.loads(argv[-1].split("=", 1)[1])["state"])
        return (4, "n1 | UNREACHABLE!: no route\n") if len(calls) <= 2 else (0, "")

    beat = kp.Heartbeat(kp.Keeper(), {}, run=run, clock=lambda: now[0])
    beat.keeper.note(*held("n1"), now=0.0)
    beat.beat_once()
    assert calls == []
    now[0] = 2.0
    beat.beat_once()
    now[0] = 4.0
    beat.beat_once()
    assert calls == ["heartbeat", "heartbeat"]
    assert beat.problems == ["cluster lock heartbeat of n1: n1 | UNREACHABLE!: no route"]
    beat.release_at_exit()
    assert calls[-1] == "absent" and not beat.keeper.holding()
    beat.release_at_exit()  # atexit and a second call: nothing more
    assert calls.count("absent") == 1


def test_run_adhoc_reports_a_command_that_cannot_start():
    rc, out = kp.run_adhoc(["/nonexistent/python", "-m", "ansible.cli.adhoc"])
    assert rc == 127 and "could not start" in out
