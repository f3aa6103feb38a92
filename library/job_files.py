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
  read: {description: Patterns of small files (1 MiB at most) read back after the writes., type: list, elements: str, default: []}
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
"""

import base64
import glob
import hashlib
import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule


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


def read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def ensure_dir(path, mode, check, enforce_mode=False):
    """(changed, created, mode_kept) for one directory. A missing directory is created with mode (0755 when None).
    An existing one is never changed (mode or owner): it may be a system or shared directory the job does not own;
    its mode is reported as mode_kept when it differs. Only enforce_mode sets the mode of an existing directory."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise OSError("%s exists and is not a directory" % path)
    if not os.path.isdir(path):
        if not check:
            os.makedirs(path, 0o755 if mode is None else mode)
            os.chmod(path, 0o755 if mode is None else mode)
        return True, True, None
    current = stat.S_IMODE(os.stat(path).st_mode)
    if mode is None or current == mode:
        return False, False, None
    if enforce_mode:
        if not check:
            os.chmod(path, mode)
        return True, False, None
    return False, False, "%04o" % current


def write_file(path, data, mode, check):
    """(changed, before) for one file; writes atomically unless check."""
    if os.path.isdir(path):
        raise OSError("%s is a directory" % path)
    before = read_bytes(path)
    same_content = before == data
    same_mode = before is not None and stat.S_IMODE(os.stat(path).st_mode) == mode
    if same_content and same_mode:
        return False, before
    if check:
        return True, before
    if same_content:
        os.chmod(path, mode)
        return True, before
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True, before


def ensure_link(path, target, check):
    """Whether the symlink at path was (or would be) made to point at target; atomic replace."""
    if os.path.islink(path):
        if os.readlink(path) == target:
            return False
    elif os.path.lexists(path):
        raise OSError("%s exists and is not a symbolic link" % path)
    if check:
        return True
    tmp = os.path.join(os.path.dirname(path), ".%s.%d.tmp" % (os.path.basename(path), os.getpid()))
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


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
        ),
        supports_check_mode=True,
    )
    check = module.check_mode
    result = dict(changed=False, directories=[], files=[], links=[], globbed={}, read={})
    if module.params["refuse"]:
        module.fail_json(msg="\n".join(module.params["refuse"]), **result)
    diffs = []
    try:
        for i, d in enumerate(module.params["directories"]):
            path = d.get("path")
            if not path or not os.path.isabs(str(path)):
                module.fail_json(msg="directories[%d]: path must be an absolute path, got %r" % (i, path), **result)
            mode = parse_mode(d.get("mode"), None, "directories[%d] (%s)" % (i, path))
            changed, created, kept = ensure_dir(str(path), mode, check, bool(d.get("enforce_mode")))
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
            if not check and not os.path.isdir(os.path.dirname(path)):
                module.fail_json(msg="files[%d]: the directory of %s does not exist: list it in directories"
                                     % (i, path), **result)
            changed, before = write_file(path, data, mode, check)
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
            changed = ensure_link(str(path), str(target), check)
            result["links"].append(dict(path=str(path), changed=changed))
            result["changed"] |= changed
        result["globbed"] = {p: sorted(glob.glob(p)) for p in module.params["glob"]}
        for path in sorted({f for p in module.params["read"] for f in glob.glob(p)}):
            # A regular file only, its last component not followed (what it reads is a node's own state).
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size <= 1 << 20:
                with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                    result["read"][path] = base64.b64encode(f.read()).decode("ascii")
    except (OSError, ValueError) as e:
        module.fail_json(msg=str(e), **result)
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
