#!/usr/bin/python
# trainyard: the job's directories and small files on a node, in one module call.
"""Ensure a job's directories and files on a node in one round trip.

A converged `file` + `copy`/`template` + read-back costs four module runs per file (the copy action alone stats
the file remotely and then runs `file` for its attributes); this module does the same work in one, and returns
what is on disk so the caller needs no read-back either.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: job_files
short_description: Create the job's directories, write its files and point its links, in one call
description:
  - "Creates each missing directory (with missing parents) with its mode. An existing directory is never changed
    (neither mode nor owner): it may be a system or shared directory this module did not create. Only an entry
    with C(enforce_mode) sets the mode of an existing directory."
  - Writes each file whose content or mode differs, atomically (a temporary file in the same directory, then a
    rename); a file that already holds the content is left alone.
  - "Every path is handled through module_utils/jobtree.py: directories relative to descriptors, modes set with
    fchmod on the new directory's descriptor, files written O_EXCL|O_NOFOLLOW and renamed relative to their
    directory, a symlink or FIFO planted where a file belongs replaced without being read (docs/security.md)."
  - Returns, per file, whether it changed, its sha256 and size, and with I(return_content) its bytes (base64, as
    C(ansible.builtin.slurp) returns them), so no read-back task is needed.
  - Supports check mode (nothing is written; the result says what would change, the content returned is what is
    on disk) and diff mode (before and after of each changed file).
options:
  directories:
    description:
      - Directories to create, each C(path), optional C(mode) (octal string) and optional C(enforce_mode) (bool).
      - A missing directory is created with C(mode) (C(0755) without one). An existing one keeps its mode and owner
        (reported as C(mode_kept) when it differs from C(mode)); C(enforce_mode=true) sets its mode anyway (only for
        a directory the product owns by name, such as a job's own state directory).
    type: list
    elements: dict
    default: []
  files:
    description:
      - Files to write, each C(path), C(content) (text) and optional C(mode) (octal string, default C(0644)).
      - The parent directory must exist or be listed in I(directories).
    type: list
    elements: dict
    default: []
  links:
    description:
      - Symbolic links to point, each C(path) and C(target) (the link's text, relative to its directory or
        absolute). A link that points elsewhere is replaced atomically; a file or directory in its place is an
        error. Made after the directories and files.
    type: list
    elements: dict
    default: []
  return_content:
    description: Return each file's bytes on disk (base64) after the call.
    type: bool
    default: false
  refuse: {description: "Reasons not to touch the node: given, the module fails with them (one a line) before anything.", type: list, elements: str, default: []}
  glob: {description: "Patterns (C(/sys/class/net/*)) whose matches are returned: read-only probes in the same call.", type: list, elements: str, default: []}
  read:
    description:
      - Patterns of small files (1 MiB at most) read back after the writes.
      - Regular files only; a FIFO, device node, socket or symlink is never opened (listed in C(read_skipped)).
    type: list
    elements: str
    default: []
  latest_checkpoint:
    description:
      - "A training output directory: the latest complete checkpoint directly below it (module_utils/checkpoints.py
        latest_complete_checkpoint, the resume point: C(checkpoint-N) with its completion marker, walked from one
        descriptor of the directory without following a link the job planted) is returned as C(latest_checkpoint).
        Read after everything else, in check mode too. Give it on the node where rank 0 saves (the head)."
    type: path
    default: ""
  roots:
    description:
      - "Trees the training job can write (the container's writable mount sources: output root, code directory,
        C(job-rw)). A root is opened as the host made it; every component below it is opened relative to a
        directory descriptor without following any link, so a directory the job swaps for a symlink is refused,
        never followed."
      - A path outside every root is opened from its parent directory (the host's own, resolved); its last
        component is never followed either. Paths with C(..) are refused.
    type: list
    elements: path
    default: []
author: trainyard
"""

EXAMPLES = r"""
- name: Render the env file and its directory in one call
  job_files:
    directories: [{path: /var/lib/trainyard/train, mode: "0755"}]
    files:
      - path: /var/lib/trainyard/train/nccl.env
        content: "{{ __nccl_env_validated.content }}"
        mode: "0644"
    return_content: true
  register: written
"""

