"""job_reset's removal of /dev/shm and /tmp leftovers against a job that races it (issue 33 item 3): the leftover
directory swapped for a symlink to a FIFO (an open that follows it waits for a writer forever: reset.yml hung) or
to a host directory (whose files root would then remove)."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

from helpers import SymlinkSwapper, load

jr = load("library/job_reset.py", "job_reset_files_mod")


def returns_within(seconds, fn):
    box = {}

    def call():
        try:
            box["value"] = fn()
        except OSError as e:
            box["error"] = e

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "still running after %ss (blocked on what the job swapped in)" % seconds
    return box


def test_a_leftover_swapped_for_a_symlink_to_a_fifo_or_host_dir_is_removed_promptly_and_nothing_else(tmp_path: Path):
    shm, host = tmp_path / "shm", tmp_path / "host"
    shm.mkdir()
    host.mkdir()
    (host / "precious").write_text("keep\n")
    os.mkfifo(tmp_path / "fifo")
    rounds = 0
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        leftover = shm / "torch_123_abc"
        leftover.mkdir()
        (leftover / "seg").write_bytes(b"x" * 10)
        target = tmp_path / "fifo" if rounds % 2 else host
        with SymlinkSwapper(leftover, target):
            box = returns_within(5, lambda: jr.Reset.remove({"path": str(leftover)}))
        assert "error" in box or box["value"] in (0, 10)
        rounds += 1
        for p in (leftover, leftover.with_name(leftover.name + ".aside")):
            if p.is_symlink() or p.is_file():
                p.unlink()
            elif p.is_dir():
                jr.Reset.remove({"path": str(p)})
        assert (host / "precious").read_text() == "keep\n" and (tmp_path / "fifo").exists()
    assert rounds >= 5


def test_a_leftover_swapped_right_after_it_was_checked_is_removed_as_a_link_and_nothing_opened(tmp_path: Path,
                                                                                              monkeypatch):
    """The best-timed job: the directory becomes a symlink to a FIFO the moment after the host looked at it
    (every stat of that name swaps once). By path (lstat, then shutil.rmtree's lstat/open) reset waited on the
    FIFO forever; now the link is unlinked and the FIFO never opened."""
    shm = tmp_path / "shm"
    leftover = shm / "torch_9_x"
    leftover.mkdir(parents=True)
    (leftover / "seg").write_bytes(b"x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    real_stat, real_lstat, swapped = os.stat, os.lstat, []

    def swap_after(real):
        def wrapper(path, *a, **kw):
            st = real(path, *a, **kw)
            if not swapped and os.fspath(path).endswith("torch_9_x"):
                swapped.append(1)
                os.rename(leftover, shm / "aside")
                os.symlink(fifo, leftover)
            return st
        return wrapper

    monkeypatch.setattr(os, "stat", swap_after(real_stat))
    monkeypatch.setattr(os, "lstat", swap_after(real_lstat))
    box = returns_within(5, lambda: jr.Reset.remove({"path": str(leftover)}))
    monkeypatch.undo()
    assert swapped and box.get("value") == 0, box
    assert not os.path.lexists(leftover) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))


def test_removal_counts_bytes_and_removes_links_and_fifos_as_entries(tmp_path: Path):
    shm = tmp_path / "shm"
    (shm / "torch_1" / "sub").mkdir(parents=True)
    (shm / "torch_1" / "sub" / "a").write_bytes(b"x" * 100)
    os.mkfifo(shm / "torch_1" / "pipe")
    (shm / "torch_1" / "link").symlink_to(tmp_path)
    os.mkfifo(shm / "nccl-fifo")
    assert returns_within(5, lambda: jr.Reset.remove({"path": str(shm / "torch_1")}))["value"] == 100
    assert returns_within(5, lambda: jr.Reset.remove({"path": str(shm / "nccl-fifo")}))["value"] == 0
    assert os.listdir(shm) == [] and tmp_path.exists()


def test_a_leftover_over_the_entry_cap_is_refused_with_a_reason(tmp_path: Path, monkeypatch):
    shm = tmp_path / "shm"
    (shm / "torch_1").mkdir(parents=True)
    for i in range(30):
        (shm / "torch_1" / str(i)).write_bytes(b"")
    monkeypatch.setattr(jr.jt.Caps, "ENTRIES", 10)
    monkeypatch.setattr(jr.jt.remove_tree, "__defaults__", (10, jr.jt.Caps.DEPTH))
    box = returns_within(5, lambda: jr.Reset.remove({"path": str(shm / "torch_1")}))
    assert isinstance(box.get("error"), jr.jt.TreeError) and "entries" in str(box["error"])
