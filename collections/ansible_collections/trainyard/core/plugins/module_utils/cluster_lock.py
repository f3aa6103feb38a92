# -*- coding: utf-8 -*-
"""The cluster lock: one changing operation at a time per cluster (stdlib and procgroup only).

Every playbook that changes the nodes or the job (site, reset, the NCCL check, ...) takes the lock on every
node, head first, before it touches anything, and gives it back at its end. The lock of a node is one file,
``<lock_dir>/cluster.lock``, holding a JSON record of its holder:

* who: the user, the controller's host name and boot id, the PID of the ``ansible-playbook`` process and that
  process's start time (field 22 of ``/proc/PID/stat``, so a reused PID is not mistaken for the holder);
* what: the playbooks on the command line, the tags and skip-tags;
* the run's token (a digest of who), so one run takes a node's lock again without waiting for itself.

The file appears atomically and complete: the record is written to a private temporary file (``O_CREAT |
O_EXCL | O_NOFOLLOW``) and ``link()``-ed to the lock's name, which fails with ``EEXIST`` while another holder
has it. Its modification time is the heartbeat: while the run lives, the callback cluster_lock (in
ansible-playbook's own process, plugin_utils/lock_keeper.py) touches it every few seconds, and the node itself measures its age (no clock skew between controller and node enters).

What a lock found held means is decided on the controller (``judge``): a holder of this controller, boot and PID
namespace whose process is gone, a zombie or a reused PID is provably dead and taken over; one whose heartbeat is
older than ``cluster_lock_stale_s`` may be alive: reported, broken only on request (``cluster_lock_break``).
``held_message`` is the one line a run stops with.

The node-side functions (``acquire``, ``release``, ``heartbeat``, ``read``) are used by
``library/cluster_lock.py``; the rest by ``action_plugins/cluster_lock_guard.py`` and the callback ``cluster_lock``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import time

from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg

VERSION = 1
LOCK_NAME = "cluster.lock"
PROC = "/proc"
# Set by the callback cluster_lock in ansible-playbook's environment: its PID, which the workers inherit.
PID_ENV = "TRAINYARD_ANSIBLE_PLAYBOOK_PID"
# Flags of every open of a file in the lock directory: never follow a link planted there.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_PLAYBOOK_SUFFIXES = (".yml", ".yaml")
# ansible-playbook options that take a value (the value is not a playbook).
_OPTS_WITH_VALUE = frozenset((
    "-i", "--inventory", "--inventory-file", "-e", "--extra-vars", "-t", "--tags", "--skip-tags", "-l", "--limit",
    "-u", "--user", "-c", "--connection", "-T", "--timeout", "-f", "--forks", "-M", "--module-path",
    "--vault-id", "--vault-password-file", "--vault-pass-file", "--private-key", "--key-file",
    "--ssh-common-args", "--sftp-extra-args", "--scp-extra-args", "--ssh-extra-args", "--become-method",
    "--become-user", "--become-password-file", "--connection-password-file", "--start-at-task", "-P", "--poll",
    "-B", "--background",
))


class LockError(Exception):
    """A lock directory or file that must not be used (wrong owner, group-writable, a link)."""


# ---------------------------------------------------------------- who and what (controller side)

def proc_start_ticks(pid, proc=PROC):
    """Start time of PID in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    return pg.start_ticks(pid, proc)


