"""callback_plugins/cluster_lock.py on real ansible-playbook runs (local connection, a lock directory of the test's
own): the lock is refreshed while a run longer than the heartbeat interval lives, given back when it ends (also when
it failed), and no longer touched after it ended or after the controller was killed with -9 (then the lock stays, to
go stale, and the next run takes it over)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from helpers import BIN, REPO, wait_until

# cluster_lock_stale_s 4: a heartbeat every second (lock_keeper: a quarter of it, at least 1 s).
PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - cluster_lock_guard: {path: "{{ lock_dir }}", stale_s: 4}
    - ansible.builtin.pause: {seconds: "{{ hold_s }}"}
    - ansible.builtin.fail: {msg: failing on purpose}
      when: fail_it | bool
    - cluster_lock_guard: {path: "{{ lock_dir }}", state: absent}
"""
INTERVAL_S = 1.0


def start(tmp_path, hold_s, fail_it=False):
    (tmp_path / "pb.yml").write_text(PLAYBOOK)
    log = open(tmp_path / f"run-{time.monotonic_ns()}.log", "w")
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(tmp_path / "pb.yml"),
            "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"lock_dir={tmp_path / 'lock'}",
            "-e", f"hold_s={hold_s}", "-e", f"fail_it={fail_it}"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    return subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def lock_file(tmp_path):
    return tmp_path / "lock" / "cluster.lock"


def mtime(tmp_path):
    try:
        return lock_file(tmp_path).stat().st_mtime
    except FileNotFoundError:
        return None


def log_of(tmp_path):
    return "\n".join(p.read_text() for p in sorted(tmp_path.glob("run-*.log")))


def beats(tmp_path, proc, count, timeout=60):
    """Wait until the lock's mtime moved count times while proc runs; the mtimes seen."""
    seen = []
    deadline = time.monotonic() + timeout
    while len(seen) <= count and time.monotonic() < deadline and proc.poll() is None:
        m = mtime(tmp_path)
        if m is not None and (not seen or m > seen[-1]):
            seen.append(m)
        time.sleep(0.1)
    return seen


def unchanged_for(tmp_path, seconds):
    before = mtime(tmp_path)
    time.sleep(seconds)
    return before is not None and mtime(tmp_path) == before


def test_lock_is_refreshed_during_a_long_run_and_given_back_when_it_ends(tmp_path):
    proc = start(tmp_path, hold_s=12)
    seen = beats(tmp_path, proc, 2)
    record = json.loads(lock_file(tmp_path).read_text()) if lock_file(tmp_path).exists() else None
    assert len(seen) >= 3, f"the lock was not refreshed twice in a run of 12 s: {seen}\n{log_of(tmp_path)[-3000:]}"
    assert record and record["pid"] == proc.pid
    assert proc.wait(timeout=120) == 0, log_of(tmp_path)[-3000:]
    assert mtime(tmp_path) is None, "the run's release task did not give the lock back"
    # Nothing beats after the run: the same lock planted again ages untouched.
    lock_file(tmp_path).write_text(json.dumps(record))
    os.utime(lock_file(tmp_path), (time.time() - 60, time.time() - 60))
    assert unchanged_for(tmp_path, 4 * INTERVAL_S), "a heartbeat still touches the lock after the run ended"


def test_failed_run_gives_the_lock_back_at_exit(tmp_path):
    proc = start(tmp_path, hold_s=3, fail_it=True)
    assert wait_until(lambda: mtime(tmp_path) is not None or proc.poll() is not None, 60, 0.1)
    assert proc.wait(timeout=120) != 0
    out = log_of(tmp_path)
    assert "failing on purpose" in out, out[-3000:]
    assert mtime(tmp_path) is None, "the failed run left its lock:\n" + out[-3000:]


def test_killed_controller_stops_the_heartbeat_and_the_next_run_takes_the_lock_over(tmp_path):
    proc = start(tmp_path, hold_s=60)
    assert len(beats(tmp_path, proc, 1)) >= 2, log_of(tmp_path)[-3000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(3)  # a beat under way at the kill ends on its own
    assert unchanged_for(tmp_path, 4 * INTERVAL_S), "the lock is still refreshed after ansible-playbook was killed"
    assert json.loads(lock_file(tmp_path).read_text())["pid"] == proc.pid, "the killed run's lock is gone"

    again = start(tmp_path, hold_s=0)
    assert again.wait(timeout=120) == 0, log_of(tmp_path)[-3000:]
    flat = " ".join(log_of(tmp_path).split())
    assert f"its ansible-playbook process {proc.pid} no longer runs" in flat, flat[-3000:]
    assert mtime(tmp_path) is None
