"""The in-container health probe (roles/container/files/container_health.py), run for real on local dirs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO

PROBE = REPO / "roles/container/files/container_health.py"


def probe(params: dict, via_c: bool = True) -> dict:
    argv = ([sys.executable, "-c", PROBE.read_text()] if via_c else [sys.executable, str(PROBE)])
    r = subprocess.run([*argv, json.dumps(params)], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def ok(rec: dict) -> bool:
    return rec.get("status", "pass" if rec.get("ok") else "fail") == "pass"


def test_healthy_dirs(tmp_path: Path):
    for d in ("code", "out", "shared"):
        (tmp_path / d).mkdir()
    (tmp_path / "shared" / "model.bin").write_bytes(b"x")
    out = probe({"code_dir": str(tmp_path / "code"), "output_root": str(tmp_path / "out"),
                 "shared_root": str(tmp_path / "shared"), "logger_module": "json", "shm_size_bytes": 1,
                 "ulimits": {"stack": 1024}})
    assert ok(out["code_dir"]) and ok(out["output_writable"]) and ok(out["shared_readable"])
    assert "1 entries" in out["shared_readable"]["detail"]
    assert ok(out["logger"]) and ok(out["python"]) and ok(out["ulimits"]) and ok(out["shm"])
    # The probe file is gone.
    assert list((tmp_path / "out").iterdir()) == []


def test_failures_are_named(tmp_path: Path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    out = probe({"code_dir": str(tmp_path / "missing"), "output_root": str(not_a_dir),
                 "shared_root": str(tmp_path / "nope"), "logger_module": "trainyard_no_such_logger",
                 "shm_size_bytes": 2 ** 60, "ulimits": {"memlock": 2 ** 62}}, via_c=False)
    assert not ok(out["code_dir"]) and "does not exist" in out["code_dir"]["detail"]
    assert not ok(out["output_writable"]) and "cannot write" in out["output_writable"]["detail"]
    assert not ok(out["shared_readable"]) and "cannot list" in out["shared_readable"]["detail"]
    assert not ok(out["logger"]) and "ModuleNotFoundError" in out["logger"]["detail"]
    assert out["shm"]["status"] == "warn"
    # memlock 2**62 bytes is above any real limit unless it is unlimited.
    import resource
    if resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] != resource.RLIM_INFINITY:
        assert not ok(out["ulimits"]) and "memlock" in out["ulimits"]["detail"]


def test_imports_are_checked_once_per_container_instance(tmp_path: Path):
    cache = tmp_path / "imports.json"
    base = {"logger_module": "json", "import_cache": str(cache), "output_root": str(tmp_path)}
    first = probe(dict(base, instance="c1/2026-11-23T08:00:00Z/sha256:a"))
    assert ok(first["torch"]) and ok(first["logger"]) and "cached" not in first["torch"]
    assert json.loads(cache.read_text())["instance"] == "c1/2026-11-23T08:00:00Z/sha256:a"

    again = probe(dict(base, instance="c1/2026-11-23T08:00:00Z/sha256:a"))
    assert ok(again["torch"]) and again["torch"]["cached"] and "in this container instance" in again["torch"]["detail"]
    assert again["logger"]["cached"]
    # Everything else is still checked on every run.
    assert ok(again["output_writable"]) and "cached" not in again["output_writable"]

    # A restart (new start time) or another container checks the imports again.
    for instance in ("c1/2026-11-23T09:00:00Z/sha256:a", "c2/2026-11-23T08:00:00Z/sha256:a"):
        fresh = probe(dict(base, instance=instance))
        assert ok(fresh["torch"]) and "cached" not in fresh["torch"], instance
    # Without an instance (container_health_cache_imports: false) nothing is reused.
    assert "cached" not in probe(dict(base, instance=""))["torch"]


def test_a_failed_import_is_never_kept(tmp_path: Path):
    cache = tmp_path / "imports.json"
    params = {"logger_module": "trainyard_no_such_logger", "import_cache": str(cache), "instance": "c1/t/i"}
    for _ in range(2):
        out = probe(params)
        assert not ok(out["logger"]) and "cached" not in out["logger"]
    assert not cache.exists()
    # A cache written for another logger is not taken for this one.
    probe({"logger_module": "json", "import_cache": str(cache), "instance": "c1/t/i"})
    out = probe({"logger_module": "", "import_cache": str(cache), "instance": "c1/t/i"})
    assert out["logger"]["status"] == "skip" and "cached" not in out["torch"]
    out = probe({"logger_module": "trainyard_no_such_logger", "import_cache": str(cache), "instance": "c1/t/i"})
    assert not ok(out["logger"]) and "cached" not in out["torch"]


def test_gpu_visible_lists_the_uuids_nvidia_smi_shows(tmp_path: Path, monkeypatch):
    # the stand-in nvidia-smi replays a real H200 x4 node's answers (the NVIDIA stack is the one stand-in)
    monkeypatch.setenv("TRAINYARD_STANDIN_DATA", str(REPO / "tests/data/nvidia-smi/h200x4"))
    out = probe({"gpus": True, "nvidia_smi": str(REPO / "tests/sim/standin/nvidia-smi")})
    assert len(out["gpu_visible"]["uuids"]) == 4 and all(u.startswith("GPU-") for u in out["gpu_visible"]["uuids"])
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere: an error, never an empty pass
    broken = probe({"gpus": True, "nvidia_smi": str(tmp_path / "missing-smi")}, via_c=False)
    assert "nvidia-smi" in broken["gpu_visible"]["error"] and "uuids" not in broken["gpu_visible"]


def test_gpu_visible_skips_without_gpus():
    out = probe({"gpus": False, "gpu_skip_reason": "no GPU on this node (/dev/nvidiactl absent)"})
    assert out["gpu_visible"] == {"status": "skip", "detail": "no GPU on this node (/dev/nvidiactl absent)"}


def probe_env(params: dict, env: dict) -> dict:
    # The system Python: the test runner's may live under a directory only root can enter (/root/.pyenv).
    r = subprocess.run(["/usr/bin/python3", "-c", PROBE.read_text(), json.dumps(params)], capture_output=True,
                       text=True, timeout=120,
                       check=True, env=env)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_home_is_created_and_written_or_named(tmp_path: Path):
    """The job's HOME (container_home): created when missing (a uid without a passwd entry has none), written; an
    unwritable or unset HOME fails with the path and the uid."""
    home = tmp_path / "h" / "home"
    out = probe_env({}, {"HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert ok(out["home"]) and home.is_dir() and list(home.iterdir()) == [], out["home"]
    blocked = tmp_path / "file"
    blocked.write_text("x")
    out = probe_env({}, {"HOME": str(blocked / "home"), "PATH": "/usr/bin:/bin"})
    assert not ok(out["home"]) and "cannot be created by uid" in out["home"]["detail"], out["home"]
    out = probe_env({}, {"PATH": "/usr/bin:/bin"})
    assert not ok(out["home"]) and "HOME is not set" in out["home"]["detail"]


def _probe_as(uid: int, params: dict) -> dict:
    """The probe as the hardened container's user (the default container_user 65532:65532)."""
    # The system Python: the test runner's may live under a directory only root can enter (/root/.pyenv).
    r = subprocess.run(["/usr/bin/python3", "-c", PROBE.read_text(), json.dumps(params)], capture_output=True,
                       text=True, timeout=120,
                       check=True, user=uid, group=uid, extra_groups=[], env={"HOME": "/tmp", "PATH": "/usr/bin:/bin"})
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_file_the_jobs_user_cannot_read_is_named_with_its_mode_and_owner():
    """safetensors' save_file writes 0600: a model saved by root cannot be opened by the job's user, and safetensors
    then reports it as missing. The probe opens every file of the shared root and of the job's other inputs as that
    user and names the ones it may not read."""
    import os
    import shutil
    import tempfile

    if os.geteuid() != 0:
        raise AssertionError("this test switches to uid 65532: run the unit suite as root, as make test does")
    top = Path(tempfile.mkdtemp(prefix="trainyard-health-"))
    try:
        top.chmod(0o755)
        shared, data = top / "shared", top / "data"
        (shared / "tiny-llama").mkdir(parents=True)
        data.mkdir()
        (shared / "tiny-llama" / "config.json").write_text("{}")
        weights = shared / "tiny-llama" / "model.safetensors"
        os.close(os.open(weights, os.O_WRONLY | os.O_CREAT, 0o600))
        os.chmod(weights, 0o600)
        secret = data / "train.json"
        secret.write_text("[]")
        secret.chmod(0o600)
        out = _probe_as(65532, {"shared_root": str(shared), "inputs": [str(data), str(shared / "tiny-llama"), ""]})
        rec = out["shared_readable"]
        assert not ok(rec)
        assert rec["detail"].startswith("uid 65532:65532 cannot read 2 of 3 file(s)"), rec["detail"]
        assert f"{weights} (mode 0600, owner 0:0)" in rec["detail"]
        assert f"{secret} (mode 0600, owner 0:0)" in rec["detail"]
        weights.chmod(0o644)
        secret.chmod(0o644)
        rec = _probe_as(65532, {"shared_root": str(shared), "inputs": [str(data)]})["shared_readable"]
        assert ok(rec) and "can open every one of 3 file(s)" in rec["detail"], rec["detail"]
    finally:
        shutil.rmtree(top)


def test_the_walk_of_the_inputs_is_bounded(tmp_path: Path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("container_health_probe", PROBE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for i in range(30):
        (tmp_path / f"f{i}").write_text("x")
    monkeypatch.setattr(mod, "READ_MAX_FILES", 10)
    rec = mod.check_shared_readable(str(tmp_path))
    assert rec["ok"] and "the first 10" in rec["detail"], rec["detail"]
