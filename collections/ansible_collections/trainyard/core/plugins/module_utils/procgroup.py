# -*- coding: utf-8 -*-
"""Processes of one launched job, found through /proc and signalled safely (stdlib only).

Nothing here finds or kills a process by name. A job is identified by what the launcher gave it:

* the leader: its PID *and* its start time (``start_ticks``, field 22 of ``/proc/PID/stat``), recorded at
  launch. A PID whose start time differs is somebody else's process (the PID was reused);
* a launch token: the launcher puts ``TRAINYARD_LAUNCH_ID=<token>`` into the environment of the job, every
  descendant inherits it (torchrun starts its workers in sessions of their own, so process group and session
  alone would miss them; an agent killed with -9 leaves its workers re-parented to init, so the parent chain
  alone would miss them too).

* the training container's cgroup (runtime docker): the launch records the container's id and its init process
  (PID + start time, from the engine). While that init still runs, every process whose ``/proc/PID/cgroup`` names
  the container and started no earlier than the launcher is the job's, except the init itself (so what the
  container's own command started before the launch is not). The job cannot leave its cgroup (the container's cgroup
  tree is read-only to it), so a process that double-forks, calls ``setsid`` and re-execs without the token is
  still found.

A process belongs to the job when it started no earlier than the leader and either descends from the
verified leader or carries the token, or sits in the recorded container's cgroup. ``find_job`` is the one rule:
the launch module's stop and status, ``job_reset`` and ``port_check`` all use it. Signals go through a pidfd
opened *before* the start time is checked again, so a PID recycled between the scan and the signal is never hit
(``os.kill`` where pidfds are missing); ``terminate`` freezes the set with SIGSTOP before it SIGKILLs, so nothing
forks away mid-kill.

Used by the launch module (status/stop), the launcher it writes next to the job, and reset.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time

TOKEN_ENV = "TRAINYARD_LAUNCH_ID"
PROC = "/proc"


class ProcStat(object):
    """The few fields of /proc/PID/stat this module needs."""

    __slots__ = ("pid", "comm", "state", "ppid", "pgrp", "session", "start_ticks")

    def __init__(self, pid, comm, state, ppid, pgrp, session, start_ticks):
        self.pid = pid
        self.comm = comm
        self.state = state
        self.ppid = ppid
        self.pgrp = pgrp
        self.session = session
        self.start_ticks = start_ticks

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self):
        return "ProcStat(%r)" % (self.as_dict(),)


def job_args(**more):
    """The argument spec of a module that works in one job's node-local state directory (doc fragment
    trainyard.core.attributes.job), with the module's own options."""
    return dict(job=dict(type="str", required=True), state_root=dict(type="path", default="/var/lib/trainyard"),
                **more)


def parse_stat(text):
    """Parse the text of /proc/PID/stat. The command name sits in parentheses and may itself contain
    spaces and parentheses, so the fields are split after the *last* ')'. Returns None on malformed text."""
    if not text:
        return None
    lpar = text.find("(")
    rpar = text.rfind(")")
    if lpar < 0 or rpar < lpar:
        return None
    try:
        pid = int(text[:lpar].strip())
    except ValueError:
        return None
    rest = text[rpar + 1:].split()
    # rest[0] is field 3 (state); field N is rest[N - 3]; start time is field 22.
    if len(rest) < 20:
        return None
    try:
        return ProcStat(pid=pid, comm=text[lpar + 1:rpar], state=rest[0], ppid=int(rest[1]), pgrp=int(rest[2]),
                        session=int(rest[3]), start_ticks=int(rest[19]))
    except ValueError:
        return None


def read_stat(pid, proc=PROC):
    """ProcStat of a live PID, or None when it does not exist (or vanished while reading)."""
    try:
        with open("%s/%d/stat" % (proc, int(pid)), "r") as f:
            return parse_stat(f.read())
    except (IOError, OSError, ValueError):
        return None


def start_ticks(pid, proc=PROC):
    st = read_stat(pid, proc)
    return st.start_ticks if st else None


