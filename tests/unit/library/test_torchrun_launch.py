"""torchrun_launch run by real ansible-playbook -v (local connection) with a real torchrun (runtime host, one
node): secrets from a host-only file reach the job and nothing else; bad input is one line, before any start."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import BIN, REPO, load

BIN = BIN
SECRET = "hf_s3cr3t-Val9e-never-printed"
OTHER = "pw-0th3r-never-printed"
ENTRY = textwrap.dedent("""
    import os, sys
    open(sys.argv[1], "w").write(os.environ.get("HF_TOKEN", "") + "\\n" + os.environ.get("WANDB_API_KEY", ""))
    print("trainyard: first step done", flush=True)
""")

pytestmark = pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="needs the controller venv (make venv)")


def playbook(tmp_path: Path, *extra: str, verbose: bool = True, play_vars: dict | None = None,
             **module_args) -> tuple[subprocess.CompletedProcess, dict]:
    entry = tmp_path / "entry.py"
    entry.write_text(ENTRY)
    args = {"job": "secretjob", "state_root": str(tmp_path / "state"), "nnodes": 1, "nproc_per_node": 1,
            "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29000 + os.getpid() % 5000,
            "torchrun": [str(BIN / "torchrun")], "entrypoint": str(entry), "args": [str(tmp_path / "seen")],
            "env": {"OMP_NUM_THREADS": "1"}, "wait_for": "first_step", "wait_timeout": 120, "stop_timeout": 5}
    args.update(module_args)
    pb = tmp_path / "pb.yml"
    pb.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "vars": play_vars or {}, "tasks": [
        {"torchrun_launch": args, "register": "r"},
        {"ansible.builtin.copy": {"content": "{{ r | to_json }}", "dest": str(tmp_path / "result.json"),
                                  "mode": "0600"}, "check_mode": False}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    p = subprocess.run([str(BIN / "ansible-playbook"), *(["-v"] if verbose else []), "-i", "localhost,", "-c", "local",
                        "-e", f"ansible_python_interpreter={sys.executable}", str(pb), *extra],
                       cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    res = json.loads((tmp_path / "result.json").read_text()) if (tmp_path / "result.json").exists() else {}
    return p, res


def stop(tmp_path: Path) -> None:
    playbook(tmp_path, state="stopped")


def test_secret_env_file_reaches_the_job_and_no_result_log_or_state(tmp_path):
    secret = tmp_path / "secret.env"
    secret.write_text(f"HF_TOKEN={SECRET}\nWANDB_API_KEY={OTHER}\n")
    secret.chmod(0o600)
    # The container role's mkdir -p of the mount sources made the host-only directory first, 0755.
    (tmp_path / "state" / "secretjob" / "job-ro").mkdir(parents=True)
    (tmp_path / "state" / "secretjob").chmod(0o755)
    try:
        p, res = playbook(tmp_path, secret_env_file=str(secret),
                          env={"OMP_NUM_THREADS": "1", "HUB_TOKEN": "hub-t0ken-in-env-never-printed"})
        assert p.returncode == 0, p.stdout[-3000:]
        assert (tmp_path / "seen").read_text() == f"{SECRET}\n{OTHER}"  # the job got both
        assert res["secret_env"] == ["HF_TOKEN", "WANDB_API_KEY"]
        job = tmp_path / "state" / "secretjob"
        # every file of the job's tree: the host-only directory, job-ro/ and job-rw/ (the log lives in job-rw/)
        where = {f.name: f for f in job.rglob("*") if f.is_file()}
        files = {n: f.read_text(errors="replace") for n, f in where.items()}
        assert {"launch.json", "launch.spec.json", "torchrun.log"} <= set(files)
        for value in (SECRET, OTHER):  # the secret file's values: in no output and no file of the state directory
            assert value not in p.stdout + json.dumps(res) + "".join(files.values())
        # A token given through env (not the documented way) still stays out of every output and launch.json;
        # only the 0600 launch spec, which hands the environment to the launcher, holds it.
        hub = "hub-t0ken-in-env-never-printed"
        assert hub not in p.stdout + json.dumps(res) + "".join(t for n, t in files.items() if n != "launch.spec.json")
        assert res["env"]["HUB_TOKEN"] == "********" and res["env"]["OMP_NUM_THREADS"] == "1"
        # Modes: the state directory 0750 (whoever made it), its control files 0640, the launch spec 0600.
        assert stat.S_IMODE(job.stat().st_mode) == 0o750
        for name in ("launch.json", "launch.pid.json", "torchrun.log"):
            assert stat.S_IMODE(where[name].stat().st_mode) == 0o640, name
        assert stat.S_IMODE(where["launch.spec.json"].stat().st_mode) == 0o600
    finally:
        stop(tmp_path)


def test_the_start_writes_the_secrets_file_itself_and_no_value_reaches_any_output(tmp_path):
    """write_secret_env (the launch role's start): the action reads launch_secret_env itself and writes the file
    (0600) in its host-only directory (0700) before the start, so no value is in an argument or a result, even at
    -vvv; a converged start leaves the file alone."""
    env_file = tmp_path / "run" / "secretjob" / "secret.env"
    secrets = {"launch_secret_env": {"HF_TOKEN": SECRET, "WANDB_API_KEY": OTHER}}
    try:
        p, res = playbook(tmp_path, "-vvv", play_vars=secrets, secret_env_file=str(env_file), write_secret_env=True)
        assert p.returncode == 0, p.stdout[-3000:]
        assert (tmp_path / "seen").read_text() == f"{SECRET}\n{OTHER}" and res["secret_env_file_changed"] is True
        assert env_file.read_text() == f"HF_TOKEN={SECRET}\nWANDB_API_KEY={OTHER}\n"
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(env_file.parent.stat().st_mode) == 0o700
        for value in (SECRET, OTHER):
            assert value not in p.stdout + json.dumps(res), value
        p, res = playbook(tmp_path, play_vars=secrets, secret_env_file=str(env_file), write_secret_env=True)
        assert p.returncode == 0 and res["secret_env_file_changed"] is False and not res["changed"], res
    finally:
        stop(tmp_path)


def test_a_confirmed_start_gives_the_nodes_cluster_lock_back_in_the_same_call(tmp_path):
    """release_lock (site.yml: the start is the node's last change): given back only with the run's token, and the
    result tells the callback cluster_lock to stop the node's heartbeat."""
    from ansible_collections.trainyard.core.plugins.module_utils import cluster_lock as lk
    lock = tmp_path / "lock"
    assert lk.acquire(str(lock), {"token": "run-a", "pid": 1})["created"]
    try:
        p, res = playbook(tmp_path, confirm=True, release_lock={"path": str(lock), "token": "run-b"})
        assert p.returncode == 0 and res["lock_released"] is False and "cluster_lock_keeper" not in res, res
        assert lk.read(str(lock))[0]["token"] == "run-a"
        p, res = playbook(tmp_path, confirm=True, release_lock={"path": str(lock), "token": "run-a"})
        assert p.returncode == 0 and res["lock_released"] is True, res
        assert res["cluster_lock_keeper"] == {"path": str(lock), "token": "run-a", "hold": False}, res
        assert lk.read(str(lock)) == (None, None, None)
    finally:
        stop(tmp_path)


def test_secret_env_file_readable_by_others_is_refused_before_the_start(tmp_path):
    secret = tmp_path / "secret.env"
    secret.write_text(f"HF_TOKEN={SECRET}\n")
    secret.chmod(0o644)
    p, _ = playbook(tmp_path, secret_env_file=str(secret))
    assert p.returncode != 0 and f"secret_env_file {secret} is readable by group or others" in p.stdout
    assert "chmod 600" in p.stdout and SECRET not in p.stdout
    assert not (tmp_path / "state" / "secretjob" / "launch.json").exists()
    secret.chmod(0o600)
    secret.write_text(f"HF_TOKEN {SECRET}\n")
    p, _ = playbook(tmp_path, secret_env_file=str(secret))
    assert p.returncode != 0 and "line 1 is not KEY=value" in p.stdout and SECRET not in p.stdout


@pytest.mark.parametrize("args,words", [
    ({"first_step_marker": "step (done"}, "first_step_marker 'step (done' is not a valid regular expression"),
    ({"wait_for": "rendezvous", "rendezvous_marker": "[rdzv"}, "rendezvous_marker '[rdzv' is not a valid regular"),
    ({"sidecars": [{"name": "../janitor", "argv": ["sleep", "1"]}]}, "sidecar name '../janitor'"),
    ({"env": {"BAD-NAME": "x"}}, "env: 'BAD-NAME' not valid variable name"),
])
def test_bad_input_is_one_line_before_anything_starts(tmp_path, args, words):
    p, _ = playbook(tmp_path, **args)
    assert p.returncode != 0 and words in p.stdout, p.stdout[-3000:]
    assert "Traceback" not in p.stdout and "MODULE FAILURE" not in p.stdout
    assert not (tmp_path / "state" / "secretjob" / "launch.json").exists()  # nothing was started
    assert not (tmp_path / "seen").exists()


@pytest.mark.parametrize("text", ['{"job": "secretjob", "pid": 12', '{"job": "secretjob", "pid": 1, "pgid": 1, '
                                  '"start_ticks": 1, "command": [], "log": "x", "sidecars": [{"pid": "1; rm"}]}'])
def test_torn_or_forged_state_file_is_named_with_the_fix(tmp_path, text):
    job = tmp_path / "state" / "secretjob"
    job.mkdir(parents=True)
    (job / "launch.json").write_text(text)
    p, _ = playbook(tmp_path, state="status")
    assert p.returncode != 0 and f"{job / 'launch.json'} is unreadable" in p.stdout, p.stdout[-3000:]
    assert "reset.yml" in p.stdout and "Traceback" not in p.stdout and "MODULE FAILURE" not in p.stdout


@pytest.mark.parametrize("code", [0, 3])
def test_a_job_that_ends_while_awaited_is_finished_if_clean_and_named_if_not(tmp_path, code):
    """A job that ends before the awaited marker (a short job; one left running in its last seconds) went through
    its rendezvous when it exits 0: the launch is done. A non-zero exit is the failure, with its words."""
    quick = tmp_path / "quick.py"
    quick.write_text(f"import sys\nprint('no marker here', flush=True)\nsys.exit({code})\n")
    try:
        p, res = playbook(tmp_path, entrypoint=str(quick), args=[], wait_for="first_step")
        if code == 0:
            assert p.returncode == 0, p.stdout[-3000:]
            assert res["state"] == "finished", res
        else:
            assert p.returncode != 0 and "ended before first_step" in p.stdout, p.stdout[-3000:]
    finally:
        stop(tmp_path)


def test_confirm_says_where_the_job_runs_without_v_and_leaves_it_alone_the_second_time(tmp_path):
    hold = tmp_path / "hold.py"
    hold.write_text("import time\nprint('trainyard: first step done', flush=True)\ntime.sleep(120)\n")
    try:
        p, res = playbook(tmp_path, verbose=False, entrypoint=str(hold), args=[], confirm=True)
        assert p.returncode == 0, p.stdout[-3000:]
        line = f"node rank 0: running (started), pid {res['pid']}, resume from nothing, log {res['log']}"
        assert res["msg"] == line and line in p.stdout, p.stdout[-3000:]  # shown without -v
        p, res = playbook(tmp_path, verbose=False, entrypoint=str(hold), args=[], confirm=True)
        assert p.returncode == 0 and "node rank 0: running (already running, left alone), pid" in p.stdout, p.stdout
        p, res = playbook(tmp_path, verbose=False, entrypoint=str(hold), args=[])  # without confirm: no line
        assert p.returncode == 0 and "node rank 0:" not in p.stdout and "msg" not in res, p.stdout[-3000:]
    finally:
        stop(tmp_path)


def test_confirm_fails_on_a_dead_job_or_another_rank_and_the_action_names_the_node():
    """The rule on the module's results (a job that died before the module looked: wait_for none; a job recorded with
    another rank: a forged or foreign launch.json), and the action's line for each."""
    tl = load("library/torchrun_launch.py", "torchrun_launch_confirm")
    act = load("action_plugins/torchrun_launch.py", "torchrun_launch_action")

    class Failed(Exception):
        pass

    class Module:
        check_mode = False

        def fail_json(self, **kw):
            raise Failed(kw["msg"])

    launch = tl.Launch.__new__(tl.Launch)
    launch.m, launch.p, launch.job = Module(), {"node_rank": 1}, "train"
    with pytest.raises(Failed) as died:
        launch.confirm({"state": "failed", "node_rank": 1, "log": "/l", "log_tail": "CUDA error 802"})
    assert str(died.value) == "(node rank 1): job train is failed. Log /l: CUDA error 802"
    assert act.confirmed({"failed": True, "msg": str(died.value)}, "gpu-node7")["msg"] == \
        "gpu-node7 (node rank 1): job train is failed. Log /l: CUDA error 802"
    assert act.confirmed({"failed": True, "msg": "env file x: bad"}, "gpu-node7")["msg"] == "env file x: bad"
    with pytest.raises(Failed, match=r"^\(node rank 1\): job train runs here with node rank 0, not this node's"):
        launch.confirm({"state": "running", "node_rank": 0, "log": "/l"})
    assert launch.confirm({"state": "finished", "node_rank": 1, "pid": 7, "log": "/l"})["msg"] == \
        "node rank 1: finished (left alone: rerun_finished=false), pid 7, resume from nothing, log /l"
    launch.m.check_mode = True  # a plan: any state, the rank still checked
    ok = launch.confirm({"state": "started", "node_rank": 1, "changed": True})
    assert ok["msg"].startswith("node rank 1: started (started)")
    assert act.confirmed(ok, "gpu-node7")["_ansible_verbose_always"] is True


# The job of secret_env_mode=file: its own environment and every process's environ below it, and the files.
FILE_ENTRY = textwrap.dedent("""
    import json, os, sys
    d = os.environ.get("TRAINYARD_SECRETS_DIR", "")
    seen = {"dir": d, "env_has": [k for k in ("HF_TOKEN", "WANDB_API_KEY") if k in os.environ],
            "files": {n: open(os.path.join(d, n)).read() for n in sorted(os.listdir(d))} if d else {}}
    environs = b""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                environs += open("/proc/%s/environ" % pid, "rb").read()
            except OSError:
                pass
    seen["in_any_environ"] = [v for v in seen["files"].values() if v.encode() in environs]
    open(sys.argv[1], "w").write(json.dumps(seen))
    print("trainyard: first step done", flush=True)
""")


def test_secret_env_mode_file_gives_0400_files_and_no_value_in_any_environ(tmp_path):
    secret = tmp_path / "run" / "secret.env"
    secret.parent.mkdir(mode=0o700)
    secret.write_text(f"HF_TOKEN={SECRET}\nWANDB_API_KEY={OTHER}\n")
    secret.chmod(0o600)
    sdir = secret.parent / "secrets"
    (tmp_path / "entry_file.py").write_text(FILE_ENTRY)
    try:
        p, res = playbook(tmp_path, secret_env_file=str(secret), secret_env_mode="file", secrets_uid=os.getuid(),
                          entrypoint=str(tmp_path / "entry_file.py"))
        assert p.returncode == 0, p.stdout[-3000:]
        seen = json.loads((tmp_path / "seen").read_text())
        assert seen["dir"] == str(sdir) and seen["env_has"] == []
        assert seen["files"] == {"HF_TOKEN": SECRET, "WANDB_API_KEY": OTHER}
        assert seen["in_any_environ"] == []  # no process on this machine holds a value in its environment
        assert stat.S_IMODE(sdir.stat().st_mode) == 0o500
        for f in sdir.iterdir():
            assert stat.S_IMODE(f.lstat().st_mode) == 0o400 and f.lstat().st_uid == os.getuid()
        assert res["secrets_dir"] == str(sdir) and SECRET not in p.stdout + json.dumps(res)
        state = (tmp_path / "state" / "secretjob" / "launch.json").read_text()
        assert SECRET not in state and OTHER not in state
    finally:
        playbook(tmp_path, state="stopped", secrets_dir=str(sdir))  # as the launch role's reset passes it
    assert sdir.is_dir() and list(sdir.iterdir()) == []  # the stop empties it (a container may mount it)


def test_write_secret_files_replaces_a_planted_link_and_drops_old_names(tmp_path):
    tl = load("library/torchrun_launch.py", "torchrun_launch_mod")
    outside = tmp_path / "outside"
    outside.write_text("keep")
    d = tmp_path / "secrets"
    d.mkdir()
    os.symlink(outside, d / "HF_TOKEN")
    (d / "OLD").write_text("stale")
    tl.write_secret_files(str(d), {"HF_TOKEN": SECRET}, os.getuid(), os.getgid())
    assert outside.read_text() == "keep"  # the link was replaced, never written through
    assert sorted(p.name for p in d.iterdir()) == ["HF_TOKEN"] and (d / "HF_TOKEN").read_text() == SECRET
    assert not (d / "HF_TOKEN").is_symlink()
    os.chmod(d, 0o700)
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "linked")
    with pytest.raises(OSError):
        tl.write_secret_files(str(tmp_path / "linked"), {"A": "x"}, os.getuid(), os.getgid())
    assert list((tmp_path / "real").iterdir()) == []
    with pytest.raises(ValueError):
        tl.write_secret_files(str(d), {"../x": "x"}, os.getuid(), os.getgid())


def test_secret_files_belong_to_the_containers_user():
    """secrets_uid -1 (the default) takes the training container's numeric user, so a job that runs as
    container_user (65532:65532 by default) can read its 0400 secret files; a name or root gives root."""
    mod = load("library/torchrun_launch.py")
    assert mod.container_user_ids("65532:65532") == (65532, 65532)
    assert mod.container_user_ids("1000:2000") == (1000, 2000)
    assert mod.container_user_ids("1000") == (1000, 1000)
    for user in ("", "root", "0:0", "trainer", "trainer:1000"):
        assert mod.container_user_ids(user) == (0, 0), user


def test_a_start_without_secrets_removes_the_stale_secrets_file(tmp_path):
    """The former "Remove the secrets file when the job has no secrets" task, now the start's own step: check mode
    names it and keeps it, the start removes it (a link goes, its target stays), an absent file changes nothing."""
    host_only = tmp_path / "run"
    host_only.mkdir(mode=0o700)
    stale = host_only / "secrets.env"
    stale.write_text(f"HF_TOKEN={SECRET}\n")
    p, res = playbook(tmp_path, "--check", stale_secret_env_file=str(stale))
    assert p.returncode == 0 and res["stale_secret_env_file_removed"] and res["changed"], p.stdout[-2000:]
    assert stale.exists()
    try:
        p, res = playbook(tmp_path, stale_secret_env_file=str(stale))
        assert p.returncode == 0 and res["stale_secret_env_file_removed"], p.stdout[-2000:]
        assert not stale.exists()
        target = tmp_path / "elsewhere"
        target.write_text("keep")
        stale.symlink_to(target)
        p, res = playbook(tmp_path, stale_secret_env_file=str(stale))  # the same job runs: left alone, link gone
        assert p.returncode == 0 and res["stale_secret_env_file_removed"] and res["changed"], p.stdout[-2000:]
        assert not os.path.lexists(stale) and target.read_text() == "keep"
        p, res = playbook(tmp_path, stale_secret_env_file=str(stale))
        assert p.returncode == 0 and not res["stale_secret_env_file_removed"] and not res["changed"], res
        # With secrets, the option is ignored: the file stays.
        stale.write_text(f"HF_TOKEN={SECRET}\n")
        stale.chmod(0o600)
        p, res = playbook(tmp_path, "--check", stale_secret_env_file=str(stale), secret_env_file=str(stale))
        assert "stale_secret_env_file_removed" not in res and stale.exists(), res
    finally:
        stop(tmp_path)


def test_the_host_probe_reads_whether_the_job_runs_as_the_launchs_status_does(tmp_path):
    """host_facts job (the cluster role's probe, which role nccl_check reads instead of a status read of its own):
    running while the job's processes live, stopped after the stop, absent without a launch record, unknown with the
    reason for a torn one; the same answer as torchrun_launch state=status."""
    from helpers import adhoc
    spec = {"name": "secretjob", "state_root": str(tmp_path / "state")}
    hold = tmp_path / "hold.py"
    hold.write_text("import time\nprint('trainyard: first step done', flush=True)\ntime.sleep(120)\n")
    assert adhoc("host_facts", {"job": spec})["job"] == {"name": "secretjob", "state": "absent", "processes": 0}
    try:
        p, res = playbook(tmp_path, entrypoint=str(hold), args=[])
        assert p.returncode == 0 and res["state"] == "running", p.stdout[-3000:]
        job = adhoc("host_facts", {"job": spec})["job"]
        assert job["state"] == "running" and job["processes"] == len(res["processes"]) > 0, (job, res)
        record = (tmp_path / "state" / "secretjob" / "launch.json").read_text()
    finally:
        stop(tmp_path)
    assert adhoc("host_facts", {"job": spec})["job"]["state"] == "absent"  # the stop removed the record
    (tmp_path / "state" / "secretjob" / "launch.json").write_text(record)  # a record whose processes are gone
    assert adhoc("host_facts", {"job": spec})["job"] == {"name": "secretjob", "state": "stopped", "processes": 0}
    (tmp_path / "state" / "secretjob" / "launch.json").write_text("{torn")
    job = adhoc("host_facts", {"job": spec})["job"]
    assert job["state"] == "unknown" and job["error"], job
    bad = adhoc("host_facts", {"job": {"name": "../x", "state_root": str(tmp_path)}})["job"]
    assert bad["state"] == "unknown" and "job name" in bad["error"], bad
    assert "job" not in adhoc("host_facts", {"paths": []})
