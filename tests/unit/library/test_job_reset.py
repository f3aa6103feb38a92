"""job_reset: pure helpers, and the real module (through ansible, local connection) on processes and files
this test starts itself: a crashed job (leader killed -9, an orphaned worker in its own session that holds
shm files and listens on the rendezvous port) next to decoys that must survive."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from helpers import BIN, REPO, load

jr = None


def _load():
    global jr
    if jr is None:
        jr = load("library/job_reset.py", "job_reset_mod")
    return jr


def test_started_from_log_takes_the_last_start_line():
    m = _load()
    text = ("trainyard-launch: 2026-11-22T10:00:00 start job: torchrun a\nnoise\n"
            "trainyard-launch: 2026-11-22T11:30:05 start job: torchrun b\n")
    assert m.started_from_log(text) == time.mktime(time.strptime("2026-11-22T11:30:05", "%Y-%m-%dT%H:%M:%S"))
    assert m.started_from_log("nothing here") is None
    assert m.started_from_log("") is None


def test_attribute_rules():
    m = _load()
    job = {"uid": 0, "started_at": 1000.0, "held": {"/s/nccl-held"}}
    e = lambda name, uid=0, t=2000.0: {"path": "/s/" + name, "name": name, "uid": uid, "ctime": t, "mtime": t}
    assert m.attribute(e("nccl-held", t=10.0), job, {}, set())[0] is True          # held by the job, even if old
    assert m.attribute(e("nccl-held"), job, {"/s/nccl-held": {77}}, set())[0] is False  # shared with others
    assert m.attribute(e("torch_1_2_3"), job, {}, set())[0] is True
    assert m.attribute(e("torch_other"), job, {"/s/torch_other": {55}}, set()) == (
        False, "held open by PID 55 (not this job)")
    assert m.attribute(e("torch_55_1_0"), job, {}, {55})[0] is False               # its creator still lives
    assert m.attribute(e("torch_1_2_3", uid=65534), job, {}, set())[0] is False
    assert m.attribute(e("torch_1_2_3", t=999.0), job, {}, set())[0] is False
    assert m.attribute(e("torch_1_2_3"), dict(job, started_at=None), {}, set())[0] is False


# ----------------------------------------------------------------------------------- the real module

WORKER = textwrap.dedent("""
    import os, socket, sys, time
    shm, port = sys.argv[1], int(sys.argv[2])
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen()
    held = open(os.path.join(shm, "nccl-AbC123"), "w")
    open(os.path.join(shm, "torch_%d_1234_0" % os.getpid()), "w").write("x" * 100)
    os.makedirs(os.path.join(shm, ".torch_distributed_xyz"))
    open(os.path.join(shm, ".torch_distributed_xyz", "store"), "w").write("s")
    open(os.path.join(shm, "ready"), "w").close()
    time.sleep(600)
""")
LEADER = textwrap.dedent("""
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]], start_new_session=True)
    time.sleep(600)
