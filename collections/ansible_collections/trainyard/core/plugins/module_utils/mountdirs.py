"""The training container's bind-mount sources on the host: create them, give the writable ones to the job's user,
give the job's read-only directory the job's group (stdlib only; every step through jobtree.py's descriptors).

The rules (those of the container role's directory tasks before they became one module call, now run by the action
container_start in roles/container/tasks/run.yml):

* a source is created as ``mkdir -p`` would (missing parents too, root 0755); an existing one keeps its mode and
  owner. Its parents are the host's (resolved as the host made them), except below another writable source: there
  the job could have swapped a directory for a symlink, so every component below that source is opened without
  following links and a symlink is refused, never followed;
* a writable source the job cannot write (root's, not writable by the job's uid:gid: a new one, or one an earlier
  root container used) is given to the job's uid:gid: the top directory only, never recursively, with ``fchown``
  on the directory's own descriptor (what ``chown -h`` promises, without a path to swap between the check and the
  change). One of another owner (an operator's shared space), one already writable (1777), a symlink (the host's
  own link is left as it is, never followed) and one below another writable source are left as they are;
* the job's read-only directory stays root's, with the job's gid as its group, group read and search and no group
  write (the launch writes its spec there 0640 with that group).
"""

from __future__ import annotations

import errno
import os
import stat

from ansible_collections.trainyard.core.plugins.module_utils import jobtree as jt

DIR_MODE = 0o755  # mkdir -p under the usual umask 022


def components(path: str) -> list:
    """The names of an absolute path; '..' and relative paths are refused (a linked component makes '..' mean
    elsewhere)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError("%r is not an absolute path" % (path,))
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError("%s: '..' in a path (spell it without)" % path)
    if not parts:
        raise ValueError("%s: the root directory is not a mount source" % path)
    return parts


def normalized(path: str) -> str:
    return "/" + "/".join(components(path))


def writable_root_above(path: str, writable) -> str | None:
    """The outermost writable source strictly above path (the job can write the tree path is in), else None."""
    above = [r for r in writable if path.startswith(r + "/")]
    return min(above, key=len) if above else None


def job_can_write(st, uid: int, gid: int) -> bool:
    mode = stat.S_IMODE(st.st_mode)
    return bool(mode & 0o002 or (st.st_uid == uid and mode & 0o200) or (st.st_gid == gid and mode & 0o020))


def to_give(st, uid: int, gid: int) -> bool:
    """Whether a writable source is given to uid:gid: a directory root owns that the job cannot write."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not job_can_write(st, uid, gid)


class Walk(object):
    """Where one source stands after open_source: fd (an O_NOFOLLOW descriptor of the directory, None when it is
    absent, a link, or would be created in check mode), state ('dir', 'link', 'absent', 'would_create') and the
    directories made (or, in check mode, that would be)."""

    def __init__(self):
        self.fd, self.state, self.made = None, "absent", []


def _anchor(path: str, writable) -> tuple:
    """(trusted directory as given, components below it, below_writable). Below a writable source that exists,
    that source (its parents are the host's); elsewhere the deepest existing ancestor of the parent (opened as the
    host resolves it)."""
    root = writable_root_above(path, writable)
    if root is not None and os.path.isdir(root):
        return root, path[len(root) + 1:].split("/"), True
    parent = os.path.dirname(path)
    while parent != "/" and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    return parent, path[len(parent):].strip("/").split("/"), False


