"""The Slurm launch backend without a Slurm: the sbatch argv, Slurm's answers parsed, a node's state, the runner's
docker exec and srun argv, the token rule that ends the job's processes, the validation rules of launch_backend, and
slurm_job's prepare and check-mode submit run by the real `ansible`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import slurm as sl
from ansible_collections.trainyard.core.plugins.module_utils import slurm_node as runner
from helpers import adhoc, load

tv = load("tests/unit/plugin_utils/test_validation.py", "tv_for_slurm")


# ---------------------------------------------------------------- sbatch
def test_sbatch_argv_names_exactly_the_models_nodes_and_excludes_the_others():
    argv = sl.sbatch_argv("sbatch", "train", ["n1", "n2", "n3"], ["n4"], "/s/train/slurm/slurm-%j.out",
                          "/s/train/slurm/slurm_node.py", "/s/train/slurm/batch.json", "gpu", "1:00:00",
                          ["--account=ml"])
    assert argv == ["sbatch", "--parsable", "--job-name=trainyard-train", "--nodes=3", "--ntasks-per-node=1",
                    "--nodelist=n1,n2,n3", "--output=/s/train/slurm/slurm-%j.out", "--chdir=/", "--exclude=n4",
                    "--partition=gpu", "--time=1:00:00", "--account=ml", "/s/train/slurm/slurm_node.py", "batch",
                    "/s/train/slurm/batch.json"]
    plain = sl.sbatch_argv("sbatch", "train", ["n1"], [], "o", "s", "b")
    assert not [a for a in plain if a.startswith(("--exclude", "--partition", "--time"))]


@pytest.mark.parametrize("nodes,exclude,words", [
    (["n1", "n 2"], [], "'n 2' not a Slurm node name"),
    (["n1", "n2;reboot"], [], "not a Slurm node name"),
    (["n1"], ["$(x)"], "exclude"),
    ([], [], "nodes is empty"),
    (["n1", "n2"], ["n2"], "both in the job and excluded"),
])
def test_sbatch_argv_refuses_bad_node_lists(nodes, exclude, words):
    with pytest.raises(sl.SlurmError, match=words.replace("(", r"\(").replace("$", r"\$").replace(")", r"\)")):
        sl.sbatch_argv("sbatch", "train", nodes, exclude, "o", "s", "b")


@pytest.mark.parametrize("out,job_id", [("42\n", "42"), ("42;cluster\n", "42"), ("warn\n17\n", "17")])
def test_job_id_from_sbatch_parsable(out, job_id):
    assert sl.parse_job_id(out) == job_id


@pytest.mark.parametrize("out", ["", "sbatch: error: Batch job submission failed", "4 2"])
def test_no_job_id_is_an_error_naming_the_output(out):
    with pytest.raises(sl.SlurmError, match="sbatch gave no job id"):
        sl.parse_job_id(out)


# ---------------------------------------------------------------- Slurm's answers
def test_scontrol_one_liner_and_squeue_rows():
    info = sl.parse_scontrol("JobId=7 JobName=trainyard-train UserId=root(0) JobState=FAILED Reason=NonZeroExitCode "
                             "ExitCode=1:0 NodeList=n[1-3] StdOut=/var/lib/trainyard/train/slurm/slurm-7.out")
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0" and info["NodeList"] == "n[1-3]"
    assert info["StdOut"].endswith("slurm-7.out")
    assert sl.parse_squeue("7|RUNNING|n[1-3]\n8|PENDING|Resources\n") == {"7": ("RUNNING", "n[1-3]"),
                                                                          "8": ("PENDING", "Resources")}


@pytest.mark.parametrize("state,active", [("RUNNING", True), ("PENDING", True), ("COMPLETING", True),
                                          ("CANCELLED by 0", False), ("COMPLETED", False), ("FAILED", False),
                                          ("", False), (None, False)])
def test_active_states(state, active):
    assert sl.is_active(state) is active


@pytest.mark.parametrize("slurm_state,exit_code,failure,expect", [
    ("", None, None, "absent"),
    ("PENDING", None, None, "running"),
    ("RUNNING", None, None, "running"),
    ("RUNNING", None, {"rank": 1}, "failed"),      # torchrun reported a failure; Slurm has not ended the step yet
    ("RUNNING", 0, None, "finished"),              # this node's torchrun ended well, others still run
    ("RUNNING", 1, None, "failed"),
    ("COMPLETED", None, None, "finished"),
    ("CANCELLED", None, None, "failed"),
    ("FAILED", 0, None, "finished"),               # this node ended well; another node failed the job
    ("NODE_FAIL", None, None, "failed"),
])
def test_node_state(slurm_state, exit_code, failure, expect):
    assert sl.node_state(slurm_state, exit_code, failure) == expect


def test_node_exit_is_the_runners_last_line():
    log = "x\ntrainyard: torchrun on this node exited with 0\nrestart\ntrainyard: torchrun on this node exited with -9\n"
    assert sl.node_exit(log) == -9
    assert sl.node_exit("trainyard: torchrun on this node exited with 0 (said the job)\n") is None
    assert sl.node_exit("") is None


# ---------------------------------------------------------------- the runner
def test_docker_exec_argv_is_a_list_with_the_token_and_the_environment_by_file():
    spec = {"container": "trainyard-train", "argv": ["torchrun", "--nnodes=3", "/srv/code/x.py", "; rm -rf /"],
            "env_file": "/s/train/slurm/job.env", "secret_env_file": "/run/trainyard/train/secret.env",
            "chdir": "/srv/code"}
    argv = runner.docker_argv(spec, "slurm-42")
    assert argv == ["docker", "exec", "--env-file", "/s/train/slurm/job.env", "--env-file",
                    "/run/trainyard/train/secret.env", "-e", "TRAINYARD_LAUNCH_ID=slurm-42", "-w", "/srv/code",
                    "trainyard-train", "torchrun", "--nnodes=3", "/srv/code/x.py", "; rm -rf /"]


def test_env_file_is_literal_and_refuses_line_breaks():
    assert sl.env_file_text({"B": "$(id) 'q'", "A": "1"}) == "A=1\nB=$(id) 'q'\n"
    with pytest.raises(sl.SlurmError, match="X hold a line break"):
        sl.env_file_text({"X": "a\nB=2"})


def test_workers_are_torchruns_direct_children():
    # 10: torchrun (its parent, docker's shim, is not the job's); 11, 12: ranks; 13: a rank's own child.
    assert sl.workers([(10, 5), (11, 10), (12, 10), (13, 11)]) == 2
    assert sl.workers([]) == 0


def test_srun_argv_runs_the_node_local_copy_once_per_node():
    spec = {"nnodes": 3, "python": "/usr/bin/python3", "srun_args": ["--mpi=none"]}
    assert runner.srun_argv(spec, "/s/train/slurm/slurm_node.py", "/s/train/slurm/node.json") == [
        "srun", "--ntasks-per-node=1", "--nodes=3", "--kill-on-bad-exit=1", "--unbuffered", "--mpi=none",
        "/usr/bin/python3", "/s/train/slurm/slurm_node.py", "node", "/s/train/slurm/node.json"]


def _sleeper(env):
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)


def test_end_token_ends_exactly_the_token_holders():
    token = "slurm-test-%d" % os.getpid()
    mine = _sleeper(dict(os.environ, TRAINYARD_LAUNCH_ID=token))
    other = _sleeper(dict(os.environ, TRAINYARD_LAUNCH_ID=token + "0"))   # a prefix match is another job
    try:
        deadline = time.monotonic() + 10
        while mine.pid not in runner.token_holders(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runner.token_holders(token) == [mine.pid]
        runner.end_token(token, grace=5)
        assert mine.wait(timeout=5) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_runner_usage_is_one_line():
    r = subprocess.run([sys.executable, runner.__file__, "nonsense"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("usage: slurm_node.py") and "Traceback" not in r.stderr


# ---------------------------------------------------------------- validation (before any host)
@pytest.mark.parametrize("variables,expect", [
    ({"launch_backend": "slurm", "launch_runtime": "host"},
     "Stop if launch_backend is slurm while launch_runtime is not docker"),
    ({"launch_backend": "slurm", "launch_rdzv_backend": "c10d"},
     "Stop if launch_backend is slurm while launch_rdzv_backend is not static"),
    ({"launch_backend": "slurm", "launch_secret_env_mode": "file"},
     "Stop if launch_backend is slurm while launch_secret_env_mode is not env"),
    ({"launch_backend": "slurmd"}, "Stop if launch_backend is not one of torchrun, slurm"),
])
def test_launch_backend_rules(variables, expect):
    (line,) = tv.run(tv.three(**variables))
    assert line.startswith(expect) and ". Fix: " in line and "on all 3 trainers" in line


def test_slurm_backend_with_its_defaults_is_valid():
    assert tv.run(tv.three(launch_backend="slurm")) == []
    assert tv.run(tv.three(launch_backend="torchrun", launch_runtime="host")) == []


# ---------------------------------------------------------------- the module, by the real ansible
def test_prepared_writes_a_host_only_task_and_reports_the_command(tmp_path):
    env_file = tmp_path / "nccl.env"
    env_file.write_text("NCCL_SOCKET_IFNAME=eth1\nHF_TOKEN=abc\n")
    args = {"state": "prepared", "job": "train", "state_root": str(tmp_path / "state"), "nnodes": 3,
            "nproc_per_node": 1, "node_rank": 2, "master_addr": "198.51.100.1", "master_port": 39500,
            "entrypoint": "/srv/code/ddp_train.py", "args": ["--steps", "5"], "env_files": [str(env_file)],
            "container": "trainyard-train", "resume_from": "/srv/outputs/checkpoint-10", "resume_arg": "--resume"}
    check = adhoc("slurm_job", args, "--check")
    assert check["changed"] and not (tmp_path / "state").exists()
    res = adhoc("slurm_job", args)
    assert res["changed"] and "abc" not in json.dumps(res), res
    assert "--node_rank=2" in res["argv"] and res["argv"][-2:] == ["--resume", "/srv/outputs/checkpoint-10"]
    spec_path = tmp_path / "state/train/slurm/node.json"
    spec = json.loads(spec_path.read_text())
    env_text = (tmp_path / "state/train/slurm/job.env").read_text()
    assert "TRAINYARD_RESUME_FROM=/srv/outputs/checkpoint-10\n" in env_text and spec["node_rank"] == 2
    assert "HF_TOKEN=abc\n" in env_text and res["env"]["HF_TOKEN"] != "abc"  # on the node only, never in a result
    assert oct(spec_path.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "state/train/slurm").stat().st_mode & 0o777) == "0o700"
    assert (tmp_path / "state/train/slurm/slurm_node.py").read_text().startswith("#!/usr/bin/python3\n")
    assert adhoc("slurm_job", args)["changed"] is False


def test_submitted_in_check_mode_shows_sbatch_and_runs_nothing(tmp_path):
    res = adhoc("slurm_job", {"state": "submitted", "job": "train", "state_root": str(tmp_path),
                              "nodes": ["n1", "n2"], "exclude": ["n3"]}, "--check")
    assert res["changed"] and res["argv"][0] == "sbatch" and "--exclude=n3" in res["argv"], res
    assert not (tmp_path / "train/slurm.json").exists()


def test_status_without_a_recorded_job_is_absent_and_bad_input_is_one_line(tmp_path):
    res = adhoc("slurm_job", {"state": "status", "job": "train", "state_root": str(tmp_path)})
    assert res["state"] == "absent" and not res.get("failed")
    bad = adhoc("slurm_job", {"state": "status", "job": "train", "state_root": str(tmp_path), "job_id": "1;reboot"})
    assert bad["failed"] and "is not a Slurm job id" in bad["msg"] and "Traceback" not in bad["msg"]
    cancel = adhoc("slurm_job", {"state": "cancelled", "job": "train", "state_root": str(tmp_path)})
    assert not cancel["changed"] and "nothing to cancel" in cancel["msg"]


def test_a_nodes_state_reads_only_the_lines_of_this_slurm_job():
    old = "trainyard: slurm job 2 step 0 on n2, node rank 1\nfailed (exitcode: -9) local_rank: 0\ntrainyard: torchrun on this node exited with 1\n"
    assert sl.this_job_log(old, "3") == ""  # job 3's runner has not rotated the log yet: nothing of job 3
    new = old + "trainyard: slurm job 3 step 0 on n2, node rank 1\ntrainyard: first step done step=1\n"
    assert sl.this_job_log(new, "3").startswith("trainyard: slurm job 3 step 0") and "exitcode: -9" not in sl.this_job_log(new, "3")
    assert sl.node_state("RUNNING", sl.node_exit(sl.this_job_log(old, "3")), None) == "running"



def test_two_submitters_at_once_submit_one_job(tmp_path, monkeypatch):
    """Two slurm_job state=submitted on the head at the same moment (two shards of one run): the second waits on the
    submit lock, then finds the first one's job running and leaves it alone. A stand-in sbatch (slow, counting its
    calls) and squeue (RUNNING for every id sbatch gave) on PATH."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "sbatch.calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\nsleep 1\necho x >> %s\nwc -l < %s | tr -d ' '\n" % (calls, calls))
    (bin_dir / "squeue").write_text(
        "#!/bin/sh\n# squeue -h -j ID -o ...\n[ -s %s ] && echo \"$3|RUNNING|n1\"\n" % calls)
    for name in ("sbatch", "squeue"):
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    state = tmp_path / "state"
    (state / "train" / "slurm").mkdir(parents=True)
    (state / "train" / "slurm" / "slurm_node.py").write_text("#!/usr/bin/python3\n")
    args = {"state": "submitted", "job": "train", "state_root": str(state), "nodes": ["n1", "n2"]}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: adhoc("slurm_job", args), range(2)))
    assert calls.read_text().count("x") == 1, results
    assert sorted(r["changed"] for r in results) == [False, True], results
    assert {r["job_id"] for r in results} == {"1"}, results
    assert "left alone" in next(r for r in results if not r["changed"])["msg"]
