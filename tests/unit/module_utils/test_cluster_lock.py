"""module_utils/cluster_lock.py: who and what, staleness, the message, the lock file itself; library/cluster_lock.py
run by the real `ansible` on this machine."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import cluster_lock as lk
from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg
from helpers import adhoc

HERE = "ctl1"
BOOT = "b00t"
NS = "pid:[4026531836]"


def record(token="t1", host=HERE, pid=4242, ticks=100, **kw):
    r = {"version": 1, "token": token, "user": "alice", "host": host, "boot_id": BOOT, "pid_ns": NS, "pid": pid,
         "pid_ticks": ticks, "playbooks": ["site.yml"], "tags": ["all"], "skip_tags": []}
    r.update(kw)
    return r


# ------------------------------------------------------------------ who and what

def test_playbooks_from_argv_skips_option_values():
    argv = ["/venv/bin/ansible-playbook", "-i", "inventory/c.yml", "-e", "x.yml", "--tags=launch",
            "playbooks/site.yml", "--limit", "a.yml", "reset.yml", "-v"]
    assert lk.playbooks_from_argv(argv) == ["site.yml", "reset.yml"]
    assert lk.playbooks_from_argv([]) == []


def test_run_token_is_one_per_process_run():
    t = lk.run_token(HERE, BOOT, 10, 500)
    assert t == lk.run_token(HERE, BOOT, 10, 500)
    assert len({t, lk.run_token(HERE, BOOT, 10, 501), lk.run_token(HERE, "other", 10, 500),
                lk.run_token("ctl2", BOOT, 10, 500), lk.run_token(HERE, BOOT, 11, 500)}) == 5


def test_owner_record_names_who_and_what():
    r = lk.owner_record("bob", HERE, BOOT, 77, 900, ["site.yml"], ["launch"], ["nccl_check"], NS)
    assert r["token"] == lk.run_token(HERE, BOOT, 77, 900) and r["pid_ns"] == NS
    assert (r["user"], r["host"], r["pid"], r["pid_ticks"]) == ("bob", HERE, 77, 900)
    assert (r["playbooks"], r["tags"], r["skip_tags"]) == (["site.yml"], ["launch"], ["nccl_check"])
    assert lk.owner_record("bob", HERE, BOOT, 77, 900, [], None, None)["tags"] == ["all"]


def test_describe_says_who_what_and_since_when():
    text = lk.describe(record(acquired_at=0, tags=["launch"], skip_tags=["nccl_check"]), 185)
    assert text == ("alice@ctl1 (ansible-playbook PID 4242) running site.yml (tags: launch) (skip-tags: nccl_check) "
                    "since 1970-01-01 00:00:00 UTC (3 min ago)")
    assert "(tags" not in lk.describe(record(acquired_at=0))
    assert lk.describe(None) == "an unknown holder"


def test_proc_liveness_uses_the_start_time(tmp_path):
    me = os.getpid()
    ticks = lk.proc_start_ticks(me)
    assert ticks is not None and lk.pid_alive(me, ticks) is True
    assert lk.pid_alive(me, ticks + 1) is False  # the PID was reused by another process
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert lk.pid_alive(p.pid, None) is False
    assert lk.boot_id() and lk.boot_id(str(tmp_path)) == ""
    assert lk.pid_namespace().startswith("pid:[") and lk.pid_namespace(str(tmp_path)) == ""


def test_a_killed_process_is_dead_before_it_is_reaped():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ticks = lk.proc_start_ticks(p.pid)
    try:
        assert lk.pid_alive(p.pid, ticks) is True
        os.kill(p.pid, signal.SIGKILL)
        wait_for_zombie(p.pid)
        assert lk.pid_alive(p.pid, ticks) is False  # a zombie: killed, its parent has not reaped it yet
    finally:
        p.kill()
        p.wait()
    assert lk.pid_alive(p.pid, ticks) is False


def wait_for_zombie(pid):
    while (pg.read_stat(pid) or pg.ProcStat(pid, "", "X", 0, 0, 0, 0)).state not in ("Z", "X"):
        os.sched_yield()


# ------------------------------------------------------------------ staleness

def alive(state):
    return lambda pid, ticks: state


@pytest.mark.parametrize("holder, hb, proc, verdict, words", [
    (record(), 9999, True, lk.LIVE, "runs on this controller"),          # same host, process runs: live
    (record(), 1, False, lk.GONE, "process 4242 no longer runs on ctl1"),  # same host, process gone: take over
    (record(boot_id="old"), 1, False, lk.STALE, "restarted"),            # same host, rebooted since: break only
    (record(boot_id=""), 1, False, lk.LIVE, "heartbeat is 1 s old"),     # no boot id: not provable
    (record(pid_ns="pid:[1]"), 1, False, lk.LIVE, "heartbeat"),          # another PID namespace of this host
    (record(pid_ns="pid:[1]"), 301, False, lk.STALE, "no heartbeat"),
    (record(pid_ns=None), 1, False, lk.LIVE, "heartbeat"),               # a record without namespace
    (record(), 10, None, lk.LIVE, "heartbeat is 10 s old"),              # same host, /proc unknowable
    (record(), 400, None, lk.STALE, "no heartbeat for"),
    (record(host="ctl2"), 299, False, lk.LIVE, "heartbeat"),             # other host: the heartbeat decides
    (record(host="ctl2"), 301, True, lk.STALE, "no heartbeat for 5 min"),
    ({}, 10, True, lk.LIVE, "unreadable"),                                # unreadable record, recent
    ({}, 301, True, lk.STALE, "unreadable"),
])
def test_judge(holder, hb, proc, verdict, words):
    got, reason = lk.judge(holder, hb, 300, HERE, BOOT, alive=alive(proc), here_ns=NS)
    assert got == verdict and words in reason, reason


def test_a_killed_holder_is_taken_over_and_a_live_one_is_not(tmp_path):
    """A real lock file held by a real process of this machine: while it runs it blocks; once killed (a zombie
    still, then reaped) its lock is taken over, and the message names it."""
    d = str(tmp_path / "locks")
    here, boot, ns = socket.gethostname(), lk.boot_id(), lk.pid_namespace()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        old = lk.owner_record("alice", here, boot, p.pid, lk.proc_start_ticks(p.pid), ["site.yml"], pid_ns=ns)
        assert lk.acquire(d, old)["created"]
        me = lk.owner_record("bob", here, boot, os.getpid(), lk.proc_start_ticks(os.getpid()), ["reset.yml"],
                             pid_ns=ns)
        found = lk.acquire(d, me)
        verdict, reason = lk.judge(found["holder"], found["heartbeat_age_s"], 300, here, boot)
        assert (verdict, reason) == (lk.LIVE, "its ansible-playbook process runs on this controller")
        os.kill(p.pid, signal.SIGKILL)
        wait_for_zombie(p.pid)
        found = lk.acquire(d, me)
        verdict, reason = lk.judge(found["holder"], found["heartbeat_age_s"], 300, here, boot)
        assert verdict == lk.GONE and f"process {p.pid} no longer runs on {here}" in reason
        took = lk.acquire(d, me, break_token=found["holder"]["token"])
        assert took["acquired"] and took["broken"]["pid"] == p.pid and lk.read(d)[0]["token"] == me["token"]
        msg = lk.takeover_message("node1", took["broken"], found["age_s"], reason)
        assert "\n" not in msg and msg.startswith(f"node1: took over the cluster lock of alice@{here} "
                                                  f"(ansible-playbook PID {p.pid}) running site.yml since ")
    finally:
        p.kill()
        p.wait()
    # Reaped, and a process with another start time under the PID: still dead to the lock.
    reused = dict(old, pid=os.getpid(), token="reused")
    assert lk.judge(reused, 0, 300, here, boot)[0] == lk.GONE


def test_held_message_is_one_line_with_holder_and_fix():
    msg = lk.held_message("node1", "/var/lib/trainyard-lock/cluster.lock", record(acquired_at=0), 70, waited_s=60)
    assert "\n" not in msg
    assert msg.startswith("Cluster lock /var/lib/trainyard-lock/cluster.lock on node1 is held by alice@ctl1 "
                          "(ansible-playbook PID 4242) running site.yml since 1970-01-01 00:00:00 UTC (70 s ago)")
    assert "waited 60 s (cluster_lock_wait_s)" in msg and "wait for that run to end and rerun" in msg
    stale = lk.held_message("node1", "/l", record(acquired_at=0), 70, stale_reason="its process is gone")
    assert "\n" not in stale and "holder is gone (its process is gone)" in stale
    assert stale.endswith("then rerun with -e cluster_lock_break=true.")


@pytest.mark.parametrize("lock_dir, words", [
    ("relative/dir", "not an absolute path"),
    ("/", "is /"),
    ("/var/lib/trainyard/locks", "cluster_state_dir /var/lib/trainyard"),
    ("/var/lib/trainyard", "cluster_state_dir"),
    ("/srv", "cluster_output_root /srv/out"),  # a directory around a mounted one
])
def test_check_lock_dir_refuses_dirs_the_container_sees(lock_dir, words):
    mounted = {"cluster_state_dir": "/var/lib/trainyard", "cluster_output_root": "/srv/out"}
    msg = lk.check_lock_dir(lock_dir, mounted)
    assert msg and msg.startswith("Stop if cluster_lock_dir") and words in msg and "Fix:" in msg, msg


def test_check_lock_dir_accepts_a_dir_of_its_own():
    assert lk.check_lock_dir("/var/lib/trainyard-lock", {"cluster_state_dir": "/var/lib/trainyard"}) is None


def test_heartbeat_interval_bounds():
    assert lk.heartbeat_interval(300) == 75 and lk.heartbeat_interval(20) == 5 and lk.heartbeat_interval(1) == 1


# ------------------------------------------------------------------ the lock file on a node

def test_acquire_is_exclusive_reentrant_and_complete(tmp_path):
    d = str(tmp_path / "locks")
    a = lk.acquire(d, record("A"), now=1000.0)
    assert a["acquired"] and a["created"]
    assert oct(os.stat(d).st_mode & 0o777) == "0o700"
    on_disk = json.loads((tmp_path / "locks" / lk.LOCK_NAME).read_text())
    assert on_disk["token"] == "A" and on_disk["acquired_at"] == 1000.0
    again = lk.acquire(d, record("A"))
    assert again["acquired"] and not again["created"]
    b = lk.acquire(d, record("B"))
    assert not b["acquired"] and b["holder"]["token"] == "A" and b["age_s"] > 0
    assert sorted(os.listdir(d)) == [lk.LOCK_NAME]  # no temporary file left behind


def test_release_and_heartbeat_touch_only_the_own_lock(tmp_path):
    d = str(tmp_path)
    lk.acquire(d, record("A"))
    path = os.path.join(d, lk.LOCK_NAME)
    os.utime(path, (1, 1))
    assert lk.heartbeat(d, "B") is False and os.stat(path).st_mtime == 1
    assert lk.release(d, "B") is False and os.path.exists(path)
    assert lk.heartbeat(d, "A") is True and os.stat(path).st_mtime > 1
    assert lk.read(d)[2] < 5
    assert lk.release(d, "A") is True and not os.path.exists(path)
    assert lk.release(d, "A") is False and lk.heartbeat(d, "A") is False


def test_break_removes_only_the_judged_lock(tmp_path):
    d = str(tmp_path)
    lk.acquire(d, record("OLD"))
    wrong = lk.acquire(d, record("NEW"), break_token="SOMEONE")
    assert not wrong["acquired"] and wrong["broken"] is None and wrong["holder"]["token"] == "OLD"
    got = lk.acquire(d, record("NEW"), break_token="OLD")
    assert got["acquired"] and got["created"] and got["broken"]["token"] == "OLD"
    assert lk.read(d)[0]["token"] == "NEW"


def test_check_mode_reports_and_writes_nothing(tmp_path):
    d = str(tmp_path / "none")
    r = lk.acquire(d, record("A"), check_mode=True)
    assert r["acquired"] and not os.path.exists(d)
    lk.acquire(d, record("A"))
    r = lk.acquire(d, record("B"), break_token="A", check_mode=True)
    assert not r["acquired"] and r["holder"]["token"] == "A" and lk.read(d)[0]["token"] == "A"


def test_links_and_loose_modes_are_refused_or_fixed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(lk.LockError, match="not a directory"):
        lk.acquire(str(tmp_path / "link"), record("A"))
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    lk.acquire(str(loose), record("A"))
    assert os.stat(loose).st_mode & 0o777 == 0o700
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    (planted / lk.LOCK_NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(lk.LockError, match="symbolic link"):
        lk.read(str(planted))


def test_unreadable_lock_file_reads_as_empty_record(tmp_path):
    (tmp_path / lk.LOCK_NAME).write_text("not json")
    rec, age, hb = lk.read(str(tmp_path))
    assert rec == {} and age >= 0 and hb >= 0
    assert lk.read(str(tmp_path / "free")) == (None, None, None)


# ------------------------------------------------------------------ the module, run by ansible

def test_module_takes_reports_and_releases(tmp_path):
    d = str(tmp_path / "lockdir")
    r = adhoc("cluster_lock", {"path": d, "record": record("A")})
    assert r["acquired"] and r["created"] and r["changed"], r
    r = adhoc("cluster_lock", {"path": d, "record": record("B")})
    assert not r["acquired"] and r["holder"]["token"] == "A" and not r["changed"], r
    r = adhoc("cluster_lock", {"path": d, "state": "query"})
    assert r["holder"]["pid"] == 4242 and r["heartbeat_age_s"] >= 0, r
    r = adhoc("cluster_lock", {"path": d, "state": "absent", "token": "A"}, "--check")
    assert r["released"] and os.path.exists(os.path.join(d, lk.LOCK_NAME)), r
    r = adhoc("cluster_lock", {"path": d, "state": "absent", "token": "A"})
    assert r["released"] and not os.path.exists(os.path.join(d, lk.LOCK_NAME)), r
    r = adhoc("cluster_lock", {"path": d, "state": "heartbeat"})
    assert r.get("failed") and "needs token" in r["msg"], r
