"""module_utils/job_collect.py (safe reads, secrets, flight-recorder report, stragglers, stacks) and the modules
job_collect and collect_bundle run by the real ansible; a real gloo hang analysed by PyTorch's own analyzer."""

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import job_collect as jc
from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
from helpers import adhoc

REPO = Path(__file__).resolve().parents[3]
VENV = Path(sys.executable).parent


def test_safe_read_keeps_head_and_tail_and_refuses_links(tmp_path):
    f = tmp_path / "torchrun.log"
    f.write_bytes(b"HEAD" + b"x" * 10000 + b"TAIL")
    r = jc.safe_read(str(f), 100, head_bytes=10)
    assert r["truncated"] and r["size"] == 10008 and r["data"].startswith(b"HEAD") and r["data"].endswith(b"TAIL")
    assert b"left out" in r["data"]
    (tmp_path / "link").symlink_to("/etc/shadow")
    assert jc.safe_read(str(tmp_path / "link"), 100)["skipped"] == "a symbolic link (not followed)"
    os.mkfifo(tmp_path / "fifo")
    assert jc.safe_read(str(tmp_path / "fifo"), 100)["skipped"] == "not a regular file"
    assert jc.safe_read(str(tmp_path / "none"), 100)["skipped"] == "absent"
    (tmp_path / "dirlink").symlink_to(tmp_path)
    assert jc.safe_listdir(str(tmp_path / "dirlink")) == []


def test_secrets_are_removed_from_env_and_json():
    env = jc.redact_file("nccl.env", b"NCCL_DEBUG=WARN\nHF_TOKEN=hf_abc\nexport WANDB_API_KEY=k\n").decode()
    assert "hf_abc" not in env and "HF_TOKEN=<redacted>" in env and "WANDB_API_KEY=<redacted>" in env
    assert "NCCL_DEBUG=WARN" in env
    js = jc.redact_file("launch.spec.json", json.dumps(
        {"env": {"AWS_SECRET_ACCESS_KEY": "s3", "PATH": "/bin"}, "argv": ["--x", "HF_TOKEN=t"]}).encode())
    assert b"s3" not in js and b"HF_TOKEN=<redacted>" in js and b"/bin" in js


def test_error_files_named_in_torchrun_report():
    log = (REPO / "tests/data/torchrun/failed_record_two_ranks.log").read_text()
    paths = jc.error_files_in_log(log)
    assert paths and all(p.startswith("/") for p in paths)


def test_stragglers_from_per_rank_compute_time_not_step_time():
    now = 1000.0
    fast = {"step": 50, "steps_total": 100, "time": now - 1, "step_s": 0.5, "compute_s": 0.1}
    per_node = {"n1": {"node_rank": 0, "ranks": [dict(fast, rank=0), dict(fast, rank=1)]},
                "n2": {"node_rank": 1, "ranks": [dict(fast, rank=2, compute_s=0.35), dict(fast, rank=3, compute_s=0.3)]},
                "n3": {"node_rank": 2, "ranks": [dict(fast, rank=4, compute_s=0.11), dict(fast, rank=5)]}}
    s = jc.progress_summary(per_node, now, stall_s=60)
    assert [x["host"] for x in s["stragglers"]] == ["n2"]
    t = s["stragglers"][0]["text"]
    assert t.startswith("n2 (node rank 1) is a straggler: its ranks [2, 3]") and "(3.2x)" in t
    assert "CPU quota" in s["stragglers"][0]["fix"]
    n1 = s["nodes"][0]
    assert n1["last_step"] == 50 and n1["steps_per_s"] == 2.0 and n1["eta_s"] == 25.0 and s["stalled"] == []
    assert jc.progress_summary(per_node, now + 120, stall_s=60)["stalled"] == ["n1", "n2", "n3"]
    even = {h: dict(v, ranks=[dict(r, compute_s=0.1) for r in v["ranks"]]) for h, v in per_node.items()}
    assert jc.progress_summary(even, now)["stragglers"] == []


def test_a_running_job_without_any_step_stalls_when_its_log_is_silent():
    """Hung before its first step (rendezvous, NCCL init) or an entry point that writes no progress files: the
    silence since the launch or the log's last write counts, on the node's own clock; a job not running never."""
    node = {"node_rank": 0, "ranks": [], "state": "running", "started_at": 1000.0, "now": 1400.0, "log_mtime": None}
    assert jc.progress_summary({"n1": node}, 0.0, stall_s=300)["stalled"] == ["n1"]
    busy = dict(node, log_mtime=1390.0)  # it logs as it trains (HF Trainer's progress bar): not stalled
    s = jc.progress_summary({"n1": busy}, 0.0, stall_s=300)
    assert s["stalled"] == [] and s["nodes"][0]["age_s"] == 10.0 and s["nodes"][0]["no_step"]
    assert jc.progress_summary({"n1": dict(node, now=1200.0)}, 0.0, stall_s=300)["stalled"] == []
    for state in ("finished", "failed", None):
        assert jc.progress_summary({"n1": dict(node, state=state)}, 0.0, stall_s=300)["stalled"] == []
    assert jc.progress_summary({"n1": dict(node, started_at=None)}, 0.0, stall_s=300)["stalled"] == []


