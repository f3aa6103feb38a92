"""Module payloads kept between runs: what a converged run no longer builds.

Before Ansible runs a Python module on a node it builds the module's payload (AnsiballZ): it parses the module and,
one by one, every module_utils file the module imports, and zips them. It does this once per module and run, in the
run's own temporary directory (`C.DEFAULT_LOCAL_TMP`), which it deletes when the run ends; each of the module's
parses starts again from ansible-core's own module_utils. On a converged site.yml on two nodes this is a third of
the controller's CPU (py-spy: docs/benchmarks.md, "Module payloads kept between runs"), the same at every size.

The payloads depend on the sources only. This keeps them between runs, under the user's own Ansible temporary root
(`~/.ansible/tmp/trainyard-payloads/<fingerprint>/`, 0700), the fingerprint a hash of everything a payload can hold
or depend on: ansible-core's and Python's versions and locations, the module search paths, and the path, size and
modification time of every Python file of ansible-core and of every collection's and library directory's modules and
module_utils (the rule Python's own bytecode cache follows). Any change to a source gives a new fingerprint, so a
stale payload is never used; the last KEEP fingerprints are kept, older ones removed.

Ansible's cache files are pickles that ansible-playbook loads: a directory anyone but the user could write would let
them run code on the controller. The directory is created 0700 and is used only while it is the user's own and
neither group- nor world-writable, and so is its parent; otherwise the run builds its payloads as Ansible does, and
says why at -vvv.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
from pathlib import Path

DIR_NAME = "trainyard-payloads"
# Where Ansible keeps its payloads inside the run's temporary directory (ansible-core 2.19's module_common).
ANSIBALLZ = "ansiballz_cache"
KEEP = 8


def _py_files(root: Path):
    """(path, size, mtime_ns) of every .py file under root, sorted; nothing where root is not a directory."""
    out = []
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                p = os.path.join(dirpath, name)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                out.append((p, st.st_size, st.st_mtime_ns))
    return out


def source_roots(ansible_dir: Path, collection_roots: list[Path], module_paths: list[Path],
                 module_utils_paths: list[Path], playbook_dir: Path | None, roles_paths: list[Path]) -> list[Path]:
    """Every directory whose Python files a payload can hold, in a fixed order."""
    roots = [ansible_dir, *module_paths, *module_utils_paths]
    for croot in collection_roots:
        base = croot / "ansible_collections" if (croot / "ansible_collections").is_dir() else croot
        if not base.is_dir():
            continue
        for ns in sorted(p for p in base.iterdir() if p.is_dir()):
            for coll in sorted(p for p in ns.iterdir() if p.is_dir()):
                roots += [coll / "plugins" / "modules", coll / "plugins" / "module_utils"]
    role_dirs = [*roles_paths] + ([playbook_dir / "roles"] if playbook_dir else [])
    if playbook_dir:
        roots += [playbook_dir / "library", playbook_dir / "module_utils"]
    for rdir in role_dirs:
        if rdir.is_dir():
            for role in sorted(p for p in rdir.iterdir() if p.is_dir()):
                roots += [role / "library", role / "module_utils"]
    return roots


def fingerprint(roots: list[Path], versions: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for v in versions:
        h.update(v.encode() + b"\0")
    for root in roots:
        h.update(str(root).encode() + b"\1")
        for p, size, mtime in _py_files(root):
            h.update(f"{p}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()[:32]


def _private_dir(path: Path) -> str | None:
    """Why path may not hold payloads (None when it may): it must be a directory, not a link, owned by this user,
    writable by nobody else."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def store_dir(tmp_root: Path, fp: str, create: bool) -> tuple[Path | None, str | None]:
    """The fingerprint's directory under tmp_root/DIR_NAME, checked (and created 0700 when create): (dir, None) or
    (None, why not)."""
    why = _private_dir(tmp_root)
    if why:
        return None, why
    base = tmp_root / DIR_NAME
    d = base / fp
    if create:
        for p in (base, d):
            try:
                os.mkdir(p, 0o700)
            except FileExistsError:
                pass
            except OSError as e:
                return None, f"{p}: {e.strerror}"
    for p in (base, d):
        why = _private_dir(p)
        if why:
            return None, why
    return d, None


def _payloads(d: Path) -> list[Path]:
    """Ansible's finished cache files in d (not its locks, not a file being written)."""
    try:
        return sorted(p for p in d.iterdir() if p.is_file() and not p.is_symlink()
                      and not p.name.endswith((".lock", "-part", ".tmp")))
    except OSError:
        return []


def restore(store: Path, run_tmp: Path) -> int:
    """Put the kept payloads where this run's workers look first; returns how many. Linked where the two share a
    file system (Ansible replaces its cache files by rename, never rewrites them), else copied."""
    dest = run_tmp / ANSIBALLZ
    dest.mkdir(mode=0o700, exist_ok=True)
    n = 0
    for p in _payloads(store):
        target = dest / p.name
        if target.exists():
            continue
        try:
            os.link(p, target)
        except OSError:
            shutil.copy2(p, target)
        n += 1
    return n


def save(run_tmp: Path, store: Path) -> int:
    """Keep the payloads this run built that the store lacks (written under a temporary name, then renamed, so a
    concurrent run never reads half a file); returns how many."""
    n = 0
    for p in _payloads(run_tmp / ANSIBALLZ):
        target = store / p.name
        if target.exists():
            continue
        part = store / f".{p.name}.{os.getpid()}.tmp"
        try:
            shutil.copyfile(p, part)
            os.chmod(part, 0o600)
            os.replace(part, target)
            n += 1
        except OSError:
            part.unlink(missing_ok=True)
    try:
        os.utime(store)  # the most recently used fingerprints are the ones kept
    except OSError:
        pass
    return n


def prune(base: Path, keep: int = KEEP) -> list[str]:
    """Remove all but the `keep` most recently used fingerprint directories; returns the removed names."""
    try:
        dirs = sorted((p for p in base.iterdir() if p.is_dir() and not p.is_symlink()),
                      key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return []
    removed = []
    for d in dirs[keep:]:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d.name)
    return removed


def versions() -> tuple[str, ...]:
    from ansible.release import __version__
    return (__version__, sys.version, sys.executable)
