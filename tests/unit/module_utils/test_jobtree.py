"""The safe layer for job-writable trees (module_utils/jobtree.py) against a job that races it: symlinks at every
position, FIFOs and device nodes, depth bombs, hostile numbers and types, sparse terabyte files, truncation during a
read, and a directory swapped for a symlink while it is created and chmod-ed."""

from __future__ import annotations

import os
import stat
import threading
import time

import pytest

from helpers import SymlinkSwapper
from ansible_collections.trainyard.core.plugins.module_utils import jobtree as jt


@pytest.fixture
def tree(tmp_path):
    """root/a/b/f (a file), root/outside/secret (the host's), and a descriptor of root."""
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_bytes(b"hello")
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "f").write_bytes(b"host secret")
    (outside / "f").write_bytes(b"host secret")
    fd = jt.open_root(root)
    yield root, outside, fd
    os.close(fd)


def test_reads_and_lists_a_plain_tree(tree):
    root, _, fd = tree
    assert jt.read_bytes(fd, "a/b/f", 100) == b"hello"
    assert jt.read_bytes(fd, "a/b/f", 3) == b"hel"
    assert jt.read_bytes(fd, "a/b/f", 3, tail=True) == b"llo"
    assert jt.listdir(fd, "a") == [("b", "dir")]
    assert [(p, n) for p, n, _ in jt.walk(fd)] == [("a", "a"), ("a/b", "b"), ("a/b/f", "f")]


@pytest.mark.parametrize("rel", ["a", "a/b", "a/b/f"])
def test_a_symlink_at_every_position_is_refused(tree, rel):
    root, outside, fd = tree
    target = outside / rel.split("/", 1)[1] if "/" in rel else outside
    p = root / rel
    p.rename(p.with_name(p.name + ".aside"))
    p.symlink_to(target)
    with pytest.raises(jt.TreeError):
        jt.read_bytes(fd, "a/b/f", 100)
    if rel != "a/b/f":
        for call in (lambda: jt.listdir(fd, rel), lambda: jt.open_dir(fd, rel), lambda: list(jt.walk(fd, rel)),
                     lambda: jt.makedirs(fd, rel + "/new", 0o755), lambda: jt.tree_bytes(fd, rel)):
            with pytest.raises(jt.TreeError):
                call()
    assert not (outside / "new").exists() and not (outside / "b" / "new").exists()
    # A walk from the root lists the link as 'other' and never enters it.
    walked = {path: jt.kind_of(st) for path, _, st in jt.walk(fd)}
    assert walked[rel] == "other" and not any(k.startswith(rel + "/") for k in walked)


def test_the_trusted_roots_last_component_is_not_followed(tree, tmp_path):
    _, outside, _ = tree
    (tmp_path / "link").symlink_to(outside)
    with pytest.raises(jt.TreeError):
        jt.open_root(tmp_path / "link")


@pytest.mark.parametrize("rel", ["..", "a/../..", "/etc/passwd", "a//b", "a/./b", "", "a/b/"])
def test_escaping_or_empty_components_are_refused(tree, rel):
    _, _, fd = tree
    with pytest.raises(jt.TreeError):
        jt.read_bytes(fd, rel, 10)


def test_a_fifo_is_refused_and_never_opened(tree):
    """A writer blocks on the FIFO until someone opens it for reading: it stays blocked, so the layer never
    opened it (and returned at once, not waiting for a writer either)."""
    root, _, fd = tree
    fifo = root / "a" / "pipe"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer():
        w = os.open(fifo, os.O_WRONLY)
        opened.set()
        os.close(w)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    start = time.monotonic()
    for call in (lambda: jt.open_file(fd, "a/pipe"), lambda: jt.read_json(fd, "a/pipe")):
        with pytest.raises(jt.TreeError, match="not a regular file"):
            call()
    assert time.monotonic() - start < 2
    assert not opened.wait(0.3), "the FIFO was opened"
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # let the writer go
    t.join(5)


def test_a_device_node_is_refused(tree):
    root, _, fd = tree
    null = os.stat("/dev/null")
    os.mknod(root / "a" / "watchdog", 0o600 | stat.S_IFCHR, null.st_rdev)
    with pytest.raises(jt.TreeError, match="not a regular file"):
        jt.read_bytes(fd, "a/watchdog", 10)
    assert ("watchdog", "other") in jt.listdir(fd, "a")