def read_environ(pid, proc=PROC):
    """Environment of a process as a dict; None when it cannot be read (gone, or no permission)."""
    try:
        with open("%s/%d/environ" % (proc, int(pid)), "rb") as f:
            data = f.read()
    except (IOError, OSError, ValueError):
        return None
    return parse_environ(data)


def parse_environ(data):
    env = {}
    for item in data.split(b"\0"):
        if not item or b"=" not in item:
            continue
        k, _, v = item.partition(b"=")
        env[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return env


def read_cmdline(pid, proc=PROC):
    try:
        with open("%s/%d/cmdline" % (proc, int(pid)), "rb") as f:
            data = f.read()
    except (IOError, OSError, ValueError):
        return []
    return [a.decode("utf-8", "replace") for a in data.split(b"\0")[:-1]] if data else []


_CONTAINER_ID_CHARS = frozenset("0123456789abcdef")


def valid_container_id(cid):
    """A full container id as the engine reports it (64 lowercase hex digits); anything shorter could match a
    foreign cgroup by accident."""
    return isinstance(cid, str) and len(cid) == 64 and set(cid) <= _CONTAINER_ID_CHARS


def parse_cgroup(text):
    """The cgroup paths of /proc/PID/cgroup text (``hierarchy:controllers:path`` lines, v1 and v2)."""
    out = []
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2]:
            out.append(parts[2])
    return out


def read_cgroup(pid, proc=PROC):
    """The cgroup paths of a live PID; None when it cannot be read (gone)."""
    try:
        with open("%s/%d/cgroup" % (proc, int(pid)), "r") as f:
            return parse_cgroup(f.read(64 * 1024))
    except (IOError, OSError, ValueError):
        return None


def in_container_cgroup(paths, container_id):
    """Whether cgroup ``paths`` put a process inside the container ``container_id``: a path component names the
    full id (``/docker/<id>``, ``/system.slice/docker-<id>.scope``, a sub-cgroup below either)."""
    if not paths or not valid_container_id(container_id):
        return False
    for path in paths:
        for comp in path.split("/"):
            if comp == container_id or comp.endswith("-%s.scope" % container_id):
                return True
    return False


def container_record(state):
    """(container_id, init_pid, init_ticks) a launch state records for runtime docker, or None (no container, an
    older record, or wrong types: then the cgroup rule does not apply)."""
    if not isinstance(state, dict):
        return None
    cid, pid, ticks = state.get("container_id"), state.get("container_init_pid"), state.get("container_init_ticks")
    if not valid_container_id(cid):
        return None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or not isinstance(ticks, int) \
            or isinstance(ticks, bool):
        return None
    return cid, pid, ticks


def container_members(record, stats, cgroup_of=None, since=None):
    """The processes of ``stats`` inside the recorded container while its recorded init still runs (same PID and
    start time), the init excluded, started no earlier than ``since`` (the launcher's start: what the container's
    own command started before the launch is not the job's). A container restarted since (a new init) has none:
    its processes then are not the recorded job's."""
    if record is None:
        return []
    if cgroup_of is None:
        cgroup_of = read_cgroup
    cid, init_pid, init_ticks = record
    by_pid = {st.pid: st for st in stats}
    init = by_pid.get(init_pid)
    if init is None or init.start_ticks != init_ticks or init.state in ("Z", "X", "x"):
        return []
    if not in_container_cgroup(cgroup_of(init_pid), cid):
        return []  # the init is not where the record says: trust neither
    floor = max(init_ticks, since if isinstance(since, int) and not isinstance(since, bool) else init_ticks)
    return [st for st in stats if st.pid != init_pid and st.state not in ("Z", "X", "x")
            and st.start_ticks >= floor and in_container_cgroup(cgroup_of(st.pid), cid)]


def all_stats(proc=PROC):
    """ProcStat of every process visible in /proc (threads are not listed there)."""
    out = []
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        st = read_stat(int(name), proc)
        if st is not None:
            out.append(st)
    return out