""")


def ticks(pid):
    t = Path(f"/proc/{pid}/stat").read_text()
    return int(t[t.rfind(")") + 2:].split()[19])


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def alive(pid):
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st[st.rfind(")") + 2] != "Z"


def run_module(args: dict, check=False, env_extra: dict | None = None):
    argv = [str(BIN / "ansible"), "localhost", "-c", "local", "-i", "localhost,", "-m", "job_reset",
            "-a", json.dumps(args), "-o"] + (["--check"] if check else [])
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, **(env_extra or {}))
    r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    out = r.stdout
    assert " | " in out, out + r.stderr
    status, body = out.split(" => ", 1) if " => " in out else (out, "{}")
    return status, json.loads(body)


@pytest.fixture
def crashed_job(tmp_path):
    """A crashed job: leader killed -9, its worker orphaned in a session of its own; and decoys."""
    # A short path for the shared-memory stand-in: unix sockets bound below it (a multiprocessing manager's
    # pymp-*/listener-*) must fit the 107 bytes of sun_path, which a pytest-xdist worker's tmp_path can exceed.
    shm, state_root = Path(tempfile.mkdtemp(prefix="ty-", dir="/tmp")), tmp_path / "state"
    (state_root / "train").mkdir(parents=True)
    # Decoys that exist before the job: an old leftover of someone else, and one of another user.
    (shm / "torch_old").write_text("old")
    (shm / "nccl-foreign").write_text("f")
    os.chown(shm / "nccl-foreign", 65534, 65534)
    time.sleep(1.1)
    started = time.time()
    port, other_port = free_port(), free_port()
    token = uuid.uuid4().hex
    env = dict(os.environ, TRAINYARD_LAUNCH_ID=token)
    procs = []
    leader = subprocess.Popen([sys.executable, "-c", LEADER, WORKER, str(shm), str(port)], env=env,
                              start_new_session=True)
    procs.append(leader)
    # A decoy "torchrun" (same name, not ours) holding a torch_* file open, started during the job.
    decoy = subprocess.Popen(["bash", "-c", f'exec 3<>"{shm}/torch_other"; exec -a torchrun sleep 600'],
                             start_new_session=True)
    procs.append(decoy)
    # A decoy listener on another port.
    decoy_listener = subprocess.Popen([sys.executable, "-c", "import socket,time; s=socket.socket(); "
                                       f"s.bind(('127.0.0.1',{other_port})); s.listen(); time.sleep(600)"])
    procs.append(decoy_listener)
    for _ in range(200):
        if (shm / "ready").exists() and (shm / "torch_other").exists():
            break
        time.sleep(0.05)
    state = {"version": 1, "job": "train", "runtime": "host", "container": "", "pid": leader.pid, "pgid": leader.pid,
             "start_ticks": ticks(leader.pid), "started_at": started, "command": ["torchrun", "x.py"],
             "env_files": [], "log": str(state_root / "train" / "torchrun.log"), "node_rank": 0,
             "master_port": port, "resume_from": "", "sidecars": [], "token": token}
    (state_root / "train" / "launch.json").write_text(json.dumps(state))
    worker_pid = int(next(p.name.split("_")[1] for p in shm.iterdir() if p.name.startswith("torch_")
                          and p.name.split("_")[1].isdigit()))
    os.kill(leader.pid, signal.SIGKILL)  # the crash: the agent dies, its worker lives on
    leader.wait()
    yield {"shm": shm, "state_root": state_root, "port": port, "other_port": other_port, "worker": worker_pid,
           "decoy": decoy, "decoy_listener": decoy_listener, "state": state}
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(shm, ignore_errors=True)
    if alive(worker_pid) and ticks(worker_pid):
        try:
            os.kill(worker_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def args_for(j, **kw):
    a = {"job": "train", "state_root": str(j["state_root"]), "port": j["port"],
         "patterns": {str(j["shm"]): ["torch_*", "nccl-*", ".torch_distributed_*"]}, "stop_timeout": 3,
         "started_slack": 0.5}
    a.update(kw)
    return a


def test_reset_cleans_the_crashed_job_and_spares_decoys(crashed_job):
    j = crashed_job
    shm = j["shm"]
    ours = {str(shm / n) for n in ("nccl-AbC123", f"torch_{j['worker']}_1234_0", ".torch_distributed_xyz")}
    # Check mode: reports, changes nothing.
    status, res = run_module(args_for(j), check=True)
    assert status.endswith("CHANGED"), res
    assert alive(j["worker"])
    assert set(res["cleaned"]["files"]) == ours
    assert all((Path(p)).exists() for p in ours)
    assert [p["pid"] for p in res["found"]["processes"]] == [j["worker"]]
    # Real run.
    status, res = run_module(args_for(j))
    assert status.endswith("CHANGED"), res
    assert not alive(j["worker"])
    assert set(res["cleaned"]["files"]) == ours and not any(Path(p).exists() for p in ours)
    assert res["cleaned"]["bytes"] >= 101
    kept = {k["path"]: k["why"] for k in res["kept"]}
    assert set(kept) == {str(shm / "torch_other"), str(shm / "torch_old"), str(shm / "nccl-foreign")}
    assert "held open by PID %d" % j["decoy"].pid in kept[str(shm / "torch_other")]
    assert "older than the job" in kept[str(shm / "torch_old")]
    assert "uid 65534" in kept[str(shm / "nccl-foreign")]
    assert j["decoy"].poll() is None and j["decoy_listener"].poll() is None
    assert res["port"] == {"port": j["port"], "free": True, "holders": [], "report": ""}
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", j["port"]))  # the rendezvous port is free again
    s.close()
    # Idempotent.
    status, res = run_module(args_for(j))
    assert status.endswith("SUCCESS"), res
    assert res["changed"] is False and res["found"]["processes"] == [] and res["found"]["files"] == []


def test_reset_reports_a_foreign_port_holder_and_gpu_user_without_killing_them(crashed_job, tmp_path):
    j = crashed_job
    dev = tmp_path / "nvidia0"
    dev.write_text("")
    gpu = subprocess.Popen(["bash", "-c", f'exec 4<"{dev}"; exec sleep 600'])
    try:
        time.sleep(0.3)
        status, res = run_module(args_for(j, port=j["other_port"], gpu_devices=str(tmp_path / "nvidia")))
        assert not alive(j["worker"])  # the job's processes still go
        assert res["port"]["free"] is False
        assert [h["pid"] for h in res["port"]["holders"]] == [j["decoy_listener"].pid]
        assert f"held by PID {j['decoy_listener'].pid} (" in res["port"]["report"]
        assert f"held by PID {j['decoy_listener'].pid}" in res["summary"]
        assert j["decoy_listener"].poll() is None
        assert [g["pid"] for g in res["gpu_users"]] == [gpu.pid] and gpu.poll() is None
    finally:
        gpu.kill()
        gpu.wait()


def test_state_removed_by_launch_reset_still_cleans_from_the_passed_copy(crashed_job):
    j = crashed_job
    (j["state_root"] / "train" / "launch.json").unlink()
    # Without any state the worker cannot be told apart from anyone's process, nor its files by lifetime:
    # nothing is touched.
    status, res = run_module(args_for(j))
    assert res["changed"] is False and alive(j["worker"]) and res["found"]["files"] == []
    # With the copy read before the launch role removed the file, everything is cleaned.
    status, res = run_module(args_for(j, launch_state=j["state"]))
    assert not alive(j["worker"])
    assert res["changed"] is True and len(res["cleaned"]["files"]) == 3


def test_remove_state_stops_the_job_and_removes_its_launch_records_in_one_call(crashed_job, tmp_path):
    """The launch role's reset is one job_reset call: the job's processes, its launch state, its secret files and
    secrets env file go; a link planted in the secrets directory is removed as a link, its target stays."""
    j = crashed_job
    job_dir = j["state_root"] / "train"
    (job_dir / "launch.pid.json").write_text("{}")
    (job_dir / "launch.spec.json").write_text("{}")
    (job_dir / "torchrun.log").write_text("kept")
    secrets, env_file, target = tmp_path / "secrets", tmp_path / "secret.env", tmp_path / "target"
    secrets.mkdir()
    (secrets / "HF_TOKEN").write_text("s")
    target.write_text("not the job's")
    (secrets / "LINK").symlink_to(target)
    env_file.write_text("HF_TOKEN=s\n")
    records = {str(job_dir / n) for n in ("launch.json", "launch.pid.json", "launch.spec.json")} | {
        str(secrets / "HF_TOKEN"), str(secrets / "LINK"), str(env_file)}
    extra = {"remove_state": True, "secrets_dir": str(secrets), "secret_env_file": str(env_file)}
    status, res = run_module(args_for(j, **extra), check=True)
    assert status.endswith("CHANGED") and set(res["records"]) == records, res
    assert alive(j["worker"]) and all(os.path.lexists(r) for r in records)
    status, res = run_module(args_for(j, **extra))
    assert status.endswith("CHANGED") and set(res["records"]) == records, res
    assert not alive(j["worker"]) and not any(os.path.lexists(r) for r in records)
    assert len(res["cleaned"]["files"]) == 3 and "launch records removed: 6" in res["summary"]
    assert target.read_text() == "not the job's" and secrets.is_dir() and (job_dir / "torchrun.log").exists()
    status, res = run_module(args_for(j, **extra))
    assert status.endswith("SUCCESS") and res["changed"] is False and res["records"] == []


def test_the_containers_state_and_the_probed_paths_come_back_from_the_same_call(tmp_path):
    """The container and janitor roles' resets need no read of their own: job_reset returns the container's state
    (docker inspect, read-only) and whether each probed path (the janitor's timer) exists. An engine that does not
    answer is an error naming the container, never a guess of exists false (the container role then reads the state
    itself). The engine here is one that cannot answer whatever runs on this machine: DOCKER_HOST names a socket
    nobody listens on. A missing container on a live engine is the integration suite's reset test."""
    (tmp_path / "state").mkdir()
    name = "trainyard-no-such-" + uuid.uuid4().hex[:8]
    status, res = run_module({"job": "train", "state_root": str(tmp_path / "state"), "port": free_port(),
                              "patterns": {str(tmp_path): ["torch_*"]}, "container": name,
                              "probe_paths": [str(tmp_path / "state"), str(tmp_path / "no-timer")],
                              "container_restart": "auto"},
                             env_extra={"DOCKER_HOST": "unix://%s" % (tmp_path / "no-engine.sock")})
    assert status.endswith("SUCCESS") and res["changed"] is False, res
    assert set(res["container"]) == {"name", "error", "action"} and res["container"]["name"] == name, res
    assert res["container"]["action"] == "read", res  # the container role reads it again
    assert res["container"]["error"].startswith("docker inspect %s: rc " % name), res
    assert res["probed"] == {str(tmp_path / "state"): True, str(tmp_path / "no-timer"): False}, res


def test_clean_node_changes_nothing(tmp_path):
    (tmp_path / "state").mkdir()
    status, res = run_module({"job": "train", "state_root": str(tmp_path / "state"), "port": free_port(),
                              "patterns": {str(tmp_path): ["torch_*"]}})
    assert status.endswith("SUCCESS") and res["changed"] is False
    assert res["found"]["state"]["present"] is False and res["port"]["free"] is True


def test_container_verdict_is_judged_on_the_state_read_in_the_same_call():
    m = _load()
    running, stopped = {"exists": True, "running": True}, {"exists": True, "running": False}
    assert m.container_action("auto", running, files_removed=False) == "none"     # the stop took its processes
    assert m.container_action("auto", running, files_removed=True) == "restart"   # the job left files in it
    assert m.container_action("auto", stopped, files_removed=False) == "restart"
    assert m.container_action("always", running, files_removed=False) == "restart"
    assert m.container_action("auto", {"exists": False, "running": False}, False) == "create"
    assert m.container_action("auto", {"name": "c", "error": "docker inspect c: rc 1"}, False) == "read"
    assert m.container_action("never", stopped, True) == "none"
    assert m.container_action("auto", None, True) == "none"                      # no container asked for
    assert m.last_change("none", {"/t": False}, keep_lock=False, remaining=[]) is True
    assert m.last_change("restart", {}, False, []) is False
    assert m.last_change("none", {"/t": True}, False, []) is False                # the janitor's timer is stopped next
    assert m.last_change("none", {}, True, []) is False                            # a GPU reset follows
    assert m.last_change("none", {}, False, [42]) is False                         # a survivor: the lock stays


def _lock(lock_dir, token):
    from ansible_collections.trainyard.core.plugins.module_utils import cluster_lock as lk
    out = lk.acquire(str(lock_dir), {"token": token, "pid": 1})
    assert out["created"], out
    return lk


def test_the_lock_is_given_back_in_the_call_of_the_nodes_last_change_only(tmp_path):
    """release_lock saves the release's own round trip where job_reset is the node's last change of the run; where a
    later step changes the node (a probed timer exists, the container is restarted, keep_lock) the lock stays; a lock
    of another run is never touched; check mode gives nothing back."""
    (tmp_path / "state").mkdir()
    lock_dir = tmp_path / "lock"
    lk = _lock(lock_dir, "run-a")
    base = {"job": "train", "state_root": str(tmp_path / "state"), "port": free_port(),
            "patterns": {str(tmp_path): ["torch_*"]}, "release_lock": {"path": str(lock_dir), "token": "run-a"}}
    timer = tmp_path / "timer"
    timer.write_text("")
    for extra, check in (({"probe_paths": [str(timer)]}, False), ({"keep_lock": True}, False), ({}, True)):
        status, res = run_module(dict(base, **extra), check=check)
        assert status.endswith("SUCCESS") and res["lock_released"] is False and res["changed"] is False, res
        assert lk.read(str(lock_dir))[0]["token"] == "run-a", extra
    status, res = run_module(dict(base, release_lock={"path": str(lock_dir), "token": "run-b"}))
    assert status.endswith("SUCCESS") and res["lock_released"] is False, res
    assert lk.read(str(lock_dir))[0]["token"] == "run-a"
    status, res = run_module(dict(base, probe_paths=[str(tmp_path / "no-timer")]))
    assert status.endswith("SUCCESS") and res["lock_released"] is True and res["changed"] is False, res
    assert lk.read(str(lock_dir)) == (None, None, None)
    status, res = run_module(dict(base, release_lock={"path": str(lock_dir)}))
    assert "FAILED" in status and "release_lock needs path and token" in res["msg"], res


MANAGER = textwrap.dedent("""
    import multiprocessing.managers, sys
    # The manager's server in this process (no child to outlive the test): a unix socket in <TMPDIR>/pymp-*/.
    server = multiprocessing.managers.SyncManager().get_server()
    open(sys.argv[1], "w").write(server.address)
    server.serve_forever()
""")
SOCKET_SERVER = textwrap.dedent("""
    import os, socket, sys, time
    os.makedirs(sys.argv[1])
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(sys.argv[1], "server.sock")); s.listen()
    open(sys.argv[2], "w").close()
    time.sleep(600)
""")


def test_reset_spares_what_live_processes_hold_by_socket_cwd_or_mmap(crashed_job, tmp_path):
    """Live processes outside the job, started during it by the same user: a multiprocessing manager (its
    pymp-* directory holds only a listening unix socket), a unix socket server, a process whose working
    directory is a leftover-looking directory, and one that maps a file. None holds an fd on the path."""
    j = crashed_job
    shm = j["shm"]
    env = dict(os.environ, TMPDIR=str(shm))
    procs = [subprocess.Popen([sys.executable, "-c", MANAGER, str(tmp_path / "addr")], env=env),
             subprocess.Popen([sys.executable, "-c", SOCKET_SERVER, str(shm / "torchelastic_srv"),
                               str(tmp_path / "srv-ready")])]
    (shm / "torchelastic_cwd").mkdir()
    procs.append(subprocess.Popen(["sleep", "600"], cwd=shm / "torchelastic_cwd"))
    (shm / "torch_mapped").write_bytes(b"\0" * 4096)
    procs.append(subprocess.Popen([sys.executable, "-c", "import mmap, sys, time; f = open(sys.argv[1], 'r+b'); "
                                   "m = mmap.mmap(f.fileno(), 4096); f.close(); open(sys.argv[2], 'w').close(); "
                                   "time.sleep(600)", str(shm / "torch_mapped"), str(tmp_path / "map-ready")]))
    try:
        for _ in range(400):
            if all((tmp_path / n).exists() for n in ("addr", "srv-ready", "map-ready")):
                break
            time.sleep(0.05)
        pymp = Path((tmp_path / "addr").read_text()).parent
        assert pymp.parent == shm and pymp.name.startswith("pymp-")
        spared = {pymp, shm / "torchelastic_srv", shm / "torchelastic_cwd", shm / "torch_mapped"}
        args = args_for(j, patterns={str(shm): ["torch_*", "nccl-*", ".torch_distributed_*", "pymp-*",
                                                "torchelastic_*"]})
        status, res = run_module(args)
        assert not alive(j["worker"])  # the job itself is cleaned
        kept = {k["path"]: k["why"] for k in res["kept"]}
        assert {str(p) for p in spared} <= set(kept), res
        assert all(p.exists() for p in spared)
        assert f"PID {procs[0].pid}" in kept[str(pymp)] or "unix socket" in kept[str(pymp)], kept[str(pymp)]
        assert f"PID {procs[1].pid}" in kept[str(shm / "torchelastic_srv")]
        assert f"PID {procs[2].pid}" in kept[str(shm / "torchelastic_cwd")]
        assert f"PID {procs[3].pid}" in kept[str(shm / "torch_mapped")]
        assert all(p.poll() is None for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize("text", ['{"pid": "1; rm -rf /", "start_ticks": "x", "pgid": "y", "sidecars": "z"}',
                                  '{"pid": 1, "start_ticks": 1, "pgid": 1, "sidecars": [{"pid": [], "start_ticks": {}}]}',
                                  '[1, 2', '"just a string"'])
def test_forged_or_torn_state_is_named_and_never_crashes(tmp_path, text):
    (tmp_path / "state" / "train").mkdir(parents=True)
    (tmp_path / "state" / "train" / "launch.json").write_text(text)
    status, res = run_module({"job": "train", "state_root": str(tmp_path / "state"), "port": free_port(),
                              "patterns": {str(tmp_path): ["torch_*"]}})
    assert status.endswith("SUCCESS"), res
    assert res["changed"] is False and res["found"]["processes"] == []
    (problem,) = res["found"]["state"]["problems"]
    assert "launch.json is unreadable" in problem and "not cleaned" in problem and "remove it" in problem
