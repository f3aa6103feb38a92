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
    r = subprocess.run([sys.executable, str(PROBE), json.dumps(params)], capture_output=True, text=True, timeout=120,
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
