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

from conftest import BIN, REPO

BIN = BIN
SECRET = "hf_s3cr3t-Val9e-never-printed"
OTHER = "pw-0th3r-never-printed"
ENTRY = textwrap.dedent("""
    import os, sys
    open(sys.argv[1], "w").write(os.environ.get("HF_TOKEN", "") + "\\n" + os.environ.get("WANDB_API_KEY", ""))
    print("trainyard: first step done", flush=True)
""")

pytestmark = pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="needs the controller venv (make venv)")


def playbook(tmp_path: Path, *extra: str, **module_args) -> tuple[subprocess.CompletedProcess, dict]:
    entry = tmp_path / "entry.py"
    entry.write_text(ENTRY)
    args = {"job": "secretjob", "state_root": str(tmp_path / "state"), "nnodes": 1, "nproc_per_node": 1,
            "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29000 + os.getpid() % 5000,
            "torchrun": [str(BIN / "torchrun")], "entrypoint": str(entry), "args": [str(tmp_path / "seen")],
            "env": {"OMP_NUM_THREADS": "1"}, "wait_for": "first_step", "wait_timeout": 120, "stop_timeout": 5}
    args.update(module_args)
    pb = tmp_path / "pb.yml"
    pb.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": [
        {"torchrun_launch": args, "register": "r"},
        {"ansible.builtin.copy": {"content": "{{ r | to_json }}", "dest": str(tmp_path / "result.json"),
                                  "mode": "0600"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    p = subprocess.run([str(BIN / "ansible-playbook"), "-v", "-i", "localhost,", "-c", "local",
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
        # Modes: the state directory 0750, its control files 0640, the launch spec 0600.
        assert stat.S_IMODE(job.stat().st_mode) == 0o750
        for name in ("launch.json", "launch.pid.json", "torchrun.log"):
            assert stat.S_IMODE(where[name].stat().st_mode) == 0o640, name
        assert stat.S_IMODE(where["launch.spec.json"].stat().st_mode) == 0o600
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