def is_alive(pid, ticks, proc=PROC):
    """True when PID exists, is not a zombie, and started at ``ticks`` (it is the process we launched)."""
    if not pid:
        return False
    st = read_stat(pid, proc)
    return st is not None and st.state not in ("Z", "X", "x") and (ticks is None or st.start_ticks == int(ticks))


def descendants(root_pid, stats):
    """PIDs below root_pid in the parent tree of ``stats`` (root not included)."""
    children = {}
    for st in stats:
        children.setdefault(st.ppid, []).append(st.pid)
    out, todo, seen = [], [root_pid], {root_pid}
    while todo:
        p = todo.pop()
        for c in children.get(p, ()):
            if c not in seen:
                seen.add(c)
                out.append(c)
                todo.append(c)
    return out


def select_job(stats, leader_pid, leader_ticks, token=None, environ_of=None, include_zombies=False):
    """The processes of one job among ``stats`` (a list of ProcStat): the leader when its start time matches,
    its descendants, and any process that carries ``TRAINYARD_LAUNCH_ID=token``. Nothing older than the
    leader is ever selected. ``environ_of(pid)`` returns a process environment (default: /proc).
    Returns ProcStat objects sorted by PID."""
    if environ_of is None:
        environ_of = read_environ
    by_pid = {st.pid: st for st in stats}
    chosen = {}
    leader = by_pid.get(int(leader_pid)) if leader_pid else None
    if leader is not None and leader_ticks is not None and leader.start_ticks == int(leader_ticks):
        chosen[leader.pid] = leader
        for p in descendants(leader.pid, stats):
            chosen[p] = by_pid[p]
    if token:
        for st in stats:
            if st.pid in chosen:
                continue
            if leader_ticks is not None and st.start_ticks < int(leader_ticks):
                continue
            env = environ_of(st.pid)
            if env is not None and env.get(TOKEN_ENV) == token:
                chosen[st.pid] = st
    result = [st for st in chosen.values()
              if (leader_ticks is None or st.start_ticks >= int(leader_ticks))
              and (include_zombies or st.state not in ("Z", "X", "x"))]
    return sorted(result, key=lambda s: s.pid)


def recorded_job(state, stats, environ_of=None, cgroup_of=None, sidecars=True):
    """The processes of the job a launch state file records (launch.json: pid, start_ticks, token, pgid, and the
    same for each sidecar): for each leader, select_job, plus the members of its process group or session while
    that leader is still the process that started at its start_ticks, plus (runtime docker) every process in the
    recorded container's cgroup but its init (container_members). ``stats``: a list of ProcStat.
    ``sidecars=False`` leaves the sidecars out. Returns live ProcStat objects sorted by PID."""
    if not isinstance(state, dict):
        return []
    by_pid = {st.pid: st for st in stats}
    chosen = {}
    for st in container_members(container_record(state), stats, cgroup_of, state.get("start_ticks")):
        chosen[st.pid] = st
    entries = [state] + ([sc for sc in state.get("sidecars") or [] if isinstance(sc, dict)] if sidecars else [])
    for entry in entries:
        try:
            pid, ticks, pgid = int(entry.get("pid") or 0), int(entry["start_ticks"]), int(entry.get("pgid") or 0)
        except (KeyError, TypeError, ValueError):
            continue
        if not pid:
            continue
        for st in select_job(stats, pid, ticks, entry.get("token"), environ_of):
            chosen[st.pid] = st
        leader = by_pid.get(pid)
        if pgid and leader is not None and leader.start_ticks == ticks and leader.state not in ("Z", "X", "x"):
            for st in stats:
                if (st.pgrp == pgid or st.session == pgid) and st.start_ticks >= ticks \
                        and st.state not in ("Z", "X", "x"):
                    chosen[st.pid] = st
    return [chosen[p] for p in sorted(chosen)]