def boot_id(proc=PROC):
    """This machine's boot id ('' where /proc does not give one)."""
    try:
        with open(os.path.join(proc, "sys", "kernel", "random", "boot_id")) as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_alive(pid, ticks, proc=PROC):
    """True while PID runs and (when ticks is known) started at ticks; False when gone, a zombie (killed, not yet
    reaped by its parent) or another process (a reused PID); None when unknowable."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except (OSError, ValueError, TypeError):
        return None
    st = pg.read_stat(pid, proc)
    if st is not None and st.state in ("Z", "X"):
        return False
    if ticks is None:
        return True
    if st is None:
        return None if not os.path.isdir(proc) else False
    return st.start_ticks == int(ticks)


def pid_namespace(proc=PROC):
    """This process's PID namespace ('pid:[4026531836]'; '' where /proc does not say): PIDs are looked up only
    in the namespace that recorded them (two containers of one host share its boot id, not their PIDs)."""
    try:
        return os.readlink(os.path.join(proc, "self", "ns", "pid"))
    except OSError:
        return ""


def playbooks_from_argv(argv):
    """The playbook names (file names, no directories) on an ansible-playbook command line."""
    found = []
    skip = False
    for arg in list(argv or [])[1:]:
        if skip:
            skip = False
            continue
        if arg in _OPTS_WITH_VALUE:
            skip = True
            continue
        if arg.startswith("-"):
            continue
        if arg.endswith(_PLAYBOOK_SUFFIXES):
            found.append(os.path.basename(arg))
    return found


def run_token(host, boot, pid, ticks):
    """The token of one ansible-playbook run: the same for every node and play of the run."""
    text = "%s|%s|%s|%s" % (host, boot, int(pid), ticks)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def owner_record(user, host, boot, pid, ticks, playbooks, tags=None, skip_tags=None, pid_ns=""):
    """The lock record of this run (what the node stores; the node adds acquired_at)."""
    return {
        "version": VERSION,
        "token": run_token(host, boot, pid, ticks),
        "user": str(user or "?"),
        "host": str(host or "?"),
        "boot_id": str(boot or ""),
        "pid_ns": str(pid_ns or ""),
        "pid": int(pid),
        "pid_ticks": ticks,
        "playbooks": [str(p) for p in (playbooks or [])],
        "tags": [str(t) for t in (tags or ["all"])],
        "skip_tags": [str(t) for t in (skip_tags or [])],
    }


def _utc(ts):
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(ts)))
    except (TypeError, ValueError, OverflowError):
        return "an unknown time"


def _dur(seconds):
    s = max(0, int(round(float(seconds or 0))))
    if s < 120:
        return "%d s" % s
    if s < 7200:
        return "%d min" % (s // 60)
    return "%.1f h" % (s / 3600.0)


def describe(holder, age_s=None):
    """'alice@ctl1 (ansible-playbook PID 4242) running site.yml (tags: launch) since 2026-... UTC (3 min ago)'."""
    if not isinstance(holder, dict):
        return "an unknown holder"
    books = ", ".join(holder.get("playbooks") or []) or "a playbook"
    tags = [t for t in holder.get("tags") or [] if t != "all"]
    what = books + (" (tags: %s)" % ", ".join(tags) if tags else "")
    if holder.get("skip_tags"):
        what += " (skip-tags: %s)" % ", ".join(holder["skip_tags"])
    since = "since %s" % _utc(holder.get("acquired_at"))
    if age_s is not None:
        since += " (%s ago)" % _dur(age_s)
    return "%s@%s (ansible-playbook PID %s) running %s %s" % (
        holder.get("user", "?"), holder.get("host", "?"), holder.get("pid", "?"), what, since)


# What a lock held by another run is (judge): its holder runs, is provably dead, or is only probably gone.
LIVE, GONE, STALE = "live", "gone", "stale"


def judge(holder, heartbeat_age_s, stale_s, here_host, here_boot, alive=pid_alive, here_ns=None):
    """(LIVE | GONE | STALE, reason) for a lock found held by another run.

    A holder of this controller, boot and PID namespace is looked up: GONE (provably dead, taken over) once its
    process (PID and start time) no longer runs, LIVE while it does, whatever the heartbeat says. Any other
    holder, or an unreadable record, may be alive: STALE (broken only on request) once its heartbeat is older
    than stale_s, or at once when this controller restarted since (same host name, another boot id)."""
    here_ns = pid_namespace() if here_ns is None else here_ns
    if not isinstance(holder, dict) or not holder.get("token"):
        if heartbeat_age_s is not None and heartbeat_age_s > stale_s:
            return STALE, "the lock file is unreadable and %s old" % _dur(heartbeat_age_s)
        return LIVE, "the lock file is unreadable"
    if holder.get("host") == here_host:
        boot = holder.get("boot_id")
        if here_boot and boot and boot != here_boot:
            return STALE, "controller %s has restarted since it took the lock" % here_host
        same_ns = bool(here_ns) and holder.get("pid_ns") == here_ns
        if here_boot and boot == here_boot and same_ns:
            state = alive(holder.get("pid"), holder.get("pid_ticks"))
            if state is False:
                return GONE, "its ansible-playbook process %s no longer runs on %s" % (holder.get("pid"), here_host)
            if state is True:
                return LIVE, "its ansible-playbook process runs on this controller"
    if heartbeat_age_s is not None and heartbeat_age_s > stale_s:
        return STALE, "no heartbeat for %s (cluster_lock_stale_s is %s s)" % (_dur(heartbeat_age_s), stale_s)
    return LIVE, "its heartbeat is %s old" % _dur(heartbeat_age_s)


def takeover_message(node, holder, age_s, reason):
    """The warning of a run that took over the lock of a provably dead holder."""
    return ("%s: took over the cluster lock of %s: %s. Its job may be half started or half reset: check it "
            "(playbooks/status.yml) or run reset.yml." % (node, describe(holder, age_s), reason))


def held_message(node, path, holder, age_s, waited_s=None, stale_reason=None):
    """The one line a run stops with when a node's lock is held by another run."""
    who = describe(holder, age_s)
    if stale_reason is not None:
        return ("Cluster lock %s on %s is held by %s, but that holder is gone (%s). Fix: make sure that run is "
                "over (its job may be half started: reset.yml), then rerun with -e cluster_lock_break=true."
                % (path, node, who, stale_reason))
    return ("Cluster lock %s on %s is held by %s; waited %s (cluster_lock_wait_s). One operation at a time per "
            "cluster: wait for that run to end and rerun (playbooks/status.yml and preflight.yml need no lock), "
            "or raise cluster_lock_wait_s to wait longer." % (path, node, who, _dur(waited_s)))


