"""module_utils/procgroup.py and the launcher: /proc parsing, job selection, safe signalling, on real
processes this test starts itself (never anything found by name)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import launcher as launcher_script
from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
from helpers import load, wait_until


def wait_for(pred, timeout=10.0):
    """helpers.wait_until at this file's pace (processes start and exit in milliseconds)."""
    return wait_until(pred, timeout, 0.05)


def reap(p):
    try:
        p.kill()
    except OSError:
        pass
    try:
        p.wait(timeout=5)
    except Exception:
        pass


# ------------------------------------------------------------------------------------------------ parsing

def test_parse_stat_with_parentheses_and_spaces_in_the_name():
    fields = " ".join(str(i) for i in range(7, 60))  # fields 7 onwards carry their number
    st = pg.parse_stat("123 (a) b (c)) S 1 77 88 %s" % fields)
    assert st.pid == 123 and st.comm == "a) b (c)" and st.state == "S"
    assert (st.ppid, st.pgrp, st.session) == (1, 77, 88)
    assert st.start_ticks == 22  # field 22


@pytest.mark.parametrize("text", ["", "garbage", "12 (x) S 1 2", "x (y) S 1 2 3 " + "0 " * 30])
def test_parse_stat_refuses_malformed(text):
    assert pg.parse_stat(text) is None


def test_read_stat_of_self():
    st = pg.read_stat(os.getpid())
    assert st.pid == os.getpid() and st.pgrp == os.getpgrp() and st.start_ticks > 0
    assert pg.read_stat(2 ** 22 + 12345) is None


def test_parse_environ():
    assert pg.parse_environ(b"A=1\0B=x=y\0junk\0\0") == {"A": "1", "B": "x=y"}


# ------------------------------------------------------------------------------------------------ selection

def S(pid, ppid, pgrp, sess, ticks, state="S"):
    return pg.ProcStat(pid, "p%d" % pid, state, ppid, pgrp, sess, ticks)


def test_select_job_leader_descendants_and_token():
    stats = [S(10, 1, 10, 10, 500), S(11, 10, 10, 10, 501), S(12, 11, 12, 12, 502),   # leader, agent, worker
             S(20, 1, 20, 20, 600),                                                 # orphaned worker with token
             S(30, 1, 30, 30, 700),                                                 # a stranger
             S(40, 1, 40, 40, 100),                                                 # older than the leader
             S(13, 11, 13, 13, 503, state="Z")]                                     # zombie child
    env = {20: {pg.TOKEN_ENV: "tok"}, 40: {pg.TOKEN_ENV: "tok"}, 30: {pg.TOKEN_ENV: "other"}}
    got = [s.pid for s in pg.select_job(stats, 10, 500, "tok", env.get)]
    assert got == [10, 11, 12, 20]


def test_select_job_reused_leader_pid_is_not_ours():
    stats = [S(10, 1, 10, 10, 999), S(11, 10, 10, 10, 1000)]
    assert pg.select_job(stats, 10, 500, None, lambda p: None) == []
    # ... but a token-carrying orphan of the real job is still found.
    stats.append(S(12, 1, 12, 12, 600))
    env = {12: {pg.TOKEN_ENV: "tok"}}
    assert [s.pid for s in pg.select_job(stats, 10, 500, "tok", env.get)] == [12]


def test_recorded_job_follows_group_descendants_token_and_sidecars():
    """The processes of the job launch.json records, as reset.yml and the port check both select them."""
    stats = [S(100, 1, 100, 100, 5000),     # torchrun's launcher (leader)
             S(101, 100, 100, 100, 5001),   # same group
             S(102, 100, 102, 102, 5002),   # worker in its own session
             S(103, 102, 103, 103, 5003),   # grandchild
             S(104, 1, 100, 100, 5004),     # reparented, still in the leader's group
             S(105, 1, 105, 105, 5005),     # orphan carrying the token
             S(200, 1, 200, 200, 100),      # unrelated, older
             S(300, 1, 300, 300, 6000)]     # janitor sidecar
    state = {"pid": 100, "pgid": 100, "start_ticks": 5000, "token": "tok",
             "sidecars": [{"pid": 300, "pgid": 300, "start_ticks": 6000}]}
    env = {105: {pg.TOKEN_ENV: "tok"}, 200: {pg.TOKEN_ENV: "tok"}}
    assert [s.pid for s in pg.recorded_job(state, stats, env.get)] == [100, 101, 102, 103, 104, 105, 300]
    assert pg.recorded_job(None, stats, env.get) == []
    reused = dict(state, start_ticks=4000, sidecars=[], token=None)  # the leader's PID now names another process
    assert [s.pid for s in pg.recorded_job(reused, stats, env.get)] == []


