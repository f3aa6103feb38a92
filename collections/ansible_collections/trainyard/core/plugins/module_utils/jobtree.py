"""The one layer through which host code (root) touches a tree the training job can write (stdlib only).

Job-writable trees: the output root, the code directory, ``<state>/<job>/job-rw/``, ``/dev/shm`` and ``/tmp``
leftovers. The job is root in its container and races the host: it swaps a directory for a symlink between two
system calls, plants FIFOs and device nodes (CAP_MKNOD), sparse terabyte files, truncates files while they are read.
So, here and nowhere else:

* every path below a trusted directory is walked component by component relative to directory descriptors, each
  opened ``O_NOFOLLOW|O_DIRECTORY``; ``..``, absolute and empty components are refused;
* a file is opened only once its type is known: ``O_PATH|O_NOFOLLOW`` first (no driver open, no FIFO wait), the
  type checked with ``fstat``, then the same inode reopened read-only ``O_NONBLOCK|O_NOCTTY`` through
  ``/proc/self/fd``; regular files and directories only, anything else is a ``TreeError``;
* modes and owners are set with ``fchmod``/``fchown`` on a descriptor, never by path; files are written to a fresh
  ``O_EXCL|O_NOFOLLOW`` temporary file and renamed relative to the directory descriptor;
* reads never map memory (a truncated file gives a short read, never SIGBUS) and every read, listing, walk and
  JSON document is capped (size, count, depth, types).

A ``TreeError`` is an ``OSError``: callers that already handle "cannot open" keep working. Records that fail
``loads_bounded``/``read_json`` raise ``BadRecord``, both a ``TreeError`` and a ``ValueError``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC
_O_PATH = getattr(os, "O_PATH", 0)


class Caps:
    """Default caps: far beyond what a real job writes where the host looks, small enough to bound the host."""
    FILE_BYTES = 1 << 20          # read_bytes callers pass their own; read_json defaults to 64 KiB
    JSON_BYTES = 64 * 1024
    JSON_DEPTH = 32
    ENTRIES = 100_000             # per listing, per walk, per removal
    DEPTH = 64                    # directory nesting of a walk or removal
    READ_CHUNK = 1 << 20


class TreeError(OSError):
    """A refusal: a symlink, a type other than a regular file or directory, over a cap, escaping the root."""


class BadRecord(TreeError, ValueError):
    """A JSON record refused: too large, too deep, NaN/Infinity, malformed, or not the expected types."""


def _parts(rel) -> list:
    rel = os.fspath(rel)
    if isinstance(rel, bytes):
        rel = os.fsdecode(rel)
    if rel in ("", "."):
        return []
    if rel.startswith("/") or "\0" in rel:
        raise TreeError(errno.EINVAL, "an absolute path or a NUL byte where a relative one belongs", rel)
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise TreeError(errno.EINVAL, "an empty, '.' or '..' component", rel)
    return parts


def _one(name: str) -> None:
    if len(_parts(name)) != 1:
        raise TreeError(errno.EINVAL, "one name, not a path", name)


def _refusal(e: OSError, name: str) -> OSError:
    """ELOOP/ENOTDIR under O_NOFOLLOW mean a symlink or a non-directory where a directory belongs."""
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return TreeError(e.errno, "a symlink or not a directory (never followed)", name)
    return e


def _open_dir_at(dir_fd: int, name: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        raise _refusal(e, name) from None


def open_root(path) -> int:
    """A descriptor of a trusted host directory (its parents are the host's; the last component is not followed)."""
    try:
        return os.open(path, DIR_FLAGS)
    except OSError as e:
        raise _refusal(e, os.fspath(path)) from None


def open_dir(dir_fd: int, rel=".") -> int:
    """A new descriptor of directory dir_fd/rel, every component opened O_NOFOLLOW|O_DIRECTORY."""
    fd = os.dup(dir_fd)
    try:
        for p in _parts(rel):
            nfd = _open_dir_at(fd, p)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _split(dir_fd: int, rel) -> tuple:
    """(descriptor of rel's directory, last component); the caller closes the descriptor."""
    parts = _parts(rel)
    if not parts:
        raise TreeError(errno.EINVAL, "no file name", os.fspath(rel))
    return open_dir(dir_fd, "/".join(parts[:-1])), parts[-1]


def kind_of(st) -> str:
    return "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "other"


def _open_regular_at(dfd: int, name: str) -> int:
    if _O_PATH:
        # O_PATH opens nothing (no driver open, no FIFO wait): check the type, then reopen that very inode.
        pfd = os.open(name, _O_PATH | os.O_NOFOLLOW | _CLOEXEC, dir_fd=dfd)
        try:
            st = os.fstat(pfd)
            if not stat.S_ISREG(st.st_mode):
                raise TreeError(errno.EPERM, "not a regular file (%s)" % kind_of(st), name)
            try:
                fd = os.open("/proc/self/fd/%d" % pfd, FILE_FLAGS & ~os.O_NOFOLLOW)
            except FileNotFoundError:  # no /proc: the plain open below, checked after
                fd = None
        finally:
            os.close(pfd)
    else:
        st, fd = os.stat(name, dir_fd=dfd, follow_symlinks=False), None
        if not stat.S_ISREG(st.st_mode):
            raise TreeError(errno.EPERM, "not a regular file (%s)" % kind_of(st), name)
    if fd is None:
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=dfd)
        except OSError as e:
            raise _refusal(e, name) from None
    got = os.fstat(fd)
    if not stat.S_ISREG(got.st_mode) or (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise TreeError(errno.EPERM, "replaced while it was opened", name)
    return fd


def open_file(dir_fd: int, rel) -> int:
    """A read-only descriptor of the regular file dir_fd/rel (never a FIFO, device, socket or symlink)."""
    dfd, name = _split(dir_fd, rel)
    try:
        return _open_regular_at(dfd, name)
    finally:
        os.close(dfd)


def file_size(fd: int) -> int:
    return os.fstat(fd).st_size


def read_fd(fd: int, max_bytes: int, tail: bool = False) -> bytes:
    """At most max_bytes of an open file (tail: the last max_bytes), with pread: a file that shrinks or grows
    meanwhile gives a short or capped read."""
    pos = max(0, file_size(fd) - max_bytes) if tail else 0
    chunks, left = [], max_bytes
    while left > 0:
        b = os.pread(fd, min(left, Caps.READ_CHUNK), pos)
        if not b:
            break
        chunks.append(b)
        pos += len(b)
        left -= len(b)
    return b"".join(chunks)


def read_bytes(dir_fd: int, rel, max_bytes: int, tail: bool = False) -> bytes:
    fd = open_file(dir_fd, rel)
    try:
        return read_fd(fd, max_bytes, tail)
    finally:
        os.close(fd)


_STRUCT = re.compile(r'["\[\]{}]')
_IN_STRING = re.compile(r'["\\]')


def max_depth_of(text: str, limit: int) -> int:
    """The bracket nesting of a JSON text (strings skipped), stopping with BadRecord past limit: linear, no
    recursion, so a 100k-deep ``[[[[`` is refused before json.loads could recurse."""
    depth = deepest = i = 0
    n = len(text)
    while True:
        m = _STRUCT.search(text, i)
        if not m:
            return deepest
        c, i = m.group(), m.end()
        if c == '"':
            while True:
                s = _IN_STRING.search(text, i)
                if not s:
                    return deepest  # unterminated string: json.loads will say so
                i = s.end() + (1 if s.group() == "\\" else 0)
                if s.group() == '"':
                    break
                if i > n:
                    return deepest
        elif c in "[{":
            depth += 1
            if depth > limit:
                raise BadRecord(errno.EINVAL, "nested deeper than %d levels" % limit)
            deepest = max(deepest, depth)
        else:
            depth -= 1


def _no_constant(name):
    raise BadRecord(errno.EINVAL, "%s is not a number this reader accepts" % name)


def _finite(s: str) -> float:
    v = float(s)
    if math.isinf(v):
        raise BadRecord(errno.ERANGE, "%s overflows a float" % s[:40])
    return v


def _types(t) -> tuple:
    return t if isinstance(t, tuple) else (t,)


def _is(value, types: tuple) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # True is an int to Python, never to a schema
    return isinstance(value, types)


def check_types(value, expect, required=()):
    """value checked against expect: a type, a tuple of types, or {key: type(s)} for an object (keys optional
    unless in required). BadRecord naming the key on a mismatch."""
    if expect is None:
        return value
    if isinstance(expect, dict):
        if not isinstance(value, dict):
            raise BadRecord(errno.EINVAL, "expected a JSON object, got %s" % type(value).__name__)
        for k in required:
            if k not in value:
                raise BadRecord(errno.EINVAL, "key %r missing" % k)
        for k, t in expect.items():
            if k in value and not _is(value[k], _types(t)):
                raise BadRecord(errno.EINVAL, "key %r: expected %s, got %s" % (
                    k, "/".join(x.__name__ for x in _types(t)), type(value[k]).__name__))
        return value
    if not _is(value, _types(expect)):
        raise BadRecord(errno.EINVAL, "expected %s, got %s" % ("/".join(x.__name__ for x in _types(expect)),
                                                               type(value).__name__))
    return value


def loads_bounded(data, max_depth: int = Caps.JSON_DEPTH, expect=None, required=(), max_bytes=None):
    """json.loads for untrusted text: nesting checked first, NaN/Infinity/1e999 refused, types checked.
    Any failure is a BadRecord (a ValueError), never a RecursionError or a traceback of the caller."""
    if max_bytes is not None and len(data) > max_bytes:
        raise BadRecord(errno.EFBIG, "%d bytes, over the %d allowed" % (len(data), max_bytes))
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadRecord(errno.EINVAL, "not UTF-8: %s" % e) from None
    if not isinstance(data, str):
        raise BadRecord(errno.EINVAL, "expected JSON text, got %s" % type(data).__name__)
    max_depth_of(data, max_depth)
    try:
        value = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except BadRecord:
        raise
    except (ValueError, RecursionError) as e:  # JSONDecodeError, int digit limit
        raise BadRecord(errno.EINVAL, "not JSON: %s" % str(e)[:200]) from None
    return check_types(value, expect, required)


def read_json(dir_fd: int, rel, max_bytes: int = Caps.JSON_BYTES, max_depth: int = Caps.JSON_DEPTH, expect=None,
              required=()):
    """A JSON record read through open_file: over max_bytes, too deep or of the wrong types -> BadRecord."""
    data = read_bytes(dir_fd, rel, max_bytes + 1)
    if len(data) > max_bytes:
        raise BadRecord(errno.EFBIG, "over the %d bytes a record may have" % max_bytes, os.fspath(rel))
    return loads_bounded(data, max_depth, expect, required)


def _scan(fd: int, max_entries: int, what) -> list:
    out = []
    with os.scandir(fd) as it:
        for e in it:
            if len(out) >= max_entries:
                raise TreeError(errno.EFBIG, "more than %d entries" % max_entries, what)
            try:
                st = os.stat(e.name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone meanwhile
            out.append((e.name, st))
    out.sort(key=lambda x: x[0])
    return out


def listdir(dir_fd: int, rel=".", max_entries: int = Caps.ENTRIES) -> list:
    """[(name, 'file'|'dir'|'other')] sorted, from fstatat without following (a symlink is 'other')."""
    fd = open_dir(dir_fd, rel)
    try:
        return [(n, kind_of(st)) for n, st in _scan(fd, max_entries, rel)]
    finally:
        os.close(fd)


def walk(dir_fd: int, rel=".", max_depth: int = Caps.DEPTH, max_entries: int = Caps.ENTRIES):
    """Yields (relpath, name, lstat) of every entry below dir_fd/rel, relpath relative to rel, parents before
    children; directories are entered through O_NOFOLLOW descriptors (one swapped for a link meanwhile is not
    entered). Deeper than max_depth or more than max_entries in all -> TreeError."""
    count = 0
    stack = [(open_dir(dir_fd, rel), "", 1)]
    try:
        while stack:
            fd, prefix, depth = stack.pop()
            try:
                entries = _scan(fd, max_entries, prefix or rel)
                count += len(entries)
                if count > max_entries:
                    raise TreeError(errno.EFBIG, "more than %d entries" % max_entries, os.fspath(rel))
                subdirs = []
                for name, st in entries:
                    path = prefix + name
                    yield path, name, st
                    if stat.S_ISDIR(st.st_mode):
                        subdirs.append((name, path))
                for name, path in reversed(subdirs):
                    if depth >= max_depth:
                        raise TreeError(errno.EFBIG, "deeper than %d levels" % max_depth, path)
                    try:
                        stack.append((_open_dir_at(fd, name), path + "/", depth + 1))
                    except (TreeError, FileNotFoundError):
                        continue  # swapped or gone meanwhile: not entered
            finally:
                os.close(fd)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def tree_usage(dir_fd: int, rel=".", max_depth: int = Caps.DEPTH, max_entries: int = Caps.ENTRIES) -> tuple:
    """(allocated bytes (st_blocks*512), apparent bytes (st_size), files) of the regular files below rel."""
    alloc = size = files = 0
    for _path, _name, st in walk(dir_fd, rel, max_depth, max_entries):
        if stat.S_ISREG(st.st_mode):
            alloc += st.st_blocks * 512
            size += st.st_size
            files += 1
    return alloc, size, files


def tree_bytes(dir_fd: int, rel=".", max_depth: int = Caps.DEPTH, max_entries: int = Caps.ENTRIES) -> int:
    """The larger of allocated and apparent bytes of the files below rel: a sparse file counts by what copying
    it costs, a small file by what it holds on disk."""
    alloc, size, _ = tree_usage(dir_fd, rel, max_depth, max_entries)
    return max(alloc, size)


def mkdir(dir_fd: int, name: str, mode: int, uid=None, gid=None, owner=None) -> tuple:
    """(descriptor, created) of directory dir_fd/name: mkdirat, then opened O_NOFOLLOW|O_DIRECTORY and its mode
    (and owner with uid/gid) set with fchmod/fchown on THAT descriptor. owner: the uid an existing directory must
    have (TreeError otherwise). A symlink swapped in is refused, never followed."""
    _one(name)
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
        created = True
    except FileExistsError:
        created = False
    fd = _open_dir_at(dir_fd, name)
    try:
        st = os.fstat(fd)
        if not created and owner is not None and st.st_uid != owner:
            raise TreeError(errno.EPERM, "owned by uid %d, not %d" % (st.st_uid, owner), name)
        if created or stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
        if (uid is not None and st.st_uid != uid) or (gid is not None and st.st_gid != gid):
            os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def makedirs(dir_fd: int, rel, mode: int) -> tuple:
    """(descriptor, created names) of dir_fd/rel, each missing component made by mkdir (mode), existing ones
    entered without following links and left as they are."""
    fd, made = os.dup(dir_fd), []
    try:
        for p in _parts(rel):
            try:
                nfd = _open_dir_at(fd, p)
            except FileNotFoundError:
                nfd, created = mkdir(fd, p, mode)
                if created:
                    made.append(p)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd, made


def stat_at(dir_fd: int, name: str):
    """lstat of dir_fd/name, None when absent."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def write_file(dir_fd: int, name: str, data: bytes, mode: int = 0o644, uid=None, gid=None) -> bool:
    """Put data in dir_fd/name atomically: a fresh O_CREAT|O_EXCL|O_NOFOLLOW temporary file, fchmod/fchown,
    fsync, renameat. A regular file already holding data with that mode and owner is left alone (False). What
    stands there otherwise (a symlink, a FIFO) is replaced, never opened; a directory is refused."""
    _one(name)
    st = stat_at(dir_fd, name)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise TreeError(errno.EISDIR, "a directory where a file belongs", name)
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == len(data) \
            and stat.S_IMODE(st.st_mode) == mode and uid in (None, st.st_uid) and gid in (None, st.st_gid):
        try:
            if read_bytes(dir_fd, name, len(data) + 1) == data:
                return False
        except TreeError:
            pass
    tmp = ".%s.trainyard-%s" % (name[:200], os.urandom(6).hex())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if uid is not None or gid is not None:
                os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    return True


def remove_tree(dir_fd: int, name: str, max_entries: int = Caps.ENTRIES, max_depth: int = Caps.DEPTH) -> dict:
    """Remove dir_fd/name and, if it is a directory, everything below it: unlinkat/rmdir relative to O_NOFOLLOW
    descriptors; links, FIFOs and devices are unlinked, never opened. {'files': n, 'dirs': n} removed; more
    than max_entries or deeper than max_depth -> TreeError (what was removed so far stays removed)."""
    _one(name)
    counts = {"files": 0, "dirs": 0}
    st = stat_at(dir_fd, name)
    if st is None:
        return counts
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        counts["files"] += 1
        return counts

    def rm_dir(pfd: int, dname: str, depth: int):
        if depth > max_depth:
            raise TreeError(errno.EFBIG, "deeper than %d levels" % max_depth, dname)
        try:
            fd = _open_dir_at(pfd, dname)
        except TreeError:  # swapped for a link or a file meanwhile: remove the entry itself
            os.unlink(dname, dir_fd=pfd)
            counts["files"] += 1
            return
        try:
            for n, est in _scan(fd, max_entries, dname):
                if counts["files"] + counts["dirs"] >= max_entries:
                    raise TreeError(errno.EFBIG, "more than %d entries" % max_entries, name)
                if stat.S_ISDIR(est.st_mode):
                    rm_dir(fd, n, depth + 1)
                else:
                    try:
                        os.unlink(n, dir_fd=fd)
                        counts["files"] += 1
                    except FileNotFoundError:
                        pass
        finally:
            os.close(fd)
        try:
            os.rmdir(dname, dir_fd=pfd)
            counts["dirs"] += 1
        except FileNotFoundError:
            pass
        except NotADirectoryError:  # emptied, then swapped for a link: the link goes
            os.unlink(dname, dir_fd=pfd)
            counts["files"] += 1

    rm_dir(dir_fd, name, 1)
    return counts