def lock_dir_problem(lock_dir, mounted):
    """(what, fix) when cluster_lock_dir is unusable, else None. mounted: {variable: path} of the directories the
    training container mounts (the job must never see or remove the lock). The validate play states it once for
    every trainer (plugin_utils/cluster_model.py); check_lock_dir words it as one line."""
    if not isinstance(lock_dir, str) or not os.path.isabs(lock_dir):
        return ("cluster_lock_dir is not an absolute path: it is %r" % (lock_dir,),
                "set cluster_lock_dir to an absolute directory only root uses, e.g. /var/lib/trainyard-lock")
    norm = os.path.normpath(lock_dir)
    if norm == "/":
        return "cluster_lock_dir is /", "use a directory of its own, e.g. /var/lib/trainyard-lock"
    for var, path in sorted((mounted or {}).items()):
        if not isinstance(path, str) or not path:
            continue
        p = os.path.normpath(path)
        if norm == p or norm.startswith(p.rstrip("/") + "/") or p.startswith(norm.rstrip("/") + "/"):
            return ("cluster_lock_dir is inside or around a directory the training container mounts: "
                    "cluster_lock_dir %s and %s %s" % (lock_dir, var, path),
                    "put cluster_lock_dir outside it, e.g. /var/lib/trainyard-lock")
    return None


def check_lock_dir(lock_dir, mounted):
    """A 'Stop if ...' line when cluster_lock_dir is unusable (lock_dir_problem), else None."""
    problem = lock_dir_problem(lock_dir, mounted)
    return "Stop if %s. Fix: %s." % problem if problem else None


def heartbeat_interval(stale_s):
    """How often the heartbeat touches a held lock: a quarter of the stale limit (at least 1 s), so three beats
    can be missed before another controller may judge the holder gone. Each beat is one shell command on the node
    (plugin_utils/lock_keeper.py BEAT_SCRIPT): the default limit of 300 s costs a converged run one beat per node a
    minute and a quarter."""
    return max(1.0, float(stale_s) / 4.0)


# ---------------------------------------------------------------- the lock file (node side)

def ensure_dir(lock_dir, check_only=False):
    """Create lock_dir 0700 (parents 0755) if missing; refuse a link, another owner or group/other write."""
    if not check_only and not os.path.lexists(lock_dir):
        parent = os.path.dirname(lock_dir.rstrip("/")) or "/"
        if not os.path.isdir(parent):
            os.makedirs(parent, 0o755)
        try:
            os.mkdir(lock_dir, 0o700)
        except FileExistsError:
            pass
    try:
        st = os.lstat(lock_dir)
    except FileNotFoundError:
        if check_only:
            return
        raise
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise LockError("%s is not a directory (a link or a file): remove it; the lock directory must be a "
                        "plain directory only root can write" % lock_dir)
    if st.st_uid != os.geteuid():
        raise LockError("%s belongs to uid %d, not to uid %d: chown it or choose another cluster_lock_dir"
                        % (lock_dir, st.st_uid, os.geteuid()))
    if st.st_mode & 0o077:
        if check_only:
            raise LockError("%s is mode %o: it must be 0700" % (lock_dir, stat.S_IMODE(st.st_mode)))
        os.chmod(lock_dir, 0o700)


