"""The cross-node fail-fast watcher (module_utils/failfast.py) and its hook in launcher.py: pure helpers, then the
watcher against a real TCPStore (the one the head's torchrun agent hosts, played here by the test), then the
launcher itself stopping its 'torchrun' when another node's failure appears in the store."""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from helpers import REPO

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # torch's C++ retry warnings, as the launcher silences them
MU = REPO / "collections/ansible_collections/trainyard/core/plugins/module_utils"
sys.path.insert(0, str(MU))
import failfast as ff  # noqa: E402

torch_dist = pytest.importorskip("torch.distributed")

# real torchrun logs: a rank killed (-9) on a simulated node; two failed ranks, the root cause listed second
REPORT = (REPO / "tests/data/torchrun/sim_node_killed.log").read_text()
TWO = (REPO / "tests/data/torchrun/failed_record_two_ranks.log").read_text()


def test_spec_for_one_node_is_none_and_for_several_names_the_heads_store():
    assert ff.spec_for(1, 0, "10.0.0.1", 29500, "train") is None
    assert ff.spec_for(4, 1, "10.0.0.1", 29500, "train", min_nnodes=2) is None  # elastic: survives a lost node
    s = ff.spec_for(2, 1, "10.0.0.1", 29500, "train", "r1", grace_s=3)
    assert s == {"host": "10.0.0.1", "port": 29500, "node_rank": 1, "prefix": "trainyard-failfast/train/r1/",
                 "poll_s": 1.0, "lost_s": 5.0, "grace_s": 3.0}


def test_root_cause_of_takes_the_root_cause_block_not_the_other_failures():
    assert ff.root_cause_of(REPORT) == {"rank": 1, "local_rank": 0, "exitcode": -9, "signal": "SIGKILL",
                                         "host": "ln-node2"}
    assert ff.root_cause_of(TWO) == {"rank": 1, "local_rank": 1, "exitcode": 1, "host": "localhost"}
    assert ff.root_cause_of("no report here\n") == {}


def test_stop_words_name_the_failed_node_rank_and_signal():
    peer = {"why": "peer_failed", "failure": {"node_rank": 1, "rank": 3, "local_rank": 1, "exitcode": -9,
                                              "signal": "SIGKILL"}}
    assert ff.stop_words(peer) == "stopped because node rank 1 failed: rank 3 (local rank 1), exit code -9 (SIGKILL)"
    lost = ff.stop_words({"why": "store_lost", "store": "10.0.0.1:29500", "lost_s": 5.2})
    assert "head's rendezvous store (10.0.0.1:29500) was unreachable for 5 s" in lost


def master_store():
    return torch_dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10), wait_for_workers=False)


def cfg(port, rank, **kw):
    c = ff.spec_for(3, rank, "127.0.0.1", port, "job%d" % os.getpid(), "t", poll_s=0.2, lost_s=1.0, grace_s=2.0)
    c.update(kw)
    return c


WORKER = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(120)'])"


def sleeper(workers=True):
    """A stand-in torchrun: with workers, a child process runs under it (a rank); without, it only waits (torchrun in
    its exit barrier once every worker exited). Its own session, so that the test ends its worker too."""
    code = WORKER if workers else "import time; time.sleep(120)"
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    if workers:
        assert wait_for_child(p.pid), "the stand-in torchrun never started its worker"
    return p


