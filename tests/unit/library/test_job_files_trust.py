"""library/job_files.py against a job that races it in the trees it can write (issue 33 items 1, 2, 8): the new
directory swapped for a symlink between its creation and its chmod, a symlink planted where a code file is written,
a FIFO or device node where a file is read back."""

from __future__ import annotations

import base64
import os
import stat
import threading
import time
from pathlib import Path

from helpers import SymlinkSwapper, adhoc, load

jf = load("library/job_files.py", "job_files")


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_job_rw_directory_swapped_for_a_symlink_never_chmods_the_target(tmp_path: Path):
    """Item 1: while job_files creates job-rw/progress (1777), the job swaps it for a symlink to a canary (a host
    directory such as /etc/cron.d) in a tight loop. By path (mkdir, then chmod) root lost within a few seconds on
    this machine; through descriptors the canary keeps its mode for the whole run."""
    rw, canary = tmp_path / "state" / "job" / "job-rw", tmp_path / "canary"
    rw.mkdir(parents=True)
    canary.mkdir()
    os.chmod(canary, 0o700)
    new = rw / "progress"
    runs = 0
    deadline = time.monotonic() + 6
    with SymlinkSwapper(new, canary):
        while time.monotonic() < deadline:
            tree = jf.Tree([str(rw)])
            try:
                jf.ensure_dir(tree, str(new), 0o1777, False)
            except OSError:
                pass  # refused: a symlink where the directory belongs
            finally:
                tree.close()
            runs += 1
            assert mode(canary) == 0o700, "root chmod-ed the symlink's target after %d runs" % runs
    assert runs > 50


def test_a_symlink_planted_at_a_code_file_is_neither_read_into_the_diff_nor_written_through(tmp_path: Path):
    """Item 2: the job points <code>/ddp_train.py at a host file; --check --diff showed that file's content in the
    plan, and the write's chmod by path could land on it. Now the link is replaced and never read."""
    code, secret = tmp_path / "code", tmp_path / "host-secret"
    code.mkdir()
    secret.write_text("root:$6$hash:19000::::::\n")
    os.chmod(secret, 0o600)
    (code / "ddp_train.py").symlink_to(secret)
    args = {"roots": [str(code)], "directories": [{"path": str(code)}],
            "files": [{"path": str(code / "ddp_train.py"), "content": "print('train')\n", "mode": "0644"}],
            "return_content": True}
    r = adhoc("job_files", args, "--check", "--diff")
    assert r["changed"] and not r.get("failed"), r
    assert "hash" not in str(r.get("diff")) and "content" not in r["files"][0], r
    r = adhoc("job_files", args)
    assert r["changed"] and not r.get("failed"), r
    assert secret.read_text() == "root:$6$hash:19000::::::\n" and mode(secret) == 0o600
    assert not (code / "ddp_train.py").is_symlink() and (code / "ddp_train.py").read_text() == "print('train')\n"
    assert sorted(os.listdir(code)) == ["ddp_train.py"]


def test_a_directory_below_a_root_swapped_for_a_symlink_is_refused_not_followed(tmp_path: Path):
    code, elsewhere = tmp_path / "code", tmp_path / "etc"
    (code / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (code / "sub").rmdir()
    (code / "sub").symlink_to(elsewhere)
    r = adhoc("job_files", {"roots": [str(code)], "directories": [{"path": str(code / "sub"), "mode": "0777"}],
                            "files": [{"path": str(code / "sub" / "x.py"), "content": "x"}]})
    assert r["failed"] and "not a directory" in r["msg"], r
    assert mode(elsewhere) != 0o777 and not (elsewhere / "x.py").exists()
    r = adhoc("job_files", {"roots": [str(code)], "files": [{"path": str(code / "sub" / "x.py"), "content": "x"}]})
    assert r["failed"] and not (elsewhere / "x.py").exists(), r


def test_read_never_opens_a_fifo_or_device_swapped_in(tmp_path: Path):
    """Item 8: a file read back (option read) swapped for a FIFO or a device node between the listing and the
    open: never opened (an O_RDONLY open of a FIFO waits for a writer forever), each call returns at once."""
    d = tmp_path / "job-rw"
    d.mkdir()
    f = d / "torchrun.log"
    stop = threading.Event()
    null = os.stat("/dev/null").st_rdev

    def job():
        i = 0
        while not stop.is_set():
            i += 1
            try:
                os.unlink(f)
            except OSError:
                pass
            try:
                if i % 3 == 0:
                    os.mkfifo(f)
                elif i % 3 == 1:
                    os.mknod(f, 0o600 | stat.S_IFCHR, null)
                else:
                    f.write_bytes(b"log\n")
            except OSError:
                pass

    t = threading.Thread(target=job, daemon=True)
    t.start()
    seen = set()
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            tree = jf.Tree([str(d)])
            box = {}
            reader = threading.Thread(target=lambda: box.update(r=jf.read_small(tree, str(f))), daemon=True)
            reader.start()
            reader.join(2)
            tree.close()
            assert not reader.is_alive(), "read_small blocked on what the job swapped in"
            data, why = box["r"]
            assert data in (None, b"log\n", b"", b"l", b"lo", b"log")
            seen.add(why)
    finally:
        stop.set()
        t.join(5)
    assert any(w and "regular" in w for w in seen), seen


def test_read_option_lists_what_it_refused(tmp_path: Path):
    d = tmp_path / "job-ro"
    d.mkdir()
    os.mkfifo(d / "pipe")
    (d / "ok.json").write_text("{}\n")
    r = adhoc("job_files", {"read": [str(d / "*")]})
    assert {k: base64.b64decode(v) for k, v in r["read"].items()} == {str(d / "ok.json"): b"{}\n"}
    assert "regular" in r["read_skipped"][str(d / "pipe")], r


def test_a_path_with_dotdot_is_refused(tmp_path: Path):
    r = adhoc("job_files", {"directories": [{"path": str(tmp_path / "a" / ".." / "b")}]})
    assert r["failed"] and "'..'" in r["msg"], r


def test_a_root_the_host_made_as_a_symlink_is_used_and_a_symlink_elsewhere_is_named(tmp_path: Path):
    """The user's output root may be a symlink they made (/srv/outputs -> /mnt/nvme/outputs): listed in roots it
    is opened as the host made it. Anywhere else a symlink where a directory belongs is refused with the fix."""
    real = tmp_path / "nvme" / "outputs"
    real.mkdir(parents=True)
    link = tmp_path / "outputs"
    link.symlink_to(real)
    tree = jf.Tree([str(link)])
    try:
        assert jf.ensure_dir(tree, str(link), 0o755, False)[0] in (True, False)
        assert jf.ensure_dir(tree, str(link / "run"), 0o750, False) == (True, True, None)
        assert jf.write_file(tree, str(link / "run" / "x"), b"x", 0o644, False)[0]
    finally:
        tree.close()
    assert (real / "run" / "x").read_bytes() == b"x" and mode(real / "run") == 0o750
    tree = jf.Tree([])
    try:
        jf.ensure_dir(tree, str(link), 0o755, False)
    except OSError as e:
        assert "symbolic link" in str(e) and "roots" in str(e)
    else:
        raise AssertionError("a symlink outside roots was followed")
    finally:
        tree.close()
