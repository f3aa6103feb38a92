"""module_utils/torchrun.py: the torchrun command, env files, the state file, and torchrun's failure reports
(logs captured from real torchrun 2.13 runs under tests/data/torchrun/)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import REPO

from ansible_collections.trainyard.core.plugins.module_utils import launcher
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr

DATA = REPO / "tests/data/torchrun"


def log(name: str) -> str:
    return (DATA / name).read_text()


# ------------------------------------------------------------------------------------------------ command

def test_static_command_carries_every_rank_parameter():
    cmd = tr.build_command(3, 8, 2, "10.0.0.11", 39500, "/srv/code/train.py", ["--lr", "0.1"], rdzv_id="train")
    assert cmd == ["torchrun", "--nnodes=3", "--nproc_per_node=8", "--node_rank=2", "--master_addr=10.0.0.11",
                   "--master_port=39500", "--rdzv_backend=static", "--rdzv_id=train", "--max_restarts=0",
                   "/srv/code/train.py", "--lr", "0.1"]


def test_c10d_command_uses_an_endpoint_and_no_node_rank():
    cmd = tr.build_command(2, 4, 1, "head", 29400, "t.py", rdzv_backend="c10d", max_restarts=3)
    assert "--rdzv_endpoint=head:29400" in cmd and "--rdzv_backend=c10d" in cmd
    assert not any(a.startswith("--node_rank") for a in cmd)
    assert "--max_restarts=3" in cmd


def test_torchrun_prefix_and_extra_args_go_before_the_entry_point():
    cmd = tr.build_command(1, 1, 0, "a", 1, "t.py", ["x"], torchrun=["python3", "-m", "torch.distributed.run"],
                           extra_torchrun_args=["--monitor_interval=1"])
    assert cmd[:3] == ["python3", "-m", "torch.distributed.run"]
    assert cmd.index("--monitor_interval=1") < cmd.index("t.py") < cmd.index("x")


@pytest.mark.parametrize("kw,words", [
    (dict(node_rank=3), "node_rank=3 is outside 0..2"),
    (dict(node_rank=-1), "node_rank=-1"),
    (dict(nnodes=0), "nnodes=0"),
    (dict(nproc_per_node=0), "nproc_per_node=0"),
    (dict(master_port=70000), "master_port=70000"),
    (dict(master_addr=""), "master_addr is empty"),
    (dict(entrypoint=""), "entrypoint is empty"),
    (dict(rdzv_backend="etcd"), "rdzv_backend='etcd'"),
    (dict(max_restarts=-1), "max_restarts=-1"),
])
def test_bad_parameters_are_named(kw, words):
    args = dict(nnodes=3, nproc_per_node=1, node_rank=0, master_addr="h", master_port=1, entrypoint="t.py")
    args.update(kw)
    with pytest.raises(tr.LaunchError) as e:
        tr.build_command(**args)
    assert words in str(e.value)


def test_resume_arguments():
    assert tr.resume_args(None, "--resume") == []
    assert tr.resume_args("/o/checkpoint-5", "") == []
    assert tr.resume_args("/o/checkpoint-5", "--resume_from_checkpoint") == ["--resume_from_checkpoint",
                                                                            "/o/checkpoint-5"]
    assert tr.resume_args("/o/checkpoint-5", "--resume=") == ["--resume=/o/checkpoint-5"]
    cmd = tr.build_command(1, 1, 0, "h", 1, "t.py", ["--a"], resume_path="/c-1", resume_arg="--r")
    assert cmd[-3:] == ["--a", "--r", "/c-1"]


def test_shell_quote_is_copy_pasteable():
    assert tr.shell_quote(["torchrun", "a b", "x;rm"]) == "torchrun 'a b' 'x;rm'"


@pytest.mark.parametrize("name", ["train", "job-1", "a.b_c"])
def test_good_job_names(name):
    assert tr.validate_job_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "-x", "a b"])
def test_bad_job_names(name):
    with pytest.raises(tr.LaunchError):
        tr.validate_job_name(name)


# -------------------------------------------------------------------------------------------- environment

def test_env_file_forms():
    text = "# comment\n\nA=1\n  B=two words\nE=a=b\nF=x#y\n"
    env, problems = tr.parse_env_file(text)
    assert env == {"A": "1", "B": "two words", "E": "a=b", "F": "x#y"}
    assert problems == []


def test_env_file_problems_name_the_line():
    env, problems = tr.parse_env_file("GOOD=1\nnot a line\n1BAD=2\n", "nccl.env")
    assert env == {"GOOD": "1"}
    assert len(problems) == 2 and "nccl.env line 2" in problems[0] and "line 3" in problems[1]


@pytest.mark.parametrize("line,why", [
    ("C='quoted'", "starts with a quote"), ('D="dq"', "starts with a quote"), ("E=a\\;b", "backslash"),
    ("F=spaced  ", "blanks at the end"), ("export B=1", "export"), ("G = 1", "no blanks around the name"),
])
def test_env_file_lines_docker_and_systemd_read_differently_are_refused(line, why):
    env, problems = tr.parse_env_file("OK=1\n" + line + "\n", "x.env")
    assert env == {"OK": "1"} and len(problems) == 1 and why in problems[0] and "x.env line 2" in problems[0]


def test_merge_env_order_and_resume():
    env = tr.merge_env([{"A": "1", "B": "1"}, {"B": "2"}], {"C": "3", "TRAINYARD_RESUME_FROM": "stale"},
                       resume_path=None, token="tok")
    assert env == {"A": "1", "B": "2", "C": "3", "TRAINYARD_LAUNCH_ID": "tok"}
    env = tr.merge_env([], {}, resume_path="/o/checkpoint-9")
    assert env == {"TRAINYARD_RESUME_FROM": "/o/checkpoint-9"}


def test_validate_env_rejects_bad_names_and_stringifies():
    assert tr.validate_env({"A": 1, "B": None}) == {"A": "1", "B": ""}
    with pytest.raises(tr.LaunchError):
        tr.validate_env({"A-B": "x"})


def test_fingerprint_ignores_resume_but_not_command_or_env():
    base = tr.build_command(2, 1, 0, "h", 1, "t.py")
    fp = tr.fingerprint(base, {"A": "1"}, ["/e"], "/c", "docker", "ctr")
    assert fp == tr.fingerprint(list(base), {"A": "1"}, ["/e"], "/c", "docker", "ctr")
    assert fp != tr.fingerprint(base + ["--x"], {"A": "1"}, ["/e"], "/c", "docker", "ctr")
    assert fp != tr.fingerprint(base, {"A": "2"}, ["/e"], "/c", "docker", "ctr")
    assert fp != tr.fingerprint(base, {"A": "1"}, ["/e"], "/c", "host", "")


def test_a_refused_relaunch_names_what_changed_by_name_never_by_value():
    running = tr.fingerprint_parts({"A": "1", "B": "x", "GONE": "1"}, ["/e/nccl.env"], "/c", "docker", "ctr")
    wanted = tr.fingerprint_parts({"A": "1", "B": "secret-y", "NEW": "v"}, [], "/c", "docker", "ctr")
    changes = tr.fingerprint_changes(running, wanted)
    assert changes == ["environment set anew: NEW", "environment no longer set: GONE",
                       "environment another value: B", 'env files ["/e/nccl.env"] -> []']
    assert "secret-y" not in json.dumps(wanted) and "secret-y" not in " ".join(changes)
    assert tr.fingerprint_changes(running, running) == []
    # A record written before the parts were kept: nothing to compare, no guess.
    assert tr.fingerprint_changes(None, wanted) == [] and tr.fingerprint_changes({"env": 5}, wanted) == []


def test_the_record_keeps_the_parts_and_drops_a_torn_one():
    state = _state()
    state["fingerprint_parts"] = tr.fingerprint_parts({"A": "1"}, [], "", "host", "")
    assert tr.parse_state(tr.dumps_state(state))["fingerprint_parts"]["env"].keys() == {"A"}
    state["fingerprint_parts"] = "torn"
    assert tr.parse_state(tr.dumps_state(state))["fingerprint_parts"] is None


# --------------------------------------------------------------------------------------------- state file

def _state():
    return tr.make_state("train", "docker", "trainyard-train", 42, 42, 1000, 1.5, ["torchrun", "x"], ["/e"],
                         "/l", 1, 39500, "/o/checkpoint-2", [{"name": "janitor", "pid": 50, "pgid": 50,
                                                               "start_ticks": 1001, "argv": ["j"]}], "tok", "fp",
                         "/x", torchrun_pid=43)


def test_state_round_trip_matches_the_contract_fields():
    st = _state()
    back = tr.parse_state(tr.dumps_state(st))
    assert back == st
    for key in ("job", "runtime", "container", "pid", "pgid", "start_ticks", "started_at", "command", "env_files",
                "log", "node_rank", "master_port", "resume_from", "sidecars"):
        assert key in back


@pytest.mark.parametrize("text,words", [
    ("[]", "not a JSON object"),
    ('{"job": "t"}', "'pid'"),
    ('{"job": "t", "pid": "12", "pgid": 1, "start_ticks": 1, "command": [], "log": "l"}', "'pid'"),
    ('{"job": "t", "pid": true, "pgid": 1, "start_ticks": 1, "command": [], "log": "l"}', "'pid'"),
    ('{"job": "t", "pid": 1, "pgid": 1, "start_ticks": 1, "command": [], "log": "l", "sidecars": [1]}', "sidecars"),
])
def test_bad_state_files_are_refused(text, words):
    with pytest.raises(ValueError) as e:
        tr.parse_state(text)
    assert words in str(e.value)


def test_torn_state_file_is_refused():
    with pytest.raises(ValueError):
        tr.parse_state(tr.dumps_state(_state())[:40])


def test_write_atomic_leaves_no_temp(tmp_path):
    p = tmp_path / "launch.json"
    tr.write_atomic(str(p), "x", 0o600)
    assert p.read_text() == "x" and oct(p.stat().st_mode & 0o777) == "0o600"
    assert os.listdir(tmp_path) == ["launch.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another group needs root (the launch module is root)")
def test_write_atomic_gives_the_group_before_the_mode(tmp_path):
    """The container's launch spec: 0640 with the group of job-ro (container_user's gid), so the launcher run as
    that unprivileged user reads it."""
    p = tmp_path / "launch.spec.json"
    tr.write_atomic(str(p), "{}", 0o640, gid=65532)
    st = p.stat()
    assert (st.st_gid, st.st_mode & 0o777, st.st_uid) == (65532, 0o640, 0)


def test_log_rotation_shifts_oldest_first():
    pairs = tr.rotated_names("/l/t.log", keep=3)
    assert pairs == [("/l/t.log.2", "/l/t.log.3"), ("/l/t.log.1", "/l/t.log.2"), ("/l/t.log", "/l/t.log.1")]


# ------------------------------------------------------------------------------------------------ logs

def test_sigkilled_rank():
    f = tr.root_cause(log("failed_sigkill.log"))
    assert (f["rank"], f["local_rank"], f["exitcode"], f["signal"], f["pid"]) == (0, 0, -9, "SIGKILL", 5804)
    assert f["time"] == "2026-11-22_21:30:57"
    # The glog line gives the sub-second time the agent saw it.
    assert abs(f["time_epoch"] - (tr._torch_time("2026-11-22_21:30:57") + 0.376)) < 1e-6


def test_killed_rank_beats_the_survivor_torchrun_calls_first():
    # kill -9 of local rank 1; rank 0 logged its connection reset a second earlier, so torchrun's
    # "first observed failure" is rank 0. The cause is rank 1.
    text = log("killed_rank_survivor_first.log")
    fs = tr.parse_failures(text)
    assert [(f["rank"], f["root_cause"]) for f in fs] == [(0, True), (1, False)]
    assert "Connection reset by peer" in fs[0]["traceback"]
    assert tr.failure_class(fs[0]) == 2
    cause = tr.root_cause(text)
    assert (cause["rank"], cause["signal"], cause["exitcode"]) == (1, "SIGKILL", -9)


def test_multiline_traceback_of_a_recorded_error():
    fs = tr.parse_failures(log("failed_record_two_ranks.log"))
    boom = [f for f in fs if f["rank"] == 1][0]
    assert boom["exitcode"] == 1 and boom["signal"] is None
    assert boom["traceback"].splitlines()[-1] == "RuntimeError: boom at step 3"
    assert tr.failure_class(boom) == 1


def test_restarted_group_reports_its_last_attempt():
    f = tr.root_cause(log("failed_after_restart.log"))
    assert f["pid"] == 6190 and f["signal"] == "SIGKILL"


def test_no_failure_in_a_clean_log():
    assert tr.parse_failures("trainyard: step 1\ntrainyard: done\n") == []
    assert tr.root_cause("") is None


def test_failure_classes():
    assert tr.failure_class({"signal": "SIGSEGV", "traceback": "Signal 11"}) == 0
    assert tr.failure_class({"signal": None, "traceback": "Traceback...\nValueError: x"}) == 1
    assert tr.failure_class({"signal": None, "traceback": "RuntimeError: Timed out waiting 30000ms"}) == 2
    assert tr.failure_class({"signal": "SIGTERM", "traceback": "Signal 15 (SIGTERM) received by PID 3"}) == 3
    assert tr.failure_class({"signal": None, "traceback": "To enable traceback see: ..."}) == 1


def test_first_failure_across_nodes():
    victim = {"node_rank": 0, "rank": 0, "signal": None, "time_epoch": 100.0,
              "traceback": "RuntimeError: Connection closed by peer"}
    killed = {"node_rank": 2, "rank": 2, "signal": "SIGKILL", "time_epoch": 101.5, "traceback": "Signal 9"}
    torn = {"node_rank": 1, "rank": 1, "signal": "SIGTERM", "time_epoch": 99.0, "traceback": ""}
    assert tr.first_failure([victim, torn, killed, None]) is killed
    a = dict(killed, node_rank=1, rank=1, time_epoch=101.2)
    assert tr.first_failure([killed, a]) is a
    assert tr.first_failure([]) is None


def test_time_format_and_glog_year():
    assert tr._torch_time("garbage") is None
    assert tr._glog_time(("1122", "21:31:10.522000"), "2026-11-22_21:31:10") == \
        tr._torch_time("2026-11-22_21:31:10") + 0.522


def test_markers_tail_and_last_line():
    text = "a\ntrainyard: first step done step=1\n\nb\n\n"
    assert tr.find_marker(text, r"first step done") == "trainyard: first step done step=1"
    assert tr.find_marker(text, "") is None and tr.find_marker(text, "nope") is None
    assert tr.last_line(text) == "b"
    assert tr.log_tail("\n".join(map(str, range(100))), 3) == "97\n98\n99"


@pytest.mark.parametrize("alive,exit_info,failure,want", [
    (True, None, None, "running"),
    (True, None, {"rank": 0}, "running"),
    (False, {"returncode": 0}, None, "finished"),
    (False, {"returncode": 1}, None, "failed"),
    (False, {"returncode": 0}, {"rank": 1}, "failed"),
    (False, None, None, "failed"),
])
def test_job_status(alive, exit_info, failure, want):
    assert tr.job_status(alive, exit_info, failure) == want


def test_launcher_is_a_script_that_imports_nothing_but_the_standard_library():
    """The launcher runs with the job's python (maybe inside the training container): stdlib only, a main guard."""
    import ast
    import sys

    text = Path(launcher.__file__).read_text()
    assert text.startswith("#!/usr/bin/env python3\n") and 'if __name__ == "__main__":' in text
    imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)}
    assert imported and imported <= set(sys.stdlib_module_names), imported