def test_recorded_alive_needs_the_same_leader_start_time():
    me = {"pid": os.getpid(), "start_ticks": pg.start_ticks(os.getpid())}
    assert pg.recorded_alive(me)
    assert not pg.recorded_alive(dict(me, start_ticks=me["start_ticks"] + 1))  # PID reused
    assert not pg.recorded_alive(None) and not pg.recorded_alive({"pid": "x"}) and not pg.recorded_alive({})


def test_descendants():
    stats = [S(1, 0, 1, 1, 1), S(2, 1, 2, 2, 2), S(3, 2, 3, 3, 3), S(4, 1, 4, 4, 4)]
    assert sorted(pg.descendants(2, stats)) == [3]
    assert sorted(pg.descendants(1, stats)) == [2, 3, 4]


# ------------------------------------------------------------------------------------------------ real processes

def test_signal_process_refuses_a_pid_with_another_start_time():
    p = subprocess.Popen(["sleep", "30"])
    try:
        ticks = pg.start_ticks(p.pid)
        assert not pg.signal_process(p.pid, ticks + 1, signal.SIGTERM)
        assert p.poll() is None
        assert pg.signal_process(p.pid, ticks, signal.SIGTERM)
        assert p.wait(timeout=5) == -signal.SIGTERM
        assert not pg.signal_process(p.pid, ticks, signal.SIGTERM)  # gone now
    finally:
        reap(p)


def test_signal_group_needs_the_verified_leader():
    p = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        ticks = pg.start_ticks(p.pid)
        assert not pg.signal_group(p.pid, ticks + 5, signal.SIGTERM)
        assert pg.signal_group(p.pid, ticks, signal.SIGTERM)
        assert p.wait(timeout=5) == -signal.SIGTERM
    finally:
        reap(p)


def test_terminate_finds_session_escapees_by_token_and_spares_a_decoy(tmp_path):
    token = uuid.uuid4().hex
    env = dict(os.environ, **{pg.TOKEN_ENV: token})
    # The leader starts a child in a session of its own (like torchrun's workers) and ignores SIGTERM.
    script = ("import os, signal, subprocess, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
              "time.sleep(300)\n")
    leader = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    decoy_bin = tmp_path / "torchrun"
    decoy_bin.symlink_to("/bin/sleep")
    decoy = subprocess.Popen([str(decoy_bin), "300"], start_new_session=True)
    try:
        ticks = pg.start_ticks(leader.pid)
        procs = wait_for(lambda: len(pg.job_processes(leader.pid, ticks, token)) == 2 and
                         pg.job_processes(leader.pid, ticks, token))
        assert procs and len(procs) == 2
        child = [s for s in procs if s.pid != leader.pid][0]
        assert child.session != leader.pid  # escaped the leader's session
        out = pg.terminate(lambda: pg.job_processes(leader.pid, ticks, token), grace=1.0)
        assert leader.pid in out["killed"]  # ignored SIGTERM
        assert child.pid in out["terminated"]
        assert out["remaining"] == []
        assert decoy.poll() is None and pg.is_alive(decoy.pid, None)
    finally:
        for p in (leader, decoy):
            reap(p)


def test_start_detached_runs_in_its_own_session(tmp_path):
    logf = tmp_path / "out.log"
    pid, ticks = pg.start_detached([sys.executable, "-c", "import os; print(os.getsid(0)); import time; "
                                    "time.sleep(30)"], log_path=str(logf))
    try:
        assert pg.is_alive(pid, ticks)
        st = pg.read_stat(pid)
        assert st.session == pid and st.pgrp == pid
        assert wait_for(lambda: logf.read_text().strip()) == str(pid)
    finally:
        pg.signal_process(pid, ticks, signal.SIGKILL)
        wait_for(lambda: not pg.is_alive(pid, ticks))