def test_stacks_of_py_spy_and_faulthandler():
    spy = ('Process 4242: python3 ddp_train.py\nPython v3.11.2 (/usr/bin/python3.11)\n\n'
           'Thread 4242 (idle): "MainThread"\n'
           '    all_reduce (torch/distributed/distributed_c10d.py:2501)\n'
           '    wrapper (torch/distributed/c10d_logger.py:83)\n'
           '    main (ddp_train.py:170)\n    <module> (ddp_train.py:200)\n')
    fh = ('Thread 0x00007f0c3a1ff640 (most recent call first):\n'
          '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n\n'
          'Current thread 0x00007f0c3f2a8740 (most recent call first):\n'
          '  File "/srv/code/ddp_train.py", line 175 in main\n  File "/srv/code/ddp_train.py", line 200 in <module>\n')
    assert jc.main_call(jc.parse_stacks(spy)) == "all_reduce (distributed_c10d.py:2501) called from main (ddp_train.py:170)"
    assert jc.main_call(jc.parse_stacks(fh)) == "main (ddp_train.py:175)"
    groups = jc.group_calls({0: "a", 1: "b", 2: "a"})
    assert groups == [{"call": "a", "ranks": [0, 2]}, {"call": "b", "ranks": [1]}]


def test_stack_lines_group_ranks_and_name_a_stopped_rank_with_the_fix():
    spy = "all_reduce (distributed_c10d.py:2501) called from main (ddp_train.py:170)"
    lines = jc.stack_lines({
        "n1": [{"rank": 0, "pid": 5, "state": "S", "call": spy}, {"rank": 1, "pid": 6, "state": "S", "call": spy}],
        "n2": [{"rank": 2, "pid": 7, "state": "T", "call": "batch (ddp_train.py:72) called from main (ddp_train.py:175)"},
               {"rank": 3, "pid": 8, "skipped": "py-spy: Permission denied"}]})
    assert lines[0] == "ranks 0 (n1), 1 (n1) sit in " + spy
    assert lines[1] == "rank 2 (n2) sits in batch (ddp_train.py:72) called from main (ddp_train.py:175)"
    assert lines[2].startswith("fix: the ranks outside the largest group")
    assert lines[3].startswith("rank 2 on n2 (pid 7) is stopped (SIGSTOP") and "SIGCONT" in lines[3]
    assert lines[4].startswith("n2 rank 3: no stack: py-spy: Permission denied. fix: put py-spy on the controller")
    assert jc.stack_lines({"n1": [{"rank": 0, "state": "S", "call": spy}]}) == ["rank 0 (n1) sits in " + spy]


def test_fr_report_parser_on_the_analyzers_own_words():
    text = ("Not all ranks joining collective, sequence number: 4\ninternal record id: 3\ngroup info: 0:default_pg\n"
            "collective: nccl:all_reduce\nmissing ranks: {1}\ninput sizes: [[4096]]\noutput sizes: [[4096]]\n"
            "world size: 2\nexpected ranks: {0, 1}\ncollective state: scheduled\ncollective stack trace: \n"
            " all_reduce at /x/distributed_c10d.py:3245\n<module> at /srv/code/train.py:10\n")
    (p,) = jc.parse_fr_report(text)
    assert (p["seq"], p["op"], p["missing_ranks"], p["input_sizes"], p["world_size"]) == (
        4, "nccl:all_reduce", [1], "[[4096]]", 2)
    (line,) = jc.fr_lines([p], lambda nr: ["node1", "node2"][nr], 1)
    assert line.startswith("rank 1 on node2 (node rank 1, local rank 0) never joined collective nccl:all_reduce "
                           "(sequence number 4, input sizes [[4096]]")
    assert "train.py:10" in line