def open_source(path: str, writable, create: bool, check: bool) -> Walk:
    """Walk to the source path (see the module docstring for the rules), creating what is missing when create
    (in check mode: recording what would be made). The caller closes walk.fd."""
    w = Walk()
    base, parts, below = _anchor(path, writable)
    fd = jt.open_root(os.path.realpath(base))
    here = base.rstrip("/")
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            here = here + "/" + name
            st = jt.stat_at(fd, name)
            if st is None:
                if not create:
                    return w
                if check:
                    w.state = "would_create"
                    w.made.append(here)
                    w.made.extend(here + "/" + "/".join(parts[i + 1:j + 1]) for j in range(i + 1, len(parts)))
                    return w
                nfd, created = jt.mkdir(fd, name, DIR_MODE)
                if created:
                    w.made.append(here)
            elif stat.S_ISDIR(st.st_mode):
                nfd = jt.open_dir(fd, name)
            elif stat.S_ISLNK(st.st_mode) and last and not below:
                w.state = "link"  # the host's own link (docker follows it when it mounts): left as it is
                return w
            elif stat.S_ISLNK(st.st_mode):
                raise jt.TreeError(errno.ELOOP, "%s is a symbolic link %s, never followed here: give a path without "
                                   "links" % (here, "below the writable mount source " + writable_root_above(
                                       path, writable) if below else "on the way to " + path))
            else:
                raise jt.TreeError(errno.EEXIST, "%s exists and is not a directory (%s): move it away or change "
                                   "the mount source %s" % (here, jt.kind_of(st), path))
            os.close(fd)
            fd = nfd
        w.fd, fd, w.state = fd, None, "dir"
        return w
    finally:
        if fd is not None:
            os.close(fd)


def ensure(create, writable, ids, group_dir, check: bool) -> dict:
    """Create the sources in create, give the writable ones the job cannot write to ids (uid, gid), set the
    group of group_dir to ids' gid (root's, g+rx, g-w). ids None (the job runs as root or as the image's user):
    only the creation. The result: changed, created, given, left ({writable source: why it keeps its owner}),
    group_dir ({path, changed} or None)."""
    create = sorted({normalized(p) for p in create}, key=lambda p: (p.count("/"), p))
    writable = sorted({normalized(p) for p in writable}, key=len)
    group_dir = normalized(group_dir) if group_dir else None
    out = {"changed": False, "created": [], "given": [], "left": {}, "group_dir": None}
    for path in create:
        w = open_source(path, writable, True, check)
        if w.fd is not None:
            os.close(w.fd)
        out["created"] += [m for m in w.made if m not in out["created"]]
    if ids is not None:
        uid, gid = ids
        for path in writable:
            if writable_root_above(path, writable):
                out["left"][path] = "below the writable source %s" % writable_root_above(path, writable)
                continue
            w = open_source(path, writable, False, check)
            if w.fd is None:
                if path in out["created"]:  # check mode: a new directory is root's 0755
                    out["given"].append(path)
                else:
                    out["left"][path] = "a symbolic link, never followed" if w.state == "link" else "absent"
                continue
            try:
                st = os.fstat(w.fd)
                if to_give(st, uid, gid):
                    if not check:
                        os.fchown(w.fd, uid, gid)
                    out["given"].append(path)
                else:
                    out["left"][path] = ("writable by %d:%d already" % (uid, gid) if job_can_write(st, uid, gid)
                                         else "owned by uid %d" % st.st_uid)
            finally:
                os.close(w.fd)
        if group_dir:
            out["group_dir"] = {"path": group_dir, "changed": set_group(group_dir, writable, gid, check, out)}
    out["changed"] = bool(out["created"] or out["given"] or (out["group_dir"] or {}).get("changed"))
    return out


def set_group(path: str, writable, gid: int, check: bool, out: dict) -> bool:
    """root:gid, group r-x, no group write on the directory path (created when missing, as the file module did)."""
    w = open_source(path, writable, True, check)
    out["created"] += [m for m in w.made if m not in out["created"]]
    if w.state == "link":
        raise jt.TreeError(errno.ELOOP, "%s is a symbolic link where the job's read-only directory belongs: remove "
                           "it (never followed)" % path)
    if w.fd is None:
        return True  # check mode: would be created
    try:
        st = os.fstat(w.fd)
        mode = stat.S_IMODE(st.st_mode)
        want = (mode | 0o050) & ~0o020
        changed = (st.st_uid, st.st_gid) != (0, gid) or mode != want
        if changed and not check:
            os.fchown(w.fd, 0, gid)
            os.fchmod(w.fd, want)  # after fchown, which clears set-id bits
        return changed
    finally:
        os.close(w.fd)