# ------------------------------------------------------------------------------------------------ the launcher

def run_launcher(tmp_path, argv, env=None, env_files=(), token=None, chdir=""):
    launcher = tmp_path / tr.LAUNCHER_FILE
    launcher.write_text(Path(launcher_script.__file__).read_text())
    token = token or uuid.uuid4().hex
    spec = {"name": "job", "argv": argv, "env": env or {}, "env_files": list(env_files), "log": str(tmp_path / "j.log"),
            "chdir": chdir, "token": token, "pid_file": str(tmp_path / "pid.json"),
            "exit_file": str(tmp_path / "exit.json"), "resume_from": "", "leftover_grace": 1}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    # As the module starts it: the token in the launcher's own environment too (what check_pid_record looks for).
    pid, ticks = pg.start_detached([sys.executable, str(launcher), str(tmp_path / "spec.json")],
                                   env=dict(os.environ, **{tr.TOKEN_ENV: token}))
    return pid, ticks, token


def test_launcher_records_pid_env_and_exit_code(tmp_path):
    envf = tmp_path / "nccl.env"
    envf.write_text("FROM_FILE=1\nBOTH=file\n")
    pid, ticks, token = run_launcher(
        tmp_path, [sys.executable, "-c", "import os,sys; print(os.environ['FROM_FILE'], os.environ['BOTH'], "
                   "os.environ['TRAINYARD_LAUNCH_ID'], os.getcwd()); sys.exit(3)"],
        env={"BOTH": "extra"}, env_files=[str(envf)], chdir=str(tmp_path))
    ex = wait_for(lambda: (tmp_path / "exit.json").exists() and json.loads((tmp_path / "exit.json").read_text()))
    info = json.loads((tmp_path / "pid.json").read_text())
    assert info["pid"] == pid and info["pgid"] == pid and info["sid"] == pid and info["start_ticks"] == ticks
    assert ex["returncode"] == 3 and ex["token"] == token and not ex["exec_failed"]
    text = (tmp_path / "j.log").read_text()
    assert "1 extra %s %s" % (token, tmp_path) in text
    assert "exited with code 3" in text


def test_launcher_reports_a_missing_program(tmp_path):
    run_launcher(tmp_path, ["/nonexistent/torchrun", "x"])
    ex = wait_for(lambda: (tmp_path / "exit.json").exists() and json.loads((tmp_path / "exit.json").read_text()))
    assert ex["returncode"] == 127 and ex["exec_failed"]
    assert "cannot run /nonexistent/torchrun" in (tmp_path / "j.log").read_text()


def test_launcher_records_its_child_only_after_the_exec(tmp_path):
    # The child's exec is made slow (a PATH of 12,000 missing directories before sleep's own, under the kernel's
    # 128 KiB limit for one variable): the recorded child must already be the job's program with the token in its
    # own environment, never the launcher's copy between fork and exec.
    sleep_dir = os.path.dirname(shutil.which("sleep"))
    path = ":".join("/n/%d" % i for i in range(12000)) + ":" + sleep_dir
    pid, ticks, token = run_launcher(tmp_path, ["sleep", "300"], env={"PATH": path})
    info = wait_for(lambda: (tmp_path / "pid.json").exists() and json.loads((tmp_path / "pid.json").read_text()))
    try:
        exe = os.readlink("/proc/%d/exe" % info["child_pid"])
        environ = Path("/proc/%d/environ" % info["child_pid"]).read_bytes().split(b"\0")
        assert os.path.basename(exe) == "sleep", exe
        assert ("TRAINYARD_LAUNCH_ID=%s" % token).encode() in environ
        assert tr.check_pid_record(info, token, pg.read_stat, pg.read_environ)["child_pid"] == info["child_pid"]
    finally:
        pg.signal_process(pid, ticks, signal.SIGTERM)
        wait_for(lambda: (tmp_path / "exit.json").exists())