def read(lock_dir, now=None):
    """(record or None, age of the lock in s, age of its heartbeat in s); (None, None, None) when free.
    A file that is not a JSON object gives the record {} (unreadable)."""
    return _read_path(os.path.join(lock_dir, LOCK_NAME), now)


def _read_path(path, now=None):
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LockError("%s is a symbolic link: remove it" % path)
        raise
    try:
        st = os.fstat(fd)
        data = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    now = time.time() if now is None else now
    try:
        record = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        record = {}
    if not isinstance(record, dict):
        record = {}
    try:
        since = float(record.get("acquired_at", st.st_mtime))
    except (TypeError, ValueError):
        since = st.st_mtime
    return record, max(0.0, now - since), max(0.0, now - st.st_mtime)


def _write_private(lock_dir, record):
    """Write record to a new private file in lock_dir; its path."""
    tmp = os.path.join(lock_dir, ".%s.%s.%d.%d" % (LOCK_NAME, record.get("token", "x"), os.getpid(),
                                                   int(time.time() * 1e6)))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(record, sort_keys=True).encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _take_out(lock_dir, token):
    """Atomically move the lock aside if it holds token (a rename, then a check of what was moved: a lock
    that changed hands in between is linked back). True when removed."""
    path = os.path.join(lock_dir, LOCK_NAME)
    aside = os.path.join(lock_dir, ".%s.out.%d.%d" % (LOCK_NAME, os.getpid(), int(time.time() * 1e6)))
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    try:
        record, _, _ = _read_path(aside)
        if (record or {}).get("token") == token:
            return True
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        return False
    finally:
        try:
            os.unlink(aside)
        except FileNotFoundError:
            pass


def acquire(lock_dir, record, break_token=None, now=None, check_mode=False):
    """Take the lock for record (a dict with 'token').

    Returns {acquired, created, broken, holder, age_s, heartbeat_age_s}: created when this call made the
    lock, acquired also when the run already held it (its heartbeat is refreshed); holder is the record found
    when another run holds it. break_token removes a lock that holds exactly that token first (the caller
    judged it stale); a lock that changed hands since is left alone."""
    ensure_dir(lock_dir, check_only=check_mode)
    out = {"acquired": False, "created": False, "broken": None, "holder": None, "age_s": None,
           "heartbeat_age_s": None}
    token = record["token"]
    if break_token and break_token != token:
        found, _, _ = read(lock_dir)
        if found is not None and found.get("token", "") == break_token and not check_mode:
            if _take_out(lock_dir, break_token):
                out["broken"] = found
    if check_mode:
        found, age, hb = read(lock_dir) if os.path.isdir(lock_dir) else (None, None, None)
        if found is None or found.get("token") == token:
            out.update(acquired=True, created=found is None)
        else:
            out.update(holder=found, age_s=age, heartbeat_age_s=hb)
        return out
    rec = dict(record, acquired_at=time.time() if now is None else now)
    tmp = _write_private(lock_dir, rec)
    try:
        try:
            os.link(tmp, os.path.join(lock_dir, LOCK_NAME))
            out.update(acquired=True, created=True)
            return out
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    found, age, hb = read(lock_dir)
    if found is None:  # released between link() and read(): the caller tries again
        return out
    if found.get("token") == token:
        heartbeat(lock_dir, token)
        out.update(acquired=True, age_s=age, heartbeat_age_s=0.0)
        return out
    out.update(holder=found, age_s=age, heartbeat_age_s=hb)
    return out


def heartbeat(lock_dir, token):
    """Touch the lock when it holds token; False when it is not (any longer) this run's. The heartbeat the callback
    runs is the same rule in POSIX sh (plugin_utils/lock_keeper.py BEAT_SCRIPT, no Python on the node): change both."""
    path = os.path.join(lock_dir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    except (FileNotFoundError, OSError):
        return False
    try:
        try:
            record = json.loads(os.read(fd, 1 << 20).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return False
        if not isinstance(record, dict) or record.get("token") != token:
            return False
        if os.utime in getattr(os, "supports_fd", set()):
            os.utime(fd)
        else:
            os.utime(path)
        return True
    finally:
        os.close(fd)


def release(lock_dir, token):
    """Remove the lock when it holds token; True when removed (a lock of another run is never touched)."""
    if not os.path.isdir(lock_dir):
        return False
    return _take_out(lock_dir, token)