RETURN = r"""
files:
  description: One entry per file, in the order given.
  returned: always
  type: list
  elements: dict
  contains:
    path: {description: The file., type: str}
    changed: {description: Whether the content or the mode was (or in check mode would be) changed., type: bool}
    checksum: {description: sha256 of the content on disk after the call (before it in check mode)., type: str}
    size: {description: Bytes on disk after the call., type: int}
    content: {description: The bytes on disk, base64 (only with return_content)., type: str}
    encoding: {description: C(base64) (only with return_content)., type: str}
directories:
  description: One entry per directory, with C(path), C(changed), C(created) and C(mode_kept) (the existing mode, octal, when it differs from the requested one and was left alone).
  returned: always
  type: list
  elements: dict
links:
  description: One entry per link, with C(path) and C(changed).
  returned: always
  type: list
  elements: dict
globbed: {description: "C({pattern: [matches, sorted]}).", returned: always, type: dict}
read: {description: "C({path: bytes, base64}) of each file matching I(read).", returned: always, type: dict}
read_skipped: {description: "C({path: why}) of each match of I(read) not read (not a regular file, too large, gone).", returned: always, type: dict}
latest_checkpoint: {description: "The latest complete checkpoint below I(latest_checkpoint) (C(\"\") for none).", returned: with I(latest_checkpoint), type: str}
"""

import base64
import glob
import hashlib
import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils import jobtree as jt
from ansible_collections.trainyard.core.plugins.module_utils.checkpoints import latest_complete_checkpoint

# A file read back (option read) or read before it is replaced (its diff and check-mode content): small files only.
READ_MAX_BYTES = 1 << 20


def parse_mode(value, default, what):
    if value is None or value == "":
        return default
    text = str(value)
    try:
        mode = int(text, 8)
    except ValueError:
        raise ValueError("%s: mode %r is not an octal number such as 0644" % (what, value))
    if not 0 <= mode <= 0o7777:
        raise ValueError("%s: mode %r is out of range" % (what, value))
    return mode


def _deepest_existing(path):
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def anchor(path, roots=(), is_file=False):
    """(trusted directory, [components below it]) of an absolute path. Below the outermost of roots that holds it
    (a tree the job can write), the root is opened as the host made it and every component below it is walked
    without following links. Elsewhere the path's parent is the host's (resolved); its last component is never
    followed. A missing trusted directory moves up to its deepest existing ancestor."""
    parts = path.split("/")
    if ".." in parts:
        raise ValueError("%s: '..' in a path (spell it without: a symlinked component makes it mean elsewhere)" % path)
    path = os.path.normpath(path)
    base = os.path.dirname(path)
    for r in sorted((os.path.normpath(str(r)) for r in roots), key=len):
        if path == r or path.startswith(r.rstrip("/") + "/"):
            base = r if path != r or not is_file else os.path.dirname(r)
            break
    trusted = _deepest_existing(base)
    rel = os.path.relpath(path, trusted)
    return os.path.realpath(trusted), [] if rel == "." else rel.split("/")


class Tree(object):
    """Descriptors of trusted directories, opened once per call."""

    def __init__(self, roots):
        self.roots, self.fds = [str(r) for r in roots], {}

    def locate(self, path, is_file=False):
        """(descriptor of the trusted directory, components below it, the trusted directory's path)."""
        trusted, parts = anchor(path, self.roots, is_file)
        if trusted not in self.fds:
            self.fds[trusted] = jt.open_root(trusted)
        return self.fds[trusted], parts, trusted

    def open_parent(self, path):
        """(descriptor of path's directory, name) or (None, name) when that directory does not exist."""
        fd, parts, _ = self.locate(path, is_file=True)
        try:
            return jt.open_dir(fd, "/".join(parts[:-1])), parts[-1]
        except FileNotFoundError:
            return None, parts[-1]

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