def test_launcher_ends_workers_its_agent_left_behind(tmp_path):
    # The "agent" starts a worker in its own session and exits at once: the launcher must end the orphan.
    script = ("import subprocess; subprocess.Popen(['sleep', '300'], start_new_session=True)")
    pid, ticks, token = run_launcher(tmp_path, [sys.executable, "-c", script])
    assert wait_for(lambda: (tmp_path / "exit.json").exists(), timeout=10)
    assert wait_for(lambda: not pg.job_processes(pid, ticks, token), timeout=10)


def test_launcher_forwards_sigterm(tmp_path):
    pid, ticks, token = run_launcher(tmp_path, ["sleep", "300"])
    info = wait_for(lambda: (tmp_path / "pid.json").exists() and json.loads((tmp_path / "pid.json").read_text()))
    assert pg.signal_process(pid, ticks, signal.SIGTERM)
    ex = wait_for(lambda: (tmp_path / "exit.json").exists() and json.loads((tmp_path / "exit.json").read_text()))
    assert ex["stopped"] and ex["returncode"] == -signal.SIGTERM
    assert not pg.is_alive(info["child_pid"], info["child_start_ticks"])


# ------------------------------------------------------------------------------ the container's cgroup (one rule)

CID = "a" * 63 + "1"
OTHER = "b" * 64


def fake_proc(root, procs):
    """A /proc look-alike: {pid: (ppid, session, ticks, env dict, cgroup text)}."""
    for pid, (ppid, sess, ticks, env, cg) in procs.items():
        d = root / str(pid)
        d.mkdir()
        rest = ["S", str(ppid), str(sess), str(sess)] + ["0"] * 15 + [str(ticks)] + ["0"] * 10
        (d / "stat").write_text("%d (p%d) %s\n" % (pid, pid, " ".join(rest)))
        (d / "environ").write_bytes(b"".join(("%s=%s" % kv).encode() + b"\0" for kv in env.items()))
        (d / "cgroup").write_text(cg)
    return str(root)


def cg2(path):
    return "0::%s\n" % path


@pytest.mark.parametrize("text, cid, inside", [
    (cg2("/docker/" + CID), CID, True),                                            # cgroupfs driver, v2
    (cg2("/system.slice/docker-%s.scope" % CID), CID, True),                        # systemd driver
    (cg2("/system.slice/docker-%s.scope/sub" % CID), CID, True),                    # a sub-cgroup the job made
    ("12:pids:/docker/%s\n11:memory:/docker/%s\n" % (CID, CID), CID, True),         # v1
    (cg2("/docker/" + OTHER), CID, False),                                          # another container
    (cg2("/user.slice/x-%s" % CID), CID, False),                                     # the id inside a name only
    (cg2("/docker/" + CID), CID[:12], False),                                       # short ids never match
    (cg2("/"), CID, False),
    ("", CID, False),
])
def test_in_container_cgroup(text, cid, inside):
    assert pg.in_container_cgroup(pg.parse_cgroup(text), cid) is inside


