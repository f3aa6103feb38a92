"""library/job_files.py run by the real `ansible` (local connection) on a temporary tree: directories and files in
one call, left alone when converged, mode-only changes, links, check mode, diff mode, bad input named."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path

from helpers import adhoc

def run(args: dict, *flags: str) -> dict:
    return adhoc("job_files", args, *flags)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_writes_then_leaves_alone_then_fixes_content_and_mode(tmp_path: Path):
    d = tmp_path / "state" / "train"
    args = {"directories": [{"path": str(d), "mode": "0750"}],
            "files": [{"path": str(d / "nccl.env"), "content": "NCCL_DEBUG=WARN\nNODE_RANK=0\n", "mode": "0640"},
                      {"path": str(d / "ds_config.json"), "content": "{}\n"}],
            "return_content": True}
    r = run(args)
    assert r["changed"] and [f["changed"] for f in r["files"]] == [True, True], r
    assert (d / "nccl.env").read_text() == "NCCL_DEBUG=WARN\nNODE_RANK=0\n"
    assert mode(d) == 0o750 and mode(d / "nccl.env") == 0o640 and mode(d / "ds_config.json") == 0o644
    f0 = r["files"][0]
    assert base64.b64decode(f0["content"]) == (d / "nccl.env").read_bytes()
    assert f0["checksum"] == hashlib.sha256((d / "nccl.env").read_bytes()).hexdigest()
    assert not list(d.glob(".*"))  # no temporary file left behind

    again = run(args)
    assert not again["changed"] and not any(f["changed"] for f in again["files"]), again
    assert not again["directories"][0]["changed"]

    # Someone edited the file and its mode: both come back, and the diff shows the edit.
    (d / "nccl.env").write_text("NCCL_DEBUG=INFO\n")
    os.chmod(d / "ds_config.json", 0o600)
    fixed = run(args, "--diff")
    assert [f["changed"] for f in fixed["files"]] == [True, True]
    assert (d / "nccl.env").read_text() == "NCCL_DEBUG=WARN\nNODE_RANK=0\n" and mode(d / "ds_config.json") == 0o644
    assert fixed["diff"][0]["before"] == "NCCL_DEBUG=INFO\n"


def test_check_mode_writes_nothing_and_returns_what_is_on_disk(tmp_path: Path):
    f = tmp_path / "nccl.env"
    f.write_text("OLD=1\n")
    r = run({"files": [{"path": str(f), "content": "NEW=1\n"}], "return_content": True}, "--check")
    assert r["changed"] and f.read_text() == "OLD=1\n"
    assert base64.b64decode(r["files"][0]["content"]) == b"OLD=1\n"
    missing = tmp_path / "new" / "x"
    r = run({"directories": [{"path": str(missing.parent)}], "files": [{"path": str(missing), "content": "x"}]},
            "--check")
    assert r["changed"] and not missing.parent.exists() and "checksum" not in r["files"][0]


def test_bad_input_is_named(tmp_path: Path):
    r = run({"files": [{"path": "relative/nccl.env", "content": "x"}]})
    assert r["failed"] and "files[0]: path must be an absolute path" in r["msg"]
    r = run({"files": [{"path": str(tmp_path / "a"), "content": "x", "mode": "rw-r--r--"}]})
    assert r["failed"] and "not an octal number" in r["msg"]
    r = run({"files": [{"path": str(tmp_path / "nodir" / "a"), "content": "x"}]})
    assert r["failed"] and "list it in directories" in r["msg"]
    (tmp_path / "file").write_text("x")
    r = run({"directories": [{"path": str(tmp_path / "file")}]})
    assert r["failed"] and "is not a directory" in r["msg"]


def test_directory_without_mode_is_created_and_an_existing_one_keeps_its_mode(tmp_path: Path):
    shared = tmp_path / "code"
    shared.mkdir()
    shared.chmod(0o2775)
    new = tmp_path / "new" / "code"
    r = run({"directories": [{"path": str(shared)}, {"path": str(new)}]})
    assert not r.get("failed"), r
    assert [d["changed"] for d in r["directories"]] == [False, True]
    assert mode(shared) == 0o2775 and mode(new) == 0o755
    assert run({"directories": [{"path": str(shared)}, {"path": str(new)}]})["changed"] is False


def test_links_are_pointed_once_and_replaced_atomically_but_never_over_a_file(tmp_path: Path):
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    (runs / "b").mkdir()
    latest = runs / "latest"
    r = run({"links": [{"path": str(latest), "target": "a"}]})
    assert r["changed"] and r["links"] == [{"path": str(latest), "changed": True}] and os.readlink(latest) == "a"
    assert run({"links": [{"path": str(latest), "target": "a"}]})["changed"] is False
    r = run({"links": [{"path": str(latest), "target": "b"}]}, "--check")
    assert r["changed"] and os.readlink(latest) == "a"  # check mode points nothing
    assert run({"links": [{"path": str(latest), "target": "b"}]})["changed"] and os.readlink(latest) == "b"
    assert sorted(p.name for p in runs.iterdir()) == ["a", "b", "latest"]  # no temporary link left behind
    (runs / "plain").write_text("x")
    r = run({"links": [{"path": str(runs / "plain"), "target": "a"}]})
    assert r["failed"] and "is not a symbolic link" in r["msg"] and (runs / "plain").read_text() == "x"
    r = run({"links": [{"path": "latest", "target": "a"}]})
    assert r["failed"] and "links[0]: path must be an absolute path" in r["msg"]


def test_an_existing_directory_never_has_its_mode_changed_unless_it_is_enforced_by_name(tmp_path: Path):
    """A directory the module did not create (a system directory, a shared scratch space) keeps its mode, whatever
    mode the entry asks for; the result says the mode was kept. Only enforce_mode (a directory the product owns by
    name) sets the mode of an existing one."""
    sticky = tmp_path / "scratch"
    sticky.mkdir()
    sticky.chmod(0o1777)
    r = run({"directories": [{"path": str(sticky), "mode": "0755"}]})
    assert not r["changed"] and mode(sticky) == 0o1777, r
    assert r["directories"][0]["mode_kept"] == "1777"
    r = run({"directories": [{"path": str(sticky), "mode": "0755"}]}, "--check")
    assert not r["changed"]
    own = tmp_path / "state"
    own.mkdir()
    own.chmod(0o777)
    r = run({"directories": [{"path": str(own), "mode": "0750", "enforce_mode": True}]})
    assert r["changed"] and mode(own) == 0o750
    new = tmp_path / "new" / "dir"
    r = run({"directories": [{"path": str(new), "mode": "0700"}]})
    assert r["changed"] and mode(new) == 0o700 and r["directories"][0]["created"]


def test_refuse_touches_nothing_and_glob_read_probe_in_the_same_call(tmp_path: Path):
    d = tmp_path / "job"
    r = run({"directories": [{"path": str(d)}], "files": [{"path": str(d / "x"), "content": "x"}],
             "refuse": ["node1: LoRA under ZeRO-3 would save an empty adapter", "second reason"]})
    assert r["failed"] and r["msg"] == "node1: LoRA under ZeRO-3 would save an empty adapter\nsecond reason", r
    assert not d.exists()
    (tmp_path / "net" / "eth1").mkdir(parents=True)
    (tmp_path / "net" / "lo").mkdir()
    (tmp_path / "ib" / "mlx5_0" / "ports" / "1").mkdir(parents=True)
    (tmp_path / "ib" / "mlx5_0" / "ports" / "1" / "link_layer").write_text("InfiniBand\n")
    r = run({"glob": [str(tmp_path / "net" / "*"), str(tmp_path / "none" / "*")],
             "read": [str(tmp_path / "ib" / "*" / "ports" / "1" / "link_layer"), str(tmp_path / "missing")]})
    assert not r["changed"]
    assert r["globbed"] == {str(tmp_path / "net" / "*"): [str(tmp_path / "net" / "eth1"), str(tmp_path / "net" / "lo")],
                            str(tmp_path / "none" / "*"): []}
    assert {k: base64.b64decode(v) for k, v in r["read"].items()} == {
        str(tmp_path / "ib" / "mlx5_0" / "ports" / "1" / "link_layer"): b"InfiniBand\n"}


def test_read_returns_regular_files_only_and_follows_no_link_at_the_end(tmp_path: Path):
    secret = tmp_path / "root-only"
    secret.write_text("secret\n")
    (tmp_path / "job-ro").mkdir()
    (tmp_path / "job-ro" / "nccl.env").symlink_to(secret)
    (tmp_path / "job-ro" / "ds_config.json").write_text("{}\n")
    (tmp_path / "job-ro" / "subdir").mkdir()
    r = run({"read": [str(tmp_path / "job-ro" / "*")]})
    assert not r.get("failed"), r
    assert {k: base64.b64decode(v) for k, v in r["read"].items()} == {str(tmp_path / "job-ro" / "ds_config.json"): b"{}\n"}


def test_latest_checkpoint_is_the_newest_complete_one_and_never_behind_a_link(tmp_path: Path):
    out = tmp_path / "outputs"
    for step, complete in ((100, True), (200, True), (300, False)):  # 300: a save cut short (no marker)
        (out / f"checkpoint-{step}").mkdir(parents=True)
        if complete:
            (out / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere" / "checkpoint-900"
    elsewhere.mkdir(parents=True)
    (elsewhere / "trainer_state.json").write_text("{}")
    (out / "checkpoint-900").symlink_to(elsewhere)  # planted by the job: never followed
    for flags in ((), ("--check",)):
        r = run({"latest_checkpoint": str(out)}, *flags)
        assert not r.get("failed") and r["latest_checkpoint"] == str(out / "checkpoint-200"), r
    assert run({"latest_checkpoint": str(tmp_path / "none")})["latest_checkpoint"] == ""
    assert "latest_checkpoint" not in run({})