def ensure_dir(tree, path, mode, check, enforce_mode=False):
    """(changed, created, mode_kept) for one directory. A missing directory is created with mode (0755 when None),
    missing parents 0755; the mode is set with fchmod on the new directory's descriptor. An existing one is never
    changed (mode or owner): it may be a system or shared directory the job does not own; its mode is reported as
    mode_kept when it differs. Only enforce_mode sets the mode of an existing directory."""
    root_fd, parts, here = tree.locate(path)
    fd = os.dup(root_fd)
    try:
        for i, name in enumerate(parts):
            here = os.path.join(here, name)
            st = jt.stat_at(fd, name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                raise OSError("%s exists and is not a directory but a symbolic link, never followed here: give the "
                              "resolved path, or list it in roots if the host made the link (a root is opened as "
                              "the host made it)" % here)
            if st is not None and not stat.S_ISDIR(st.st_mode):
                raise OSError("%s exists and is not a directory (%s)" % (here, jt.kind_of(st)))
            if st is None and check:
                return True, True, None
            if st is None:
                last = i == len(parts) - 1
                nfd, created = jt.mkdir(fd, name, 0o755 if mode is None or not last else mode)
            else:
                nfd, created = jt.open_dir(fd, name), False
            os.close(fd)
            fd = nfd
            if created and i == len(parts) - 1:
                return True, True, None
        current = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode is None or current == mode:
            return False, False, None
        if enforce_mode:
            if not check:
                os.fchmod(fd, mode)
            return True, False, None
        return False, False, "%04o" % current
    finally:
        os.close(fd)


def read_existing(dfd, name, cap):
    """The bytes of a regular file (at most cap), None when absent or not a regular file (never opened then)."""
    st = None if dfd is None else jt.stat_at(dfd, name)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OSError("%s is a directory" % name)
    if st is None or not stat.S_ISREG(st.st_mode):
        return None, st
    try:
        return jt.read_bytes(dfd, name, cap), st
    except (jt.TreeError, FileNotFoundError):
        return None, None


def write_file(tree, path, data, mode, check):
    """(changed, before) for one file; written atomically relative to its directory's descriptor unless check.
    A symlink, FIFO or device planted at path is replaced, never read or written through."""
    dfd, name = tree.open_parent(path)
    try:
        try:
            before, st = read_existing(dfd, name, READ_MAX_BYTES + len(data))
        except OSError:
            raise OSError("%s is a directory" % path)
        same = before == data and stat.S_IMODE(st.st_mode) == mode
        if same:
            return False, before
        if check:
            return True, before
        if dfd is None:
            raise FileNotFoundError(path)
        jt.write_file(dfd, name, data, mode)
        return True, before
    finally:
        if dfd is not None:
            os.close(dfd)


def ensure_link(tree, path, target, check):
    """Whether the symlink at path was (or would be) made to point at target; atomic replace, relative to its
    directory's descriptor."""
    dfd, name = tree.open_parent(path)
    if dfd is None:
        raise FileNotFoundError("the directory of %s does not exist" % path)
    try:
        st = jt.stat_at(dfd, name)
        if st is not None and not stat.S_ISLNK(st.st_mode):
            raise OSError("%s exists and is not a symbolic link" % path)
        if st is not None and os.readlink(name, dir_fd=dfd) == target:
            return False
        if check:
            return True
        tmp = ".%s.trainyard-%s" % (name[:200], os.urandom(6).hex())
        os.symlink(target, tmp, dir_fd=dfd)
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
        return True
    finally:
        os.close(dfd)


def read_small(tree, path):
    """(bytes, None) of a regular file of READ_MAX_BYTES at most, else (None, why): a FIFO, device node, socket or
    symlink is never opened."""
    try:
        dfd, name = tree.open_parent(path)
    except (OSError, ValueError) as e:
        return None, str(e)
    if dfd is None:
        return None, "gone"
    try:
        data = jt.read_bytes(dfd, name, READ_MAX_BYTES + 1)
    except OSError as e:
        return None, e.strerror or str(e)
    finally:
        os.close(dfd)
    if len(data) > READ_MAX_BYTES:
        return None, "over %d bytes" % READ_MAX_BYTES
    return data, None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(type="list", elements="dict", default=[]),
            files=dict(type="list", elements="dict", default=[]),
            links=dict(type="list", elements="dict", default=[]),
            return_content=dict(type="bool", default=False),
            refuse=dict(type="list", elements="str", default=[]),
            glob=dict(type="list", elements="str", default=[]),
            read=dict(type="list", elements="str", default=[]),
            roots=dict(type="list", elements="path", default=[]),
            latest_checkpoint=dict(type="path", default=""),
        ),
        supports_check_mode=True,
    )
    check = module.check_mode
    result = dict(changed=False, directories=[], files=[], links=[], globbed={}, read={}, read_skipped={})
    if module.params["refuse"]:
        module.fail_json(msg="\n".join(module.params["refuse"]), **result)
    for i, r in enumerate(module.params["roots"]):
        if not os.path.isabs(r):
            module.fail_json(msg="roots[%d]: %r is not an absolute path" % (i, r), **result)
    tree = Tree(module.params["roots"])
    diffs = []
    try:
        for i, d in enumerate(module.params["directories"]):
            path = d.get("path")
            if not path or not os.path.isabs(str(path)):
                module.fail_json(msg="directories[%d]: path must be an absolute path, got %r" % (i, path), **result)
            mode = parse_mode(d.get("mode"), None, "directories[%d] (%s)" % (i, path))
            changed, created, kept = ensure_dir(tree, str(path), mode, check, bool(d.get("enforce_mode")))
            entry = dict(path=str(path), changed=changed, created=created)
            if kept:
                entry["mode_kept"] = kept
            result["directories"].append(entry)
            result["changed"] |= changed
        for i, f in enumerate(module.params["files"]):
            path = f.get("path")
            if not path or not os.path.isabs(str(path)):
                module.fail_json(msg="files[%d]: path must be an absolute path, got %r" % (i, path), **result)
            path = str(path)
            if not isinstance(f.get("content"), str):
                module.fail_json(msg="files[%d] (%s): content must be text" % (i, path), **result)
            data = f["content"].encode("utf-8")
            mode = parse_mode(f.get("mode"), 0o644, "files[%d] (%s)" % (i, path))
            try:
                changed, before = write_file(tree, path, data, mode, check)
            except FileNotFoundError:
                module.fail_json(msg="files[%d]: the directory of %s does not exist: list it in directories"
                                     % (i, path), **result)
            on_disk = before if check else data
            entry = dict(path=path, changed=changed)
            if on_disk is not None:
                entry.update(checksum=hashlib.sha256(on_disk).hexdigest(), size=len(on_disk))
                if module.params["return_content"]:
                    entry.update(content=base64.b64encode(on_disk).decode("ascii"), encoding="base64")
            result["files"].append(entry)
            result["changed"] |= changed
            if changed and module._diff:
                diffs.append(dict(before_header=path, after_header=path,
                                  before=(before or b"").decode("utf-8", errors="replace"),
                                  after=data.decode("utf-8", errors="replace")))
        for i, link in enumerate(module.params["links"]):
            path, target = link.get("path"), link.get("target")
            if not path or not os.path.isabs(str(path)):
                module.fail_json(msg="links[%d]: path must be an absolute path, got %r" % (i, path), **result)
            if not target:
                module.fail_json(msg="links[%d] (%s): target is empty" % (i, path), **result)
            changed = ensure_link(tree, str(path), str(target), check)
            result["links"].append(dict(path=str(path), changed=changed))
            result["changed"] |= changed
        result["globbed"] = {p: sorted(glob.glob(p)) for p in module.params["glob"]}
        for path in sorted({f for p in module.params["read"] for f in glob.glob(p)}):
            # A regular file only, found without following links below a root and never opened otherwise.
            data, why = read_small(tree, path)
            if data is None:
                result["read_skipped"][path] = why
            else:
                result["read"][path] = base64.b64encode(data).decode("ascii")
        if module.params["latest_checkpoint"]:
            result["latest_checkpoint"] = latest_complete_checkpoint(module.params["latest_checkpoint"]) or ""
    except (OSError, ValueError) as e:
        module.fail_json(msg=str(e), **result)
    finally:
        tree.close()
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
