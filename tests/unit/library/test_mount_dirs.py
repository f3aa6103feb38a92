"""library/mount_dirs.py run by the real `ansible` (local connection, as root) on a temporary tree: the container
role's mount sources created as mkdir -p would, the writable ones given to the job's uid:gid (top directory only,
never through a link), the job's read-only directory given the job's group; converged: changed false; check mode
changes nothing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from helpers import adhoc

JOB = (65532, 65533)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives directories to another uid: needs root")


def run(args: dict, *flags: str) -> dict:
    return adhoc("mount_dirs", args, *flags)


def owner(path: Path) -> tuple:
    st = os.lstat(path)
    return st.st_uid, st.st_gid


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def job_args(tmp: Path, **more) -> dict:
    out, code, ro = tmp / "srv" / "outputs", tmp / "srv" / "code", tmp / "state" / "train" / "job-ro"
    args = {"directories": [str(out), str(code), str(ro)], "writable": [str(out), str(code)],
            "uid": JOB[0], "gid": JOB[1], "group_dir": str(ro)}
    args.update(more)
    return args


def test_creates_gives_and_groups_then_changes_nothing(tmp_path: Path):
    r = run(job_args(tmp_path))
    assert r["changed"] and not r.get("failed"), r
    out, code, ro = tmp_path / "srv" / "outputs", tmp_path / "srv" / "code", tmp_path / "state" / "train" / "job-ro"
    assert owner(out) == JOB and owner(code) == JOB and mode(out) == 0o755
    assert owner(tmp_path / "srv") == (0, 0) and mode(tmp_path / "srv") == 0o755  # a parent: root's, not given
    assert owner(ro) == (0, JOB[1]) and mode(ro) == 0o755  # g+rx, no group write
    assert sorted(r["given"]) == sorted([str(out), str(code)]) and str(ro) in r["created"]
    again = run(job_args(tmp_path))
    assert not again["changed"] and again["created"] == [] and again["given"] == [], again
    assert not again["group_dir"]["changed"]


def test_leaves_other_owners_writable_and_nested_sources(tmp_path: Path):
    shared, sticky, nested = tmp_path / "shared", tmp_path / "tmp1777", tmp_path / "srv" / "outputs" / "cache"
    shared.mkdir()
    os.chown(shared, 1234, 1234)
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    nested.mkdir(parents=True)  # root's 0755, below another writable source: left
    outputs = nested.parent
    group = tmp_path / "grp"  # root's, writable through the job's group: left
    group.mkdir()
    os.chown(group, 0, JOB[1])
    os.chmod(group, 0o775)
    args = {"directories": [str(shared), str(sticky), str(nested)],
            "writable": [str(shared), str(sticky), str(outputs), str(nested), str(group)], "uid": JOB[0],
            "gid": JOB[1]}
    r = run(args)
    assert r["given"] == [str(outputs)], r
    assert owner(shared) == (1234, 1234) and owner(sticky) == (0, 0) and owner(nested) == (0, 0)
    assert owner(outputs) == JOB and owner(group) == (0, JOB[1])
    assert set(r["left"]) == {str(shared), str(sticky), str(nested), str(group)}, r["left"]


def test_a_symlinked_source_is_never_followed(tmp_path: Path):
    victim = tmp_path / "etc-like"
    victim.mkdir()
    link = tmp_path / "outputs"
    link.symlink_to(victim)
    r = run({"directories": [str(link)], "writable": [str(link)], "uid": JOB[0], "gid": JOB[1]})
    assert not r["changed"] and r["given"] == [], r
    assert owner(victim) == (0, 0) and os.path.islink(link)
    assert "symbolic link" in r["left"][str(link)]


def test_a_link_below_a_writable_source_is_refused_not_followed(tmp_path: Path):
    outputs, elsewhere = tmp_path / "outputs", tmp_path / "elsewhere"
    outputs.mkdir()
    elsewhere.mkdir()
    (outputs / "cache").symlink_to(elsewhere)  # the job swapped a directory for a link
    r = run({"directories": [str(outputs), str(outputs / "cache" / "new")], "writable": [str(outputs)]})
    assert r.get("failed") and "symbolic link" in r["msg"] and "Traceback" not in r["msg"], r
    assert not (elsewhere / "new").exists()


def test_a_link_where_the_read_only_directory_belongs_is_refused(tmp_path: Path):
    target = tmp_path / "target"
    target.mkdir()
    ro = tmp_path / "job-ro"
    ro.symlink_to(target)
    r = run({"group_dir": str(ro), "uid": JOB[0], "gid": JOB[1]})
    assert r.get("failed") and "symbolic link" in r["msg"], r
    assert owner(target) == (0, 0)


def test_check_mode_changes_nothing_and_says_what_would(tmp_path: Path):
    r = run(job_args(tmp_path), "--check")
    assert r["changed"] and not (tmp_path / "srv").exists() and not (tmp_path / "state").exists(), r
    assert sorted(r["given"]) == sorted([str(tmp_path / "srv" / "outputs"), str(tmp_path / "srv" / "code")])
    run(job_args(tmp_path))
    assert not run(job_args(tmp_path), "--check")["changed"]


def test_root_job_gives_nothing(tmp_path: Path):
    out = tmp_path / "outputs"
    r = run({"directories": [str(out)], "writable": [str(out)], "group_dir": str(out)})
    assert r["changed"] and r["given"] == [] and r["group_dir"] is None and owner(out) == (0, 0), r


def test_bad_input_is_one_line(tmp_path: Path):
    r = run({"directories": [str(tmp_path / "a" / ".." / "b")]})
    assert r.get("failed") and "'..'" in r["msg"] and "\n" not in r["msg"], r
    f = tmp_path / "file"
    f.write_text("x")
    r = run({"directories": [str(f)]})
    assert r.get("failed") and "not a directory" in r["msg"], r