def test_find_job_takes_the_containers_cgroup_the_escaper_cannot_shed(tmp_path):
    tok = "tok"
    proc = fake_proc(tmp_path, {
        50: (1, 50, 100, {}, cg2("/docker/" + CID)),                      # the container's init (sleep infinity)
        60: (40, 60, 200, {pg.TOKEN_ENV: tok}, cg2("/docker/" + CID)),    # the launcher (docker exec)
        61: (60, 60, 201, {pg.TOKEN_ENV: tok}, cg2("/docker/" + CID)),    # torchrun
        70: (40, 70, 300, {}, cg2("/docker/" + CID)),                      # escaper: setsid, re-exec'd, no token
        80: (1, 80, 400, {}, cg2("/system.slice/sshd.service")),           # the node's own process
        90: (2, 90, 500, {}, cg2("/docker/" + OTHER)),                     # another container's process
        55: (50, 55, 150, {}, cg2("/docker/" + CID)),                      # the init's own child, before the launch
    })
    state = {"pid": 60, "start_ticks": 200, "token": tok, "pgid": 60, "container_id": CID,
             "container_init_pid": 50, "container_init_ticks": 100}
    assert [s.pid for s in pg.find_job([state], proc=proc)] == [60, 61, 70]
    assert [s.pid for s in pg.find_job([state], proc=proc, exclude={70})] == [60, 61]
    # Without the container record (runtime host, an older launch.json) only the launcher's tree and token count.
    bare = {k: v for k, v in state.items() if not k.startswith("container")}
    assert [s.pid for s in pg.find_job([bare], proc=proc)] == [60, 61]
    # A container restarted since (another init start time) is no longer the recorded job's.
    assert [s.pid for s in pg.find_job([dict(state, container_init_ticks=99)], proc=proc)] == [60, 61]
    # A record whose init is not inside the named container, or forged types, is not believed.
    assert [s.pid for s in pg.find_job([dict(state, container_init_pid=80, container_init_ticks=400)],
                                       proc=proc)] == [60, 61]
    assert [s.pid for s in pg.find_job([dict(state, container_id=CID[:12])], proc=proc)] == [60, 61]
    assert [s.pid for s in pg.find_job([dict(state, container_init_pid="50")], proc=proc)] == [60, 61]


def test_terminate_freezes_the_whole_set_before_any_sigkill(monkeypatch):
    """A process that forks while it is being killed: every process found is stopped (SIGSTOP) and the scan repeated
    until nothing new appears, and only then is anything killed."""
    calls, alive = [], {1: 10, 2: 20}

    def fake_signal(pid, ticks, sig, proc=pg.PROC):
        calls.append((pid, sig))
        if sig == signal.SIGSTOP and pid == 2:
            alive.setdefault(3, 30)  # it forked just before it stopped
        if sig == signal.SIGKILL:
            alive.pop(pid, None)
        return True

    monkeypatch.setattr(pg, "signal_process", fake_signal)
    find = lambda: [S(p, 0, p, p, t) for p, t in sorted(alive.items())]
    out = pg.terminate(find, grace=0, sleep=lambda s: None)
    kills = [i for i, c in enumerate(calls) if c[1] == signal.SIGKILL]
    stops = [i for i, c in enumerate(calls) if c[1] == signal.SIGSTOP]
    assert sorted(p for p, s in calls if s == signal.SIGSTOP) == [1, 2, 3]
    assert max(stops) < min(kills)
    assert out["killed"] == [1, 2, 3] and out["remaining"] == []


def test_job_ranks_are_the_agents_direct_children_only():
    env = {
        11: {"RANK": "0", "LOCAL_RANK": "0"}, 12: {"RANK": "1", "LOCAL_RANK": "1"},
        13: {"RANK": "2", "LOCAL_RANK": "2"},                  # beyond nproc_per_node
        14: {"RANK": "9", "LOCAL_RANK": "0"},                  # a second "local rank 0", started later
        20: {"RANK": "5", "LOCAL_RANK": "1"},                  # a worker's child carrying a RANK
        30: {"RANK": "7", "LOCAL_RANK": "0", pg.TOKEN_ENV: "t"},  # invented by the job, no child of the agent
        15: {},                                                # a child of the agent without a rank
    }
    stats = [S(5, 1, 5, 5, 100), S(10, 5, 5, 5, 110), S(11, 10, 11, 11, 120), S(12, 10, 12, 12, 121),
             S(13, 10, 13, 13, 122), S(14, 10, 14, 14, 130), S(15, 10, 15, 15, 123), S(20, 11, 20, 20, 140),
             S(30, 1, 30, 30, 150)]
    state = {"pid": 5, "start_ticks": 100, "torchrun_pid": 10, "torchrun_start_ticks": 110}
    got = pg.job_ranks(state, stats, lambda p: env.get(p), limit=2)
    assert [(r["rank"], r["pid"]) for r in got] == [(0, 11), (1, 12)]
    assert [r["pid"] for r in pg.job_ranks(state, stats, lambda p: env.get(p), limit=None)] == [11, 12, 13]
    # The agent must be the recorded one: another start time, or not the launcher's child, gives no ranks.
    assert pg.job_ranks(dict(state, torchrun_start_ticks=999), stats, env.get, 2) == []
    assert pg.job_ranks(dict(state, torchrun_pid=11), stats, env.get, 2) == []
    assert pg.job_ranks(dict(state, start_ticks=1), stats, env.get, 2) == []