def find_job(states, proc=PROC, exclude=(), sidecars=True):
    """The live processes of the jobs the launch ``states`` record (launch.json dicts) on this machine: the one
    rule of "which processes are this job's" (recorded_job over one /proc scan), used by the launch's stop and
    status, ``job_reset`` and ``port_check``. PIDs in ``exclude`` (the caller and its ancestors) are never
    returned. ProcStat objects sorted by PID."""
    stats = all_stats(proc)
    env_of = (lambda pid: read_environ(pid, proc))
    cg_of = (lambda pid: read_cgroup(pid, proc))
    chosen = {}
    for state in states:
        for st in recorded_job(state, stats, env_of, cg_of, sidecars):
            if st.pid not in exclude:
                chosen[st.pid] = st
    return [chosen[p] for p in sorted(chosen)]


def job_procs(state, proc=PROC):
    """The job's own processes without its sidecars (the janitor, the fail-fast watcher): what makes a job
    "running" for the launch's status and the host probe's busy read. find_job's rule, sidecars left out."""
    skip = set(sc.get("pid") for sc in state.get("sidecars", []))
    return [st for st in find_job([state], proc=proc, sidecars=False) if st.pid not in skip]


def job_ranks(state, stats, environ_of=None, limit=None):
    """The ranks of the job ``state`` records, from /proc only: the direct children of the torchrun agent the
    launch recorded (``torchrun_pid``, verified by its start time ``torchrun_start_ticks`` when recorded, and as
    a child of the verified launcher), with integer ``RANK`` and ``LOCAL_RANK`` in their environment, one per local
    rank below ``limit`` (the launch's nproc_per_node). Any other process the job starts, whatever its environment,
    is no rank. Returns [{rank, local_rank, pid, start_ticks, state}] sorted by rank."""
    if environ_of is None:
        environ_of = read_environ
    if not isinstance(state, dict):
        return []
    by_pid = {st.pid: st for st in stats}
    try:
        lpid, lticks, apid = int(state["pid"]), int(state["start_ticks"]), int(state.get("torchrun_pid") or 0)
    except (KeyError, TypeError, ValueError):
        return []
    leader, agent = by_pid.get(lpid), by_pid.get(apid)
    aticks = state.get("torchrun_start_ticks")
    if leader is None or leader.start_ticks != lticks or agent is None or agent.ppid != lpid \
            or agent.start_ticks < lticks:
        return []
    if isinstance(aticks, int) and not isinstance(aticks, bool) and agent.start_ticks != aticks:
        return []
    out = []
    for st in stats:
        if st.ppid != apid or st.start_ticks < agent.start_ticks or st.state in ("Z", "X", "x"):
            continue
        env = environ_of(st.pid) or {}
        try:
            rank, local = int(env["RANK"]), int(env["LOCAL_RANK"])
        except (KeyError, TypeError, ValueError):
            continue
        if rank < 0 or local < 0 or (limit is not None and local >= int(limit)):
            continue
        out.append({"rank": rank, "local_rank": local, "pid": st.pid, "start_ticks": st.start_ticks,
                    "state": st.state})
    one = {}
    for c in sorted(out, key=lambda c: (c["start_ticks"], c["pid"])):
        one.setdefault(c["local_rank"], c)  # torchrun starts one worker per local rank
    return sorted(one.values(), key=lambda c: (c["rank"], c["pid"]))


def recorded_alive(state, proc=PROC):
    """Whether the leader a launch state file records still runs (same PID, same start time, not a zombie)."""
    try:
        return is_alive(int(state["pid"]), int(state["start_ticks"]), proc)
    except (KeyError, TypeError, ValueError):
        return False


def running(targets, proc=PROC):
    """ProcStat of each (pid, start_ticks) in targets that is still that process and not a zombie."""
    out = []
    for pid, ticks in targets:
        st = read_stat(pid, proc)
        if st is not None and st.start_ticks == int(ticks) and st.state not in ("Z", "X", "x"):
            out.append(st)
    return out


def job_processes(leader_pid, leader_ticks, token=None, proc=PROC, exclude=()):
    """Live processes of one job on this machine (see select_job)."""
    env_of = (lambda pid: read_environ(pid, proc))
    return [st for st in select_job(all_stats(proc), leader_pid, leader_ticks, token, env_of)
            if st.pid not in exclude]


