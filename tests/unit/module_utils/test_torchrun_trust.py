"""The container → host boundary of the launch: what the container mounts, and what the host believes of the
records a job can write (the launcher's pid record, its exit record, its log)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from helpers import REPO

from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr


def test_the_container_mounts_only_the_jobs_read_only_and_writable_parts_never_the_host_only_state():
    mounts = yaml.safe_load((REPO / "roles/container/defaults/main.yml").read_text())["container_mounts"]
    state = "{{ cluster_state_dir }}"
    by_source = {m["source"]: m.get("read_only", False) for m in mounts}
    assert state not in by_source and f"{state}/{{{{ cluster_job_name }}}}" not in by_source
    assert by_source[f"{state}/{{{{ cluster_job_name }}}}/{tr.JOB_RO_DIR}"] is True
    assert by_source[f"{state}/{{{{ cluster_job_name }}}}/{tr.JOB_RW_DIR}"] is False
    lay = tr.job_layout("/var/lib/trainyard", "train")
    assert lay == {"dir": "/var/lib/trainyard/train", "ro": "/var/lib/trainyard/train/job-ro",
                   "rw": "/var/lib/trainyard/train/job-rw"}


def test_what_the_job_reads_is_rendered_into_its_read_only_part():
    for role, key in (("nccl_env", "nccl_env_dir"), ("deepspeed_config", "deepspeed_config_dir")):
        d = yaml.safe_load((REPO / f"roles/{role}/defaults/main.yml").read_text())[key]
        assert d.strip().endswith("/job-ro"), (role, d)
    log = yaml.safe_load((REPO / "roles/launch/defaults/main.yml").read_text())["launch_log"]
    assert "/job-rw/" in log


@pytest.fixture
def launcher_like():
    """A live process started the way the host starts the launcher: the token in its own environment."""
    token = "t" * 32
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         env=dict(os.environ, **{tr.TOKEN_ENV: token}))
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.2)
    yield token, p.pid, pg.start_ticks(p.pid), decoy.pid, pg.start_ticks(decoy.pid)
    for q in (p, decoy):
        q.kill()
        q.wait()


def test_pid_record_of_the_launcher_is_believed(launcher_like):
    token, pid, ticks, _, _ = launcher_like
    rec = {"pid": pid, "pgid": 1, "start_ticks": ticks, "child_pid": None, "token": token}
    out = tr.check_pid_record(rec, token, pg.read_stat, pg.read_environ)
    assert out["pid"] == pid and out["start_ticks"] == ticks and out["pgid"] == pg.read_stat(pid).pgrp


def test_forged_pid_records_pointing_at_host_processes_are_refused(launcher_like):
    token, pid, ticks, decoy, dticks = launcher_like
    forged = [
        {"pid": decoy, "start_ticks": dticks, "token": token},          # a host process without the token
        {"pid": 1, "start_ticks": pg.start_ticks(1), "token": token},   # PID 1
        {"pid": pid, "start_ticks": ticks + 1, "token": token},          # right PID, wrong start time
        {"pid": pid, "start_ticks": ticks, "token": "other"},           # another launch's record
        {"pid": True, "start_ticks": ticks, "token": token},
        {"pid": str(pid), "start_ticks": ticks, "token": token},
        [pid, ticks],
    ]
    for rec in forged:
        with pytest.raises(ValueError):
            tr.check_pid_record(rec, token, pg.read_stat, pg.read_environ)
    # A forged child is dropped, not believed.
    out = tr.check_pid_record({"pid": pid, "start_ticks": ticks, "token": token, "child_pid": decoy,
                               "child_start_ticks": dticks}, token, pg.read_stat, pg.read_environ)
    assert out["child_pid"] is None


def test_records_and_logs_from_the_job_writable_directory_are_read_as_untrusted_data(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text('{"returncode": 0}')
    (tmp_path / "launch.exit.json").symlink_to(secret)
    assert tr.read_untrusted_json(str(tmp_path / "launch.exit.json")) is None
    (tmp_path / "torchrun.log").symlink_to(secret)
    assert tr.read_untrusted(str(tmp_path / "torchrun.log")) == b""
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"returncode": 0, "pad": "x" * tr.RECORD_MAX_BYTES}))
    assert tr.read_untrusted_json(str(big)) is None
    for body in ("[1]", "{", "\xff"):
        (tmp_path / "r.json").write_text(body, errors="surrogateescape")
        assert tr.read_untrusted_json(str(tmp_path / "r.json")) is None
    os.mkfifo(tmp_path / "fifo")
    assert tr.read_untrusted(str(tmp_path / "fifo")) == b""  # a FIFO neither blocks nor is read
    log = tmp_path / "real.log"
    log.write_bytes(b"a" * 100 + b"TAIL")
    assert tr.read_untrusted(str(log), limit=4, tail=True) == b"TAIL"


def test_write_atomic_never_writes_through_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "launch.spec.json"
    target.symlink_to(victim)
    tr.write_atomic(str(target), "{}\n", 0o600)
    assert victim.read_text() == "keep" and not target.is_symlink() and target.read_text() == "{}\n"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