def end(p):
    """SIGKILL to the stand-in's session (torchrun and its worker); nothing when it is gone already."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for_child(pid, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ff._workers_left(pid):
            return True
        time.sleep(0.05)
    return False


def wait_exit(proc, timeout):
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def two_watchers(port, rank_a, rank_b):
    """Two 'torchrun' sleepers, each with a started watcher that has reached the store."""
    a, b = sleeper(), sleeper()
    wa = ff.Watcher(cfg(port, rank_a), a.pid, lambda _l: None).start()
    wb = ff.Watcher(cfg(port, rank_b), b.pid, lambda _l: None).start()
    deadline = time.monotonic() + 60
    while not (wa.reached and wb.reached) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert wa.reached and wb.reached, "a watcher never reached the store"
    return (a, wa), (b, wb)


def test_a_nodes_failure_stops_the_other_nodes_torchrun_and_says_why():
    master = master_store()
    (a, wa), (b, wb) = two_watchers(master.port, 1, 2)
    try:
        end(a)
        a.wait()
        rec = wa.publish(-9, REPORT, operator_stop=False)
        assert rec["published"] is True and rec["peer_stop"] is None
        t0 = time.monotonic()
        assert wait_exit(b, 10) is not None, "node 2's torchrun was not stopped"
        assert time.monotonic() - t0 < 5
        wb.thread.join(5)
        assert wb.peer_stop["why"] == "peer_failed"
        assert wb.peer_stop["failure"]["node_rank"] == 1 and wb.peer_stop["failure"]["rank"] == 1
        assert wb.peer_stop["reason"] == ("stopped because node rank 1 failed: rank 1 (local rank 0), exit code -9 "
                                          "(SIGKILL)")
        # b's own exit after the stop publishes nothing: the first failure stays the one named
        rec_b = wb.publish(-15, "", operator_stop=False)
        assert "published" not in rec_b and rec_b["peer_stop"]["why"] == "peer_failed"
        assert json.loads(master.get(wa.key))["node_rank"] == 1
    finally:
        for p in (a, b):
            end(p)
            p.wait()


def test_an_operator_stop_or_a_clean_exit_publishes_nothing():
    master = master_store()
    w = ff.Watcher(cfg(master.port, 1), os.getpid(), lambda _l: None)
    assert w.publish(0, REPORT, operator_stop=False) == {"peer_stop": None}
    assert w.publish(-15, REPORT, operator_stop=True) == {"peer_stop": None}
    assert not master.check([w.key])


def test_losing_the_heads_store_after_every_worker_exited_stops_nothing():
    """The job's normal end: the head's torchrun ends (its store with it) while a node's torchrun waits in its exit
    barrier with no worker left; that node is not stopped as if it had failed."""
    master = master_store()
    done = sleeper(workers=False)
    w = ff.Watcher(cfg(master.port, 1), done.pid, lambda _l: None).start()
    try:
        deadline = time.monotonic() + 60
        while not w.reached and time.monotonic() < deadline:
            time.sleep(0.1)
        assert w.reached and ff._workers_left(done.pid) is False
        del master
        time.sleep(4)  # lost_s is 1 s: a watcher that took this for a failure has stopped it by now
        assert done.poll() is None and w.peer_stop is None
        w.publish(0, "", operator_stop=False)
    finally:
        end(done)
        done.wait()


def test_losing_the_heads_store_stops_a_non_head_node_but_not_the_head():
    master = master_store()
    (b, wb), (h, wh) = two_watchers(master.port, 1, 0)
    try:
        del master  # the head's torchrun ended: its store went with it
        assert wait_exit(b, 15) is not None
        assert wb.peer_stop["why"] == "store_lost"
        assert h.poll() is None and wh.peer_stop is None
        wh.publish(0, "", operator_stop=False)
    finally:
        for p in (b, h):
            end(p)
            p.wait()


def test_the_launcher_stops_its_torchrun_and_records_why(tmp_path):
    """launcher.py (as torchrun_launch writes it, failfast.py beside it) with a 'torchrun' that sleeps: another
    node's failure in the store ends it within seconds, and launch.exit.json says why."""
    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copy(MU / "launcher.py", ro / "launcher.py")
    shutil.copy(MU / "failfast.py", ro / ff.FILE)
    master = master_store()
    spec = {"name": "torchrun", "argv": [sys.executable, "-c", "import time; time.sleep(120)"], "env": {},
            "env_files": [], "log": str(tmp_path / "torchrun.log"), "chdir": "", "token": "tok%d" % os.getpid(),
            "pid_file": str(tmp_path / "pid.json"), "exit_file": str(tmp_path / "exit.json"), "resume_from": "",
            "failfast": cfg(master.port, 2)}
    (ro / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.Popen([sys.executable, str(ro / "launcher.py"), str(ro / "spec.json")],
                            env=dict(os.environ, TRAINYARD_LAUNCH_ID=spec["token"]))
    try:
        deadline = time.monotonic() + 60
        while "joined the head's store" not in (tmp_path / "torchrun.log").read_text() if \
                (tmp_path / "torchrun.log").exists() else True:
            assert time.monotonic() < deadline, "the watcher never joined the store"
            time.sleep(0.2)
        failure = {"node_rank": 1, "rank": 3, "local_rank": 1, "exitcode": -9, "signal": "SIGKILL"}
        master.set(spec["failfast"]["prefix"] + ff.KEY, json.dumps(failure))
        t0 = time.monotonic()
        assert wait_exit(proc, 15) == 0
        assert time.monotonic() - t0 < 8
        rec = json.loads((tmp_path / "exit.json").read_text())
        assert rec["peer_stop"]["reason"] == ("stopped because node rank 1 failed: rank 3 (local rank 1), exit code "
                                              "-9 (SIGKILL)")
        assert rec["stopped"] is False and rec["returncode"] != 0
        log = (tmp_path / "torchrun.log").read_text()
        assert "stopped because node rank 1 failed" in log
        assert "TCPStore.cpp" not in log  # torch's C++ retries stay out of the job's log
    finally:
        proc.kill()
        proc.wait()


def test_publishing_after_the_heads_store_went_returns_at_once():
    """The head's own failure (its torchrun served the store and took it along): the launcher must not sit in
    connection retries before it writes its exit record (status.yml would show the node running meanwhile)."""
    master = master_store()
    (a, wa), (b, wb) = two_watchers(master.port, 0, 1)
    try:
        del master
        end(a)
        a.wait()
        time.sleep(1)  # the watcher has seen the store go
        t0 = time.monotonic()
        rec = wa.publish(-9, REPORT, operator_stop=False)
        assert time.monotonic() - t0 < 3.5
        assert rec["published"] is False
        wb.publish(0, "", operator_stop=False)
    finally:
        for p in (a, b):
            end(p)
            p.wait()
