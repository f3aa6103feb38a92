# -*- coding: utf-8 -*-
"""Move checkpoint files between nodes without following a link the job planted (playbooks/recover.yml).

The training job writes the checkpoint tree and is not trusted; recover copies shards (and the converted
checkpoint) between nodes as root. ``pack`` reads the named files (or directory trees) of one node's checkpoint into
a tar in a fresh private directory, and ``unpack`` writes such a tar into another node's copy of the checkpoint.
Both walk the job-writable tree one component at a time from a descriptor of the trusted parent directory, with
``O_NOFOLLOW`` (``O_DIRECTORY`` for directories): a symbolic link anywhere below the output root, the checkpoint
directory itself included, stops the copy with a one-line error naming it, and nothing is read or written through
it. ``unpack`` writes every file into a fresh temporary file (``O_CREAT|O_EXCL|O_NOFOLLOW``) then renames it over
the name (a link there is replaced, never followed), and takes regular files and directories only from the tar.
Stdlib only; unit-tested in tests/unit/module_utils/test_recover_nofollow.py against real directory trees.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile

from ansible_collections.trainyard.core.plugins.module_utils import jobtree
from ansible_collections.trainyard.core.plugins.module_utils.checkpoints import walk_dirs, write_file_at

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 20


class TransferError(Exception):
    """str() is the one-line message for the user."""


def _parts(rel):
    parts = [p for p in str(rel).split("/") if p not in ("", ".")]
    if not parts or str(rel).startswith("/") or ".." in parts:
        raise TransferError("%r is not a path inside the checkpoint (relative, no '..')" % (rel,))
    return parts


def _open_dir_at(dir_fd, name, where, create=False, mode=0o755):
    """A descriptor of dir_fd/name, never through a link; created (owned like dir_fd's directory) with create."""
    made = False
    if create:
        try:
            os.mkdir(name, mode, dir_fd=dir_fd)
            made = True
        except FileExistsError:
            pass
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
        if made and os.geteuid() == 0:
            st = os.fstat(dir_fd)
            os.fchown(fd, st.st_uid, st.st_gid)
        return fd
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise TransferError("%s is a symbolic link or not a directory: recover follows no link in the "
                                "checkpoint tree (the job wrote it). Fix: remove it and rerun" % where)
        if e.errno == errno.ENOENT:
            raise TransferError("%s is missing" % where)
        raise TransferError("%s: %s" % (where, e.strerror))


def open_checkpoint(parent, name, create=False):
    """A descriptor of parent/name: parent (the output root, from the inventory) is trusted, name is not followed
    when it is a link."""
    try:
        pfd = jobtree.open_root(parent)  # its parents are the host's; a link as the root itself is refused
    except OSError as e:
        raise TransferError("%s: %s" % (parent, e.strerror))
    try:
        if "/" in str(name) or str(name) in ("", ".", ".."):
            raise TransferError("%r is not a checkpoint directory name (checkpoint-N)" % (name,))
        return _open_dir_at(pfd, str(name), os.path.join(parent, name), create=create)
    finally:
        os.close(pfd)


def _walk_dirs(root_fd, parts, where, create=False):
    """A descriptor of the directory root_fd/parts..., each component opened without following a link (and
    created when asked), an error naming the component."""
    return walk_dirs(root_fd, parts, lambda fd, p, i: _open_dir_at(
        fd, p, os.path.join(where, *parts[:i + 1]), create=create))


def _files_under(root_fd, rel, where):
    """Relative paths of every regular file under directory rel (jobtree.walk: no link followed, depth and count
    capped; a link or anything but a file or directory stops the copy, naming it)."""
    base = "/".join(_parts(rel))
    os.close(_walk_dirs(root_fd, _parts(rel), where))  # a link on the way: the one-line error naming it
    out = []
    try:
        for sub, _name, st in jobtree.walk(root_fd, base):
            path = os.path.join(where, base, sub)
            if stat.S_ISLNK(st.st_mode):
                raise TransferError("%s is a symbolic link: recover follows no link in the checkpoint tree (the job "
                                    "wrote it). Fix: remove it and rerun" % path)
            if stat.S_ISREG(st.st_mode):
                out.append(base + "/" + sub)
            elif not stat.S_ISDIR(st.st_mode):
                raise TransferError("%s is not a regular file" % path)
    except jobtree.TreeError as e:
        raise TransferError("%s: %s. Fix: check what the job wrote there, remove it and rerun"
                            % (os.path.join(where, base), e.strerror or e))
    return sorted(out)


def _open_file(root_fd, rel, where):
    """(fd, fstat) of the regular file root_fd/rel: directories walked without following a link, then
    jobtree.open_file, which checks the type before it opens (a FIFO or device node the job made is never opened)."""
    parts = _parts(rel)
    dfd = _walk_dirs(root_fd, parts[:-1], where)
    try:
        st = jobtree.stat_at(dfd, parts[-1])
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise TransferError("%s is a symbolic link: recover follows no link in the checkpoint tree (the job "
                                "wrote it). Fix: remove it and rerun" % os.path.join(where, rel))
        fd = jobtree.open_file(dfd, parts[-1])
    except jobtree.TreeError:
        raise TransferError("%s is not a regular file" % os.path.join(where, rel))
    except OSError as e:
        raise TransferError("%s: %s" % (os.path.join(where, rel), e.strerror))
    finally:
        os.close(dfd)
    return fd, os.fstat(fd)


# A file whose blocks on disk cover less than this share of its apparent size is sparse: a hole costs the job
# nothing and becomes real bytes in the tar, on the node, the controller and the head. Checkpoint shards are
# written densely; files below SPARSE_MIN_BYTES are not judged (their holes cost little).
SPARSE_MIN_ALLOCATED = 0.5
SPARSE_MIN_BYTES = 1 << 20


def size_problem(path, st, allow_sparse=False):
    """Why a file must not be packed (sparse: apparent size far above what it holds on disk), or ''."""
    allocated = getattr(st, "st_blocks", 0) * 512
    if not allow_sparse and st.st_size > SPARSE_MIN_BYTES and allocated < st.st_size * SPARSE_MIN_ALLOCATED:
        return ("%s is sparse: %d bytes apparent, %d on disk; packed, its holes would become real bytes on this "
                "node, the controller and the head. Fix: it is not a shard the trainer wrote densely: remove it (or "
                "the checkpoint) and rerun; on a compressing file system (ZFS, btrfs) set "
                "launch_recover_copy_allow_sparse: true" % (path, st.st_size, allocated))
    return ""


def pack_plan(root, rels, where, max_bytes=0, allow_sparse=False, free_bytes=None):
    """Check every file before anything is written: regular, not sparse, and the total apparent size within
    max_bytes (0: no cap of its own) and the free space where the tar goes. Returns the total; TransferError naming
    the file (or the total) and the fix."""
    total = 0
    for rel in rels:
        fd, st = _open_file(root, rel, where)
        os.close(fd)
        why = size_problem(os.path.join(where, rel), st, allow_sparse)
        if why:
            raise TransferError(why)
        total += st.st_size
    if max_bytes and total > max_bytes:
        raise TransferError("the files to copy from %s hold %d bytes, over launch_recover_copy_max_bytes (%d). Fix: "
                            "check their sizes (ls -ls) against the other ranks' shards; raise the cap if they are "
                            "right" % (where, total, max_bytes))
    if free_bytes is not None and total > free_bytes:
        raise TransferError("the files to copy from %s hold %d bytes; the temporary directory has %d free. Fix: free "
                            "space there (or check the files' sizes against the other ranks' shards)"
                            % (where, total, free_bytes))
    return total


def pack(parent, name, files=(), trees=(), tmp_root=None, max_bytes=0, allow_sparse=False):
    """Tar the files (relative paths) and the directory trees of parent/name into <fresh private dir>/ckpt.tar,
    after pack_plan passed. Returns {archive, files: [relative paths], bytes}. Raises TransferError at the first
    link, non-file, sparse file, or a total over the cap or the free space."""
    where = os.path.join(parent, name)
    root = open_checkpoint(parent, name)
    try:
        rels = [str(f) for f in files]
        for t in trees:
            rels += _files_under(root, str(t), where)
        vfs = os.statvfs(tmp_root or tempfile.gettempdir())
        planned = pack_plan(root, rels, where, max_bytes, allow_sparse, vfs.f_bavail * vfs.f_frsize)
        private = tempfile.mkdtemp(prefix="trainyard-ckpt-", dir=tmp_root)  # 0700, this user's
        archive = os.path.join(private, "ckpt.tar")
        total = 0
        try:
            with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
                for rel in rels:
                    fd, st = _open_file(root, rel, where)
                    # changed since the plan (the job writes on): the checked total still bounds the tar
                    why = size_problem(os.path.join(where, rel), st, allow_sparse) or (
                        "%s grew while it was packed: rerun when the job is stopped" % os.path.join(where, rel)
                        if total + st.st_size > planned else "")
                    if why:
                        os.close(fd)
                        raise TransferError(why)
                    with os.fdopen(fd, "rb") as f:
                        info = tarfile.TarInfo("/".join(_parts(rel)))
                        info.size, info.mtime = st.st_size, int(st.st_mtime)
                        info.mode = stat.S_IMODE(st.st_mode) & 0o755
                        info.uid, info.gid = st.st_uid, st.st_gid
                        tar.addfile(info, f)
                        total += st.st_size
        except BaseException:
            shutil.rmtree(private, ignore_errors=True)
            raise
        return {"archive": archive, "files": rels, "bytes": total}
    finally:
        os.close(root)


def _same(dir_fd, name, member, tar):
    """True when dir_fd/name is already a regular file with the member's content (typed before it is opened:
    jobtree.open_file)."""
    try:
        fd = jobtree.open_file(dir_fd, name)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode) or os.fstat(f.fileno()).st_size != member.size:
            return False
        a, b = hashlib.sha256(), hashlib.sha256()
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            a.update(chunk)
        src = tar.extractfile(member)
        for chunk in iter(lambda: src.read(_CHUNK), b""):
            b.update(chunk)
        return a.digest() == b.digest()