def _pidfd_open(pid):
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError as e:
        if e.errno == errno.ESRCH:
            raise ProcessLookupError(pid)
        return None  # ENOSYS and friends: fall back to kill()


def signal_process(pid, ticks, sig, proc=PROC):
    """Send ``sig`` to PID only if it is still the process that started at ``ticks``.
    Returns True when the signal was delivered."""
    try:
        fd = _pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        # With a pidfd held, the PID cannot be recycled under us: check the start time, then signal.
        st = read_stat(pid, proc)
        if st is None or st.start_ticks != int(ticks):
            return False
        try:
            sender = getattr(signal, "pidfd_send_signal", None)
            if fd is not None and sender is not None:
                sender(fd, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return False
        except OSError as e:
            if e.errno == errno.ESRCH:
                return False
            raise
        return True
    finally:
        if fd is not None:
            os.close(fd)


def signal_group(pgid, leader_ticks, sig, proc=PROC):
    """killpg(pgid) only when the group leader is alive and is the process that started at ``leader_ticks``.
    Returns True when sent. (Members of a group whose leader is gone are signalled one by one instead.)"""
    st = read_stat(pgid, proc)
    if st is None or st.start_ticks != int(leader_ticks) or st.pgrp != int(pgid):
        return False
    try:
        os.killpg(int(pgid), sig)
    except OSError:
        return False
    return True


def terminate(find, grace=10.0, poll=0.1, kill_after=True, sleep=time.sleep, clock=time.monotonic):
    """SIGTERM every process ``find()`` returns (a list of ProcStat), re-scan until they are gone or ``grace``
    seconds passed, then SIGKILL the stragglers. Re-scanning catches processes started meanwhile.
    Returns {"terminated": [pids], "killed": [pids], "remaining": [pids]}."""
    termed, killed = set(), set()
    deadline = clock() + grace
    while True:
        procs = find()
        if not procs:
            break
        for st in procs:
            if st.pid not in termed and signal_process(st.pid, st.start_ticks, signal.SIGTERM):
                termed.add(st.pid)
        if clock() >= deadline:
            break
        sleep(poll)
    if kill_after:
        for _ in range(50):
            procs = freeze(find)
            if not procs:
                break
            for st in procs:
                if signal_process(st.pid, st.start_ticks, signal.SIGKILL):
                    killed.add(st.pid)
            sleep(poll)
    remaining = [st.pid for st in find()]
    return {"terminated": sorted(termed), "killed": sorted(killed), "remaining": remaining}


def freeze(find, rounds=20):
    """SIGSTOP every process ``find()`` returns, again and again until a scan finds none that is not stopped yet
    (a stopped process cannot fork), so the set is complete before it is killed. Returns the ProcStat of every
    process stopped or found."""
    frozen = {}
    for _ in range(rounds):
        new = [st for st in find() if st.pid not in frozen]
        if not new:
            break
        for st in new:
            signal_process(st.pid, st.start_ticks, signal.SIGSTOP)
            frozen[st.pid] = st
    return [frozen[p] for p in sorted(frozen)]


def start_detached(argv, log_path=None, cwd=None, env=None):
    """Start argv in a new session (its own process group) with stdin from /dev/null and output appended to
    log_path (or /dev/null); it outlives the caller. Returns (pid, start_ticks)."""
    # The log may carry the job's command line and output: readable by its owner and group only.
    # A sidecar's log is in the host-only directory; a link there is refused all the same (never followed).
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640) \
        if log_path else subprocess.DEVNULL
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                             env=env, close_fds=True, start_new_session=True)
    finally:
        if log_path:
            os.close(out)
    ticks = None
    for _ in range(50):
        ticks = start_ticks(p.pid)
        if ticks is not None:
            break
        time.sleep(0.01)
    # The child is never waited for: it lives on after this process exits.
    p.returncode = 0  # keep Popen.__del__ from warning about a running child
    return p.pid, ticks