ESCAPER_AGENT = """import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve(sys.executable, [sys.executable, "-c",
                  "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)", sys.argv[1]],
                  {})
    os._exit(0)
time.sleep(300)
"""


def test_stop_and_reset_find_a_double_forked_setsid_escaper_by_the_same_rule(tmp_path):
    """Runtime host: the job double-forks, calls setsid and re-execs without the token. The launcher is its child
    subreaper, so the escaper stays a descendant; the launch's stop and job_reset select it through the one rule
    (procgroup.find_job), and terminate ends it (it ignores SIGTERM)."""
    tl = load("library/torchrun_launch.py", "torchrun_launch_mod")
    jr = load("library/job_reset.py", "job_reset_mod")
    marker = "escaper-%s" % uuid.uuid4().hex
    pid, ticks, token = run_launcher(tmp_path, [sys.executable, "-c", ESCAPER_AGENT, marker])
    info = wait_for(lambda: (tmp_path / "pid.json").exists() and json.loads((tmp_path / "pid.json").read_text()))
    assert info["subreaper"] is True
    state = {"pid": pid, "start_ticks": ticks, "pgid": pid, "token": token, "sidecars": []}

    def escaper():
        for st in pg.all_stats():
            argv = pg.read_cmdline(st.pid)
            if argv[-1:] == [marker] and argv[2:3] and argv[2].startswith("import signal"):
                return st  # the re-exec'd escaper, not the agent (whose argv ends with the marker too)
        return None

    esc = wait_for(escaper)
    try:
        assert esc.session != pid and pg.TOKEN_ENV not in (pg.read_environ(esc.pid) or {})
        assert esc.ppid == pid  # re-parented to the launcher (its subreaper), not to init
        launch = object.__new__(tl.Launch)
        reset = object.__new__(jr.Reset)
        reset.me = jr.Reset.my_lineage()
        by_stop = [s.pid for s in launch.all_procs(state)]
        by_reset = [s.pid for s in reset.job_procs([state])]
        assert esc.pid in by_stop and by_stop == by_reset
        out = pg.terminate(lambda: launch.all_procs(state), grace=1.0)
        assert out["remaining"] == [] and escaper() is None
    finally:
        st = escaper()
        if st is not None:
            pg.signal_process(st.pid, st.start_ticks, signal.SIGKILL)
        pg.signal_process(pid, ticks, signal.SIGKILL)


def test_launcher_ends_an_escaper_without_the_token_when_the_job_ends(tmp_path):
    """The agent leaves a double-forked, setsid, re-exec'd escaper (no token, SIGTERM ignored) and exits 0: the
    launcher, its subreaper, ends it before it exits itself (SIGTERM, the grace, SIGSTOP, SIGKILL)."""
    marker = "escaper-%s" % uuid.uuid4().hex
    agent = ESCAPER_AGENT[:ESCAPER_AGENT.rindex("time.sleep(300)")] + "time.sleep(0.5)\n"  # the agent ends soon
    pid, ticks, token = run_launcher(tmp_path, [sys.executable, "-c", agent, marker])

    def escaper():
        for st in pg.all_stats():
            argv = pg.read_cmdline(st.pid)
            if argv[-1:] == [marker] and argv[2:3] and argv[2].startswith("import signal"):
                return st
        return None

    try:
        assert wait_for(escaper)
        ex = wait_for(lambda: (tmp_path / "exit.json").exists() and json.loads((tmp_path / "exit.json").read_text()))
        assert ex["returncode"] == 0
        assert wait_for(lambda: escaper() is None and not pg.is_alive(pid, ticks), timeout=15)
    finally:
        st = escaper()
        if st is not None:
            pg.signal_process(st.pid, st.start_ticks, signal.SIGKILL)
