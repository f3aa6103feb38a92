"""action_plugins/container_start.py: the container role's directories and the start of the training container in one
task per node, run by the real `ansible` on this machine: a failure of the directories fails the task and starts
nothing, a failed start is the result's (the role's container.running records it), never the task's."""

from __future__ import annotations

from pathlib import Path

from helpers import adhoc

# A start that docker_container refuses before it talks to any engine or registry (its argument spec).
REFUSED_START = {"name": "trainyard-absent", "image": "trainyard/absent:0", "state": "no-such-state"}


def test_the_directories_then_no_start_without_the_image(tmp_path: Path):
    out = tmp_path / "outputs"
    r = adhoc("container_start", {"dirs": {"directories": [str(out)], "writable": [str(out)]}, "start": False,
                                  "container": REFUSED_START})
    assert not r.get("failed") and r["changed"] is True and out.is_dir(), r
    assert r["dirs"]["changed"] is True and "start_failed" not in r and "container" not in r, r
    again = adhoc("container_start", {"dirs": {"directories": [str(out)], "writable": [str(out)]}, "start": False,
                                      "container": REFUSED_START})
    assert again["changed"] is False, again


def test_a_failed_start_is_the_result_s_not_the_task_s(tmp_path: Path):
    r = adhoc("container_start", {"dirs": {"directories": [str(tmp_path / "o")]}, "container": REFUSED_START})
    assert not r.get("failed") and r["start_failed"] is True and r.get("msg"), r
    assert (tmp_path / "o").is_dir()


def test_a_failure_of_the_directories_fails_the_task_and_starts_nothing(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    r = adhoc("container_start", {"dirs": {"directories": [str(tmp_path / "file" / "below")]},
                                  "container": REFUSED_START})
    assert r.get("failed") and r["msg"] and "start_failed" not in r, r


def test_with_read_a_start_that_gave_no_container_reads_the_one_the_node_has(tmp_path: Path):
    # The role's container.running check compares the container as the engine has it (no read task of its own).
    args = {"dirs": {"directories": [str(tmp_path / "o")]}, "start": False, "container": REFUSED_START}
    assert "info" not in adhoc("container_start", args)
    r = adhoc("container_start", dict(args, read=True))
    assert not r.get("failed") and isinstance(r.get("info"), dict) and "invocation" not in r["info"], r
    assert "exists" in r["info"] or r["info"].get("failed"), r
    (tmp_path / "file").write_text("x")
    failed = adhoc("container_start", {"dirs": {"directories": [str(tmp_path / "file" / "below")]}, "read": True,
                                       "container": REFUSED_START})
    assert failed.get("failed") and "info" not in failed, failed