def test_a_depth_bomb_is_refused_without_recursion_error():
    for doc in ("[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000, "[" * 100_000):
        with pytest.raises(jt.BadRecord, match="deeper"):
            jt.loads_bounded(doc)
    # Brackets inside strings (escaped quotes included) are text, not nesting.
    assert jt.loads_bounded('["[[[[\\"[[[[", 1]', max_depth=1) == ['[[[[\"[[[[', 1]
    assert jt.loads_bounded("[[1]]", max_depth=2) == [[1]]
    with pytest.raises(ValueError):
        jt.loads_bounded("[[[1]]]", max_depth=2)


@pytest.mark.parametrize("doc", ["1e999", "-1e999", '{"loss": NaN}', "[Infinity]", "-Infinity", "[1,", "{'a': 1}",
                                 b"\xff\xfe", "[1] 2"])
def test_hostile_numbers_and_malformed_text_are_refused(doc):
    with pytest.raises(jt.BadRecord):
        jt.loads_bounded(doc)


def test_wrong_types_are_refused_with_the_key_named():
    schema = {"step": int, "loss": (int, float), "pg_config": dict}
    assert jt.loads_bounded('{"step": 3, "loss": 1.5, "other": "x"}', expect=schema)["step"] == 3
    for doc, key in (('{"step": "x"}', "step"), ('{"step": true}', "step"), ('{"pg_config": 5}', "pg_config"),
                     ('{"loss": "1"}', "loss")):
        with pytest.raises(jt.BadRecord, match=key):
            jt.loads_bounded(doc, expect=schema)
    for doc in ("[1]", "5", "null"):
        with pytest.raises(jt.BadRecord, match="object"):
            jt.loads_bounded(doc, expect=schema)
    with pytest.raises(jt.BadRecord, match="step"):
        jt.loads_bounded("{}", expect=schema, required=("step",))
    assert jt.loads_bounded("[1]", expect=list) == [1]
    with pytest.raises(jt.BadRecord):
        jt.loads_bounded('"x"', expect=(list, dict))


def test_a_sparse_terabyte_file_is_capped(tree):
    root, _, fd = tree
    big = root / "a" / "huge.json"
    with open(big, "wb") as f:
        f.write(b'{"a": 1}')
    os.truncate(big, 1 << 40)
    assert len(jt.read_bytes(fd, "a/huge.json", 1 << 20)) == 1 << 20
    assert jt.read_bytes(fd, "a/huge.json", 16, tail=True) == b"\0" * 16
    with pytest.raises(jt.BadRecord, match="bytes"):
        jt.read_json(fd, "a/huge.json")
    alloc, size, files = jt.tree_usage(fd, "a")
    assert size >= 1 << 40 and alloc < 1 << 30 and files == 2
    assert jt.tree_bytes(fd, "a") >= 1 << 40


def test_a_file_truncated_during_the_read_gives_a_short_read(tree, monkeypatch):
    root, _, fd = tree
    p = root / "a" / "grows"
    p.write_bytes(b"x" * (3 * jt.Caps.READ_CHUNK))
    real = os.preadv
    calls = []

    def preadv(f, bufs, pos):  # the kernel may return less than asked: one chunk a call, truncated after the first
        calls.append(pos)
        if len(calls) == 2:
            os.truncate(p, jt.Caps.READ_CHUNK + 10)
        return real(f, [bufs[0][:jt.Caps.READ_CHUNK]], pos)

    monkeypatch.setattr(os, "preadv", preadv)
    assert len(jt.read_bytes(fd, "a/grows", 10 * jt.Caps.READ_CHUNK)) == jt.Caps.READ_CHUNK + 10
    os.truncate(p, 5)
    assert jt.read_bytes(fd, "a/grows", 100, tail=True) == b"xxxxx"


def test_listing_walk_and_removal_are_capped(tree):
    root, _, fd = tree
    for i in range(20):
        (root / "a" / ("n%d" % i)).write_bytes(b"")
    with pytest.raises(jt.TreeError, match="entries"):
        jt.listdir(fd, "a", max_entries=10)
    with pytest.raises(jt.TreeError, match="entries"):
        list(jt.walk(fd, ".", max_entries=10))
    deep = root / "d"
    (deep / "/".join(["x"] * 10)).mkdir(parents=True)
    with pytest.raises(jt.TreeError, match="deeper"):
        list(jt.walk(fd, "d", max_depth=5))
    with pytest.raises(jt.TreeError):
        jt.remove_tree(fd, "a", max_entries=10)
    assert jt.remove_tree(fd, "d") == {"files": 0, "dirs": 11, "bytes": 0}


def test_remove_tree_unlinks_links_and_fifos_without_following_or_opening(tree):
    root, outside, fd = tree
    os.mkfifo(root / "a" / "b" / "pipe")
    (root / "a" / "b" / "link").symlink_to(outside)
    (root / "a" / "dirlink").symlink_to(outside / "b")
    os.mknod(root / "a" / "dev", 0o600 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)
    assert jt.remove_tree(fd, "a") == {"files": 5, "dirs": 2, "bytes": 5}
    assert not (root / "a").exists()
    assert (outside / "b" / "f").read_bytes() == b"host secret" and (outside / "f").exists()
    assert jt.remove_tree(fd, "absent") == {"files": 0, "dirs": 0, "bytes": 0}
    os.mkfifo(root / "p")
    assert jt.remove_tree(fd, "p") == {"files": 1, "dirs": 0, "bytes": 0}


def test_write_file_replaces_a_planted_symlink_without_reading_or_writing_through_it(tree):
    root, outside, fd = tree
    b = jt.open_dir(fd, "a/b")
    try:
        (root / "a" / "b" / "g").symlink_to(outside / "f")
        assert jt.write_file(b, "g", b"new", 0o640) is True
        assert (outside / "f").read_bytes() == b"host secret"
        g = root / "a" / "b" / "g"
        assert not g.is_symlink() and g.read_bytes() == b"new" and stat.S_IMODE(g.stat().st_mode) == 0o640
        assert jt.write_file(b, "g", b"new", 0o640) is False
        assert jt.write_file(b, "g", b"new", 0o644) is True
        assert stat.S_IMODE(g.stat().st_mode) == 0o644
        assert sorted(os.listdir(root / "a" / "b")) == ["f", "g"]
        with pytest.raises(jt.TreeError):
            jt.write_file(b, "../x", b"")
        os.mkdir(root / "a" / "b" / "d")
        with pytest.raises(jt.TreeError):
            jt.write_file(b, "d", b"")
    finally:
        os.close(b)


def test_mkdir_sets_the_mode_on_its_descriptor_and_checks_the_owner(tree):
    root, _, fd = tree
    d, created = jt.mkdir(fd, "progress", 0o1777)
    os.close(d)
    assert created and stat.S_IMODE((root / "progress").stat().st_mode) == 0o1777
    os.chmod(root / "progress", 0o755)
    d, created = jt.mkdir(fd, "progress", 0o1777)
    os.close(d)
    assert not created and stat.S_IMODE((root / "progress").stat().st_mode) == 0o755  # an existing one is kept
    d, created = jt.mkdir(fd, "progress", 0o1777, enforce_mode=True)
    os.close(d)
    assert not created and stat.S_IMODE((root / "progress").stat().st_mode) == 0o1777
    with pytest.raises(jt.TreeError, match="owned"):
        jt.mkdir(fd, "progress", 0o1777, owner=os.geteuid() + 1)
    d, made = jt.makedirs(fd, "x/y/z", 0o750)
    os.close(d)
    assert made == ["x", "y", "z"] and stat.S_IMODE((root / "x" / "y").stat().st_mode) == 0o750


def test_a_directory_swapped_for_a_symlink_during_mkdir_never_changes_the_targets_mode(tmp_path):
    """The job swaps the new directory for a symlink to a canary in a tight loop while the host creates and
    chmods it 1777, many times: the canary's mode never changes (by path, the host loses within a second)."""
    base, canary = tmp_path / "job-rw", tmp_path / "canary"
    base.mkdir()
    canary.mkdir(mode=0o700)
    os.chmod(canary, 0o700)
    fd = jt.open_root(base)
    refused = made = 0
    deadline = time.monotonic() + 3
    try:
        with SymlinkSwapper(base / "progress", canary):
            while time.monotonic() < deadline:
                try:
                    d, _ = jt.mkdir(fd, "progress", 0o1777)
                    os.close(d)
                    made += 1
                except (jt.TreeError, FileNotFoundError):
                    refused += 1
                assert stat.S_IMODE(os.stat(canary).st_mode) == 0o700
    finally:
        os.close(fd)
    assert made + refused > 50