def unpack(archive, parent, name, check_mode=False):
    """Write the regular files of a tar made by pack into parent/name (created when missing), each file owned by
    the checkpoint directory's owner. Returns {written: [paths], unchanged: [paths]}."""
    where = os.path.join(parent, name)
    try:
        tar = tarfile.open(archive, "r:")
    except (OSError, tarfile.TarError) as e:
        raise TransferError("%s: not a readable tar (%s)" % (archive, e))
    with tar:
        members = tar.getmembers()
        for m in members:
            _parts(m.name)
            if not (m.isfile() or m.isdir()):
                raise TransferError("%s in %s is not a regular file or directory: recover unpacks no link"
                                    % (m.name, archive))
        if check_mode:
            try:
                root = open_checkpoint(parent, name)
            except TransferError:
                return {"written": [m.name for m in members if m.isfile()], "unchanged": []}
        else:
            root = open_checkpoint(parent, name, create=True)
        written, unchanged = [], []
        try:
            st = os.fstat(root)
            owner = (st.st_uid, st.st_gid)
            for m in members:
                if not m.isfile():
                    continue
                parts = _parts(m.name)
                try:
                    dfd = _walk_dirs(root, parts[:-1], where, create=not check_mode)
                except TransferError:
                    if check_mode:
                        written.append(m.name)
                        continue
                    raise
                try:
                    if _same(dfd, parts[-1], m, tar):
                        unchanged.append(m.name)
                        continue
                    written.append(m.name)
                    if not check_mode:
                        write_file_at(dfd, parts[-1], tar.extractfile(m), stat.S_IMODE(m.mode) or 0o644,
                                      owner_of_dir=False, owner=owner)
                finally:
                    os.close(dfd)
        finally:
            os.close(root)
    return {"written": written, "unchanged": unchanged}