def test_sim_cluster_logs_name_the_killed_node():
    # Real logs of a 3-node run on the simulated cluster: rank 1 (node rank 1) kill -9'd; node rank 0 logged
    # its connection reset in the same second, earlier by torchrun's clock.
    killed = tr.root_cause(log("sim_node_killed.log"))
    survivor = tr.root_cause(log("sim_node_survivor.log"))
    killed["node_rank"], survivor["node_rank"] = 1, 0
    assert survivor["time_epoch"] < killed["time_epoch"]
    assert tr.first_failure([survivor, killed]) is killed
    assert (killed["rank"], killed["signal"]) == (1, "SIGKILL")


def test_failure_tail_drops_torchruns_own_stack_and_report():
    tail = tr.failure_tail(log("sim_node_survivor.log"), 8)
    assert "launch_agent" not in tail and "Root Cause" not in tail
    assert "Connection reset by peer" in tail
    assert tail.splitlines()[-1].endswith("torchrun exited with code 1")
    assert tr.failure_tail("a\nb\n", 5) == "a\nb"


def test_failure_tail_folds_a_dump_the_job_printed_before_it_failed():
    # The tail of a real torchrun.log (2 nodes x 2 H100s in the training container, rank 3 killed -9 right after
    # checkpoint-10 was saved: docs/gpu-acceptance/container-2x2-hardened/status.log): 19 of its last 30 lines are
    # the model config the save printed.
    text = log("container_killed_after_checkpoint.log")
    tail = tr.failure_tail(text, 12).splitlines()
    assert tail[-1].endswith("torchrun exited with code 1")
    assert any("failed (exitcode: -9) local_rank: 1" in x for x in tail)
    assert any("Connection closed by localRank 1" in x for x in tail)
    assert any("tokenizer config file saved" in x for x in tail)
    assert "more lines of the job's output" in "\n".join(tail)
    assert sum('"' in x and x.startswith("  ") for x in tail) <= 2
    # a traceback is kept whole, however deep
    tb = ["Traceback (most recent call last):"] + [f'  File "f{i}.py", line {i}, in g\n    x()' for i in range(6)]
    tb = "\n".join(tb + ["RuntimeError: NCCL error", "trainyard-launch: torchrun exited with code 1"])
    assert tr.failure_tail(tb, 40) == tb