@pytest.fixture(scope="module")
def gloo_dumps(tmp_path_factory):
    """Real dumps of a real hang: rank 1 skips an all_reduce (tests/data/flight_recorder/skip_collective.py)."""
    out = tmp_path_factory.mktemp("fr")
    env = dict(os.environ, FR_OUT=str(out), TORCH_FR_BUFFER_SIZE="2000", FR_TIMEOUT_S="3", OMP_NUM_THREADS="1")
    p = subprocess.run([str(VENV / "torchrun"), "--nproc_per_node", "2", "--master_port", "29619",
                        str(REPO / "tests/data/flight_recorder/skip_collective.py")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return {r: (out / f"rank_{r}").read_bytes() for r in (0, 1)}


def _files(dumps):
    return [{"name": f"flight_recorder/rank_{r}", "content": base64.b64encode(d).decode(), "size": len(d),
             "truncated": False, "skipped": ""} for r, d in dumps.items()]


def test_collect_bundle_names_the_rank_that_never_joined(tmp_path, gloo_dumps):
    # Two "nodes" of one rank each: rank 0's dump on node1, rank 1's on node2.
    results = {"node1": {"files": _files({0: gloo_dumps[0]}), "dumps": ["rank_0"], "kernel": {"events": []},
                         "gpus": [], "smi_error": "nvidia-smi not found", "progress": []},
               "node2": {"files": _files({1: gloo_dumps[1]}), "dumps": ["rank_1"], "kernel": {"events": []},
                         "gpus": [], "smi_error": "nvidia-smi not found", "progress": []},
               "node3": {"unreachable": True, "msg": "Failed to connect to the host via ssh: timed out"}}
    r = adhoc("collect_bundle", {"run_dir": str(tmp_path / "run"), "hosts": ["node1", "node2", "node3"],
                                 "results": results, "nproc_per_node": 1, "python": sys.executable})
    assert not r.get("failed"), r.get("msg")
    lines = r["lines"]
    assert any(l.startswith("hang: rank 1 on node2 (node rank 1, local rank 0) never joined collective "
                            "gloo:all_reduce (sequence number 4, input sizes [[4096]]") for l in lines), lines
    assert any(l.startswith("node3 (node rank 2, ranks 2-2): not collected: Failed to connect") for l in lines)
    fr = r["job"]["flight_recorder"]
    assert fr["status"] == "ok" and fr["problems"][0]["missing_ranks"] == [1]
    assert "--allow-incomplete-ranks" in (tmp_path / "run/flight_recorder.txt").read_text()  # 2 dumps, world 3
    hang = {h: [x for x in recs if x["check"] == "job.hang"][0]["status"] for h, recs in r["records"].items()}
    assert hang == {"node1": "pass", "node2": "fail"}
    assert (tmp_path / "run/nodes/node2/flight_recorder/rank_1").read_bytes() == gloo_dumps[1]
    assert "never joined" in (tmp_path / "run/collect.md").read_text()


def test_collect_bundle_refuses_a_dump_that_is_not_plain_data(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch %s" % (tmp_path / "pwned"),))
    bad = pickle.dumps({"version": "2.10", "entries": [Evil()]})
    results = {"node1": {"files": _files({0: bad}), "dumps": ["rank_0"], "kernel": {"events": []}, "gpus": [],
                         "smi_error": "x", "progress": []}}
    r = adhoc("collect_bundle", {"run_dir": str(tmp_path / "run"), "hosts": ["node1"], "results": results,
                                 "nproc_per_node": 1, "python": sys.executable})
    assert not (tmp_path / "pwned").exists()
    assert "refused" in r["job"]["flight_recorder"]["note"]


def _layout(tmp_path):
    """A job's node-local tree: host-only dir, job-ro and job-rw beneath it (module_utils/torchrun.py)."""
    job = tmp_path / "train"
    ro, rw = job / tr.JOB_RO_DIR, job / tr.JOB_RW_DIR
    (rw / "flight_recorder").mkdir(parents=True)
    (rw / "progress").mkdir()
    ro.mkdir()
    return job, ro, rw


def test_job_collect_on_a_state_dir(tmp_path):
    job, ro, rw = _layout(tmp_path)
    (ro / "nccl.env").write_text("NCCL_DEBUG=WARN\nHF_TOKEN=secret-value\n")
    (ro / "ds_config.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 4}))
    (rw / "torchrun.log").write_text("start\n" + "x" * 5000 + "\nlast line\n")
    (job / "torchrun.log").write_text("not the job's log\n")  # the log lives in job-rw, not the host-only dir
    (job / "launch.json").write_text(json.dumps({"job": "train", "started_at": time.time() - 60,
                                                 "log": str(rw / "torchrun.log"), "runtime": "host"}))
    (job / "launch.pid.json").write_text(json.dumps({"pid": 4242}))  # runtime host: records in the host-only dir
    (job / "janitor.log").write_text("janitor pass\n")
    (rw / "janitor.log").write_text("forged by the job\n")  # janitor.log is host-only: never read from job-rw
    (rw / "flight_recorder" / "rank_0").write_bytes(b"\x80\x04N.")
    (rw / "flight_recorder" / "rank_1").symlink_to("/etc/passwd")
    (rw / "progress" / "rank_0.json").write_text(json.dumps({"rank": 0, "step": 3, "compute_s": 0.1}))
    r = adhoc("job_collect", {"job": "train", "state_root": str(tmp_path), "log_max_bytes": 1000,
                              "log_head_bytes": 100, "nvidia_smi": ""})
    assert not r.get("failed"), r.get("msg")
    files = {f["name"]: f for f in r["files"]}
    env = base64.b64decode(files["nccl.env"]["content"]).decode()
    assert "secret-value" not in env and "HF_TOKEN=<redacted>" in env
    assert json.loads(base64.b64decode(files["ds_config.json"]["content"])) == {"train_micro_batch_size_per_gpu": 4}
    log = base64.b64decode(files["torchrun.log"]["content"]).decode()
    assert files["torchrun.log"]["truncated"] and log.startswith("start") and log.endswith("last line\n")
    assert json.loads(base64.b64decode(files["launch.pid.json"]["content"])) == {"pid": 4242}
    assert r["dumps"] == ["rank_0"] and files["flight_recorder/rank_1"]["skipped"] == "a symbolic link (not followed)"
    assert r["progress"] == [{"rank": 0, "step": 3, "compute_s": 0.1}]
    assert base64.b64decode(files["janitor.log"]["content"]) == b"janitor pass\n"
    assert files["launch.exit.json"]["skipped"] == "absent"
    assert files["container.inspect.json"]["skipped"].startswith("the job runs on the node")
    assert "secret-value" not in json.dumps(r)


def test_job_collect_follows_no_link_the_job_planted_in_its_writable_dir(tmp_path):
    """A job in a container owns job-rw: a directory it replaces by a link to a host directory, and host paths
    named in its log, must not be read on the host."""
    job, ro, rw = _layout(tmp_path)
    outside = tmp_path / "host-secrets"
    outside.mkdir()
    (outside / "rank_0").write_bytes(b"HOST-SECRET-DUMP")
    (outside / "rank_0.json").write_text(json.dumps({"rank": 0, "step": 99, "note": "HOST-SECRET-PROGRESS"}))
    (outside / "error.json").write_text("HOST-SECRET-ERROR")
    (rw / "flight_recorder").rmdir()
    (rw / "progress").rmdir()
    (rw / "flight_recorder").symlink_to(outside)
    (rw / "progress").symlink_to(outside)
    (rw / "torchrun.log").write_text("[rank0]: failed\n  error_file: %s\n" % (outside / "error.json"))
    (rw / tr.PID_FILE).write_text(json.dumps({"pid": 7}))
    (job / "launch.json").write_text(json.dumps({"job": "train", "started_at": time.time() - 60, "runtime": "docker",
                                                 "container": "ty-no-such-container-19b",
                                                 "log": str(rw / "torchrun.log")}))
    r = adhoc("job_collect", {"job": "train", "state_root": str(tmp_path), "nvidia_smi": "", "timeout": 20})
    assert not r.get("failed"), r.get("msg")
    files = {f["name"]: f for f in r["files"]}
    assert "HOST-SECRET" not in json.dumps(r)
    assert r["dumps"] == [] and r["progress"] == []
    assert "not followed" in files["flight_recorder"]["skipped"]
    assert files["error-0-host-secrets.json"]["skipped"].startswith("in container ty-no-such-container-19b")
    assert json.loads(base64.b64decode(files[tr.PID_FILE]["content"])) == {"pid": 7}  # docker: pid record in job-rw
    # the job-writable part itself replaced by a link: nothing under it is read
    (rw / "torchrun.log").rename(tmp_path / "log")
    for p in rw.iterdir():
        p.unlink()
    rw.rmdir()
    rw.symlink_to(outside)
    r = adhoc("job_collect", {"job": "train", "state_root": str(tmp_path), "nvidia_smi": "", "timeout": 20})
    files = {f["name"]: f for f in r["files"]}
    assert "HOST-SECRET" not in json.dumps(r)
    assert "not followed" in files["torchrun.log"]["skipped"]


def test_job_progress_reads_progress_from_job_rw_only(tmp_path):
    job, ro, rw = _layout(tmp_path)
    (rw / "progress" / "rank_1.json").write_text(json.dumps({"rank": 1, "step": 5}))
    (job / "progress").mkdir()
    (job / "progress" / "rank_0.json").write_text(json.dumps({"rank": 0, "step": 1}))  # old place: not read
    r = adhoc("job_progress", {"job": "train", "state_root": str(tmp_path), "nvidia_smi": ""})
    assert not r.get("failed"), r.get("msg")
    assert r["progress"] == [{"rank": 1, "step": 5}]
    (rw / "progress" / "rank_1.json").unlink()
    (rw / "progress").rmdir()
    (rw / "progress").symlink_to(job / "progress")
    r = adhoc("job_progress", {"job": "train", "state_root": str(tmp_path), "nvidia_smi": ""})
    assert r["progress"] == []
    r = adhoc("job_progress", {"job": "../etc", "state_root": str(tmp_path), "nvidia_smi": ""})
    assert r.get("failed") and "job name" in r["msg"]


HUNG_RANK = "import time\ndef wait_for_peers():\n    time.sleep(300)\nwait_for_peers()\n"


# The torchrun agent: its ranks as its direct children (the last beyond the launch's nproc_per_node).
AGENT = """import os, subprocess, sys, time
code, n = sys.argv[1], int(sys.argv[2])
env = lambda r: dict(os.environ, TRAINYARD_LAUNCH_ID="tok-1", RANK=str(r), LOCAL_RANK=str(r))
ranks = [subprocess.Popen([sys.executable, "-c", code], env=env(r)) for r in range(n)]
time.sleep(300)
"""


def test_job_progress_stacks_find_the_ranks_in_proc_and_dump_them_with_py_spy(tmp_path):
    """The ranks are the recorded torchrun agent's direct children, at most nproc_per_node, one of them stopped; a
    progress file that names a process of somebody else (PID 1) and a process the job invents with the token and a
    RANK are not ranks: the stacks come from /proc, never from that record."""
    pyspy = VENV / "py-spy"
    if not pyspy.exists():
        pytest.skip("py-spy is not installed in the virtualenv (requirements.txt pins it)")
    job, ro, rw = _layout(tmp_path)
    (rw / "progress" / "rank_0.json").write_text(json.dumps({"rank": 0, "step": 3, "pid": 1}))
    # This test process stands in for the launcher; the agent is its child.
    agent = subprocess.Popen([sys.executable, "-c", AGENT, HUNG_RANK, "3"])
    procs = [agent]
    try:
        ranks = {}
        for _ in range(200):
            ranks = {int((pg.read_environ(st.pid) or {}).get("RANK", -1)): st.pid for st in pg.all_stats()
                     if st.ppid == agent.pid}
            if set(ranks) == {0, 1, 2}:
                break
            time.sleep(0.05)
        # What the job invents: the launch token and a RANK, but no child of the agent.
        procs.append(subprocess.Popen([sys.executable, "-c", HUNG_RANK], env=dict(
            os.environ, TRAINYARD_LAUNCH_ID="tok-1", RANK="7", LOCAL_RANK="0")))
        (job / tr.STATE_FILE).write_text(json.dumps({
            "job": "train", "token": "tok-1", "pid": os.getpid(), "start_ticks": pg.start_ticks(os.getpid()),
            "torchrun_pid": agent.pid, "torchrun_start_ticks": pg.start_ticks(agent.pid), "nproc_per_node": 2}))
        time.sleep(1.0)
        os.kill(ranks[1], 19)  # SIGSTOP: a frozen rank
        r = adhoc("job_progress", {"job": "train", "state_root": str(tmp_path), "nvidia_smi": "", "stacks": True,
                                   "py_spy": str(pyspy)})
        assert not r.get("failed"), r.get("msg")
        got = {s["rank"]: s for s in r["stacks"]}
        assert set(got) == {0, 1}, r["stacks"]  # not rank 2 (beyond nproc_per_node), not the invented 7, not PID 1
        assert got[0]["pid"] == ranks[0] and got[1]["pid"] == ranks[1]
        assert got[0]["method"] == "py-spy" and got[0]["call"].startswith("wait_for_peers (<string>:3)")
        assert got[1]["state"] == "T" and got[1]["call"].startswith("wait_for_peers")
        kept = job / "stacks" / "rank_1.txt"
        assert got[1]["kept"] == str(kept) and "wait_for_peers" in kept.read_text()
        assert oct(kept.stat().st_mode & 0o777) == "0o600"
    finally:
        for st in pg.all_stats():
            if st.ppid == agent.pid:
                pg.signal_process(st.pid, st.start_ticks, 9)
        for p in procs:
            p.kill()
            p.wait()
