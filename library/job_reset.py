#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module job_reset: clean one job's leftovers from a node after a crash (processes, shm, port)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_reset
short_description: Remove one training job's leftovers from a node (processes, shared memory, rendezvous port)
description:
  - Reads the job's launch state (C(<state_root>/<job>/launch.json), or the copy passed in C(launch_state)
    when the launch role already removed the file) and cleans what that job left behind. Nothing is found or
    killed by name.
  - "Processes: the job's are the launch leader when its PID and start time (C(start_ticks)) match, its
    descendants, members of its process group or session while that leader is verified, any process
    that carries the job's launch token (C(TRAINYARD_LAUNCH_ID)) and started no earlier than the leader, and
    (runtime docker) every process in the recorded training container's cgroup but its init while that init
    runs; the same for each sidecar (C(procgroup.find_job), the rule C(torchrun_launch state=stopped) uses).
    They get SIGTERM, then are frozen (SIGSTOP) and get SIGKILL after C(stop_timeout). Processes of anything else
    that hold a GPU device (C(/dev/nvidia*)) are reported in C(gpu_users), never killed."
  - "Files: top-level entries of C(/dev/shm) and C(/tmp) whose names match C(patterns)
    (C(torch_*), C(nccl-*), C(.torch_distributed_*), ...). An entry is this job's when a process of the job
    held it open or mapped it, or when all of these hold: owned by the job's user (the owner of the state
    directory), changed no earlier than the job started (C(started_at) from the state, else the last start
    line of the job log), not held open or mapped by any live process outside the job, and not named
    C(torch_<pid>_...) after a live process outside the job. Everything else is reported in C(kept) with the
    reason, never removed. Symlinks are removed as links, never followed."
  - "Port: the holders of C(port) (default: the state's C(master_port)), a socket listening on it or bound to it
    and not listening, are found through C(/proc/net/tcp*) and the sockets in C(/proc/*/fd), by the rule the
    preflight's C(port_check) uses (C(module_utils/proc_sockets.py)). A holder of the job is killed with the job;
    any other holder is reported (PID and command) and left alone."
  - "The launch's own records (with I(remove_state)): once no process of the job is left, its launch state
    (C(launch.json), C(launch.pid.json), C(launch.spec.json)) is removed, the secret files in I(secrets_dir) are
    deleted (the directory stays: the training container mounts it) and I(secret_env_file) is removed. Links are
    never followed. This is the launch role's C(tasks/reset.yml): one call per node stops the job and cleans after it."
  - Check mode reports what would be done. Idempotent; on a clean node C(changed=false).
version_added: "1.0.0"
author: trainyard
options:
  launch_state:
    description:
      - The job's launch.json content read before the launch role's reset removed it (a dict). Used together
        with the file when both exist (the file wins for the same launch token).
    type: dict
  port:
    description: Rendezvous port to free (C(cluster_rendezvous_port)); 0 takes the state's C(master_port).
    type: int
    default: 0
  patterns:
    description: Glob patterns of leftover names, per directory.
    type: dict
    default:
      /dev/shm: ["torch_*", "nccl-*", "sem.mp-*", "sem.loky-*", "__KMP_REGISTERED_LIB_*", "psm_*", "psm2_*"]
      /tmp: [".torch_distributed_*", "torchelastic_*", "pymp-*", ".nccl-*"]
  stop_timeout:
    description: Seconds between SIGTERM and SIGKILL.
    type: float
    default: 10
  started_slack:
    description: Seconds before the job's recorded start that still count as its lifetime (clock granularity).
    type: float
    default: 2
  gpu_devices:
    description: Path prefix of GPU device files; processes outside the job holding one are reported.
    type: str
    default: /dev/nvidia
  container:
    description: The training container's name; its state (C(docker inspect), read-only) is returned in C(container)
      so that the container role's reset needs no read of its own. Empty reads nothing.
    type: str
    default: ""
  probe_paths:
    description: Paths whose existence the caller's next steps need (for example the janitor's systemd timer), read in
      the same call and returned in C(probed). Nothing is opened or followed. With I(release_lock), one that exists
      keeps the lock (the step it stands for changes the node after this call).
    type: list
    elements: path
    default: []
  container_restart:
    description:
      - The container role's reset policy (C(reset_container)), judged here on the state read in the same call and
        returned in C(container.action) (C(restart), C(create), C(read) when the engine did not answer, or C(none)).
        C(auto) restarts a container that is stopped or in which the job left files this call removed; C(always)
        restarts it; C(never) (or an empty I(container)) leaves it alone. A missing container is created unless
        C(never).
    type: str
    choices: [auto, always, never]
    default: never
  release_lock:
    description:
      - "The node's cluster lock to give back at the end of this call, C({path, token}) (C(cluster_lock_dir) and the
        run's token): only when this call is the node's last change of the run, that is when no process of the job
        survived, C(container.action) is C(none), no I(probe_paths) exists and I(keep_lock) is false. Saves the
        release's own round trip; C(lock_released) says whether it was given back. A lock of another run is never
        touched. Check mode releases nothing."
    type: dict
    default: {}
  keep_lock:
    description: "A later step of the caller changes the node whatever this call finds (for example a GPU reset): the
      lock is not given back here."
    type: bool
    default: false
  remove_state:
    description: Remove the job's launch state files once none of its processes is left (what C(torchrun_launch
      state=stopped) does after its stop).
    type: bool
    default: false
  secrets_dir:
    description: Directory of the job's secret files (C(launch_secret_env_dir)); with I(remove_state) its files are
      deleted. Empty leaves it alone.
    type: path
    default: ""
  secret_env_file:
    description: The job's secrets env file (C(launch_secret_env_file)); with I(remove_state) it is removed.
    type: path
    default: ""
extends_documentation_fragment: [trainyard.core.attributes, trainyard.core.attributes.job]
notes:
  - Processes are matched with C(module_utils/procgroup.py) (PID + start time + launch token + container cgroup).
"""

EXAMPLES = r"""
- name: Read the launch state before the launch role removes it
  ansible.builtin.slurp:
    src: /var/lib/trainyard/train/launch.json
  register: __launch_state
  failed_when: false

- name: Clean this job's leftovers
  job_reset:
    job: train
    state_root: /var/lib/trainyard
    port: 39500
    launch_state: "{{ (__launch_state.content | b64decode | from_json) if __launch_state.content is defined else omit }}"
  register: __reset

- name: Stop the job and clean after it in one call (the launch role's reset)
  job_reset:
    job: train
    state_root: /var/lib/trainyard
    port: 39500
    stop_timeout: 30
    remove_state: true
    secrets_dir: /run/trainyard/train/secrets
    secret_env_file: /run/trainyard/train/secret.env
"""

RETURN = r"""
lock_released:
  description: This call gave back the node's cluster lock (I(release_lock)).
  returned: always
  type: bool

found:
  description: What belonged to the job when the module started.
  returned: always
  type: dict
  contains:
    processes: {description: "[{pid, comm, cmdline}] of the job and its sidecars", type: list}
    files: {description: leftover paths attributed to the job, type: list}
    port_holders: {description: "[{pid, cmdline, ours}] holding the port (listening, or bound and not listening)", type: list}
cleaned:
  description: What was removed (in check mode, what would be).
  returned: always
  type: dict
  contains:
    terminated: {description: PIDs that got SIGTERM, type: list}
    killed: {description: PIDs that needed SIGKILL, type: list}
    files: {description: paths removed, type: list}
    bytes: {description: bytes of the files removed, type: int}
kept:
  description: "Matching leftovers that are not this job's: [{path, why}]."
  returned: always
  type: list
gpu_users:
  description: "Processes outside the job holding /dev/nvidia*: [{pid, cmdline, devices}] (reported, not killed)."
  returned: always
  type: list
port:
  description: "{port, free, holders}: the port after cleaning."
  returned: always
  type: dict
records:
  description: "With I(remove_state): the launch records removed (in check mode, that would be): state files,
    secret files and the secrets env file, as paths."
  returned: always
  type: list
probed:
  description: "C({path: true|false}): whether each of I(probe_paths) exists (a dangling link counts)."
  returned: always
  type: dict
container:
  description: "With I(container): C({name, exists, running, action}) after the stop, or C({name, error, action})
    when the engine did not answer (the caller reads it itself then); C(action) is I(container_restart)'s verdict
    (C(restart), C(create), C(read) or C(none))."
  returned: when I(container) is given
  type: dict
summary:
  description: One line for the per-node summary.
  returned: always
  type: str
"""

import fnmatch
import json
import os
import re
import stat
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils import cluster_lock
from ansible_collections.trainyard.core.plugins.module_utils import jobtree as jt
from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg
from ansible_collections.trainyard.core.plugins.module_utils.proc_sockets import fd_targets, port_holders, socket_inode

STATE_FILE = "launch.json"
# The launch's records of one start (module_utils/torchrun.py: STATE_FILE, PID_FILE, SPEC_FILE).
RECORD_FILES = ("launch.json", "launch.pid.json", "launch.spec.json")
START_LINE = re.compile(r"^trainyard-launch: (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d) start ", re.M)
TORCH_SHM = re.compile(r"^torch_(\d+)_")


# ------------------------------------------------------------------------------------------ pure helpers

def started_from_log(text):
    """Epoch seconds of the last 'trainyard-launch: <time> start' line of a job log (local time), or None."""
    matches = START_LINE.findall(text or "")
    if not matches:
        return None
    try:
        return time.mktime(time.strptime(matches[-1], "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def match_patterns(name, patterns):
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def holder_words(others):
    """'held by PID 12 (unix socket /tmp/pymp-x/listener-1) (not this job)' from {pid: how} (or a set of PIDs);
    PID 0 stands for a holder this module cannot see (a socket of another PID namespace)."""
    if not isinstance(others, dict):
        return "held open by PID %s (not this job)" % ",".join(str(p) for p in sorted(others))
    parts = [("held open by PID %d" % p) if others[p] == "open file" else
             "held by %s (%s)" % ("PID %d" % p if p else "a process not visible here", others[p])
             for p in sorted(others)]
    return "%s (not this job)" % ", ".join(parts)


def parse_proc_net_unix(text):
    """{inode: path} of the unix sockets bound to a file system path, from the text of /proc/net/unix
    (abstract sockets, '@name', are not files and are left out)."""
    out = {}
    for line in text.splitlines()[1:]:
        f = line.split(None, 7)
        if len(f) == 8 and f[7].startswith("/"):
            out[f[6]] = f[7].rstrip("\n")
    return out


def state_problem(state):
    """Why a launch state cannot steer this module (None when it can): PIDs and start times must be integers."""
    if not isinstance(state, dict):
        return "not a JSON object"
    leaders = [("", state)]
    sidecars = state.get("sidecars", [])
    if not isinstance(sidecars, list) or not all(isinstance(sc, dict) for sc in sidecars):
        return "field 'sidecars' is not a list of objects"
    leaders += [("sidecars[%d]." % i, sc) for i, sc in enumerate(sidecars)]
    for prefix, s in leaders:
        for key in ("pid", "pgid", "start_ticks"):
            v = s.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                return "field '%s%s' is not an integer" % (prefix, key)
        for key in ("token", "log"):
            if s.get(key) is not None and not isinstance(s.get(key), str):
                return "field '%s%s' is not a string" % (prefix, key)
    if state.get("master_port") is not None and not isinstance(state.get("master_port"), int):
        return "field 'master_port' is not an integer"
    if state.get("started_at") is not None and not isinstance(state.get("started_at"), (int, float)):
        return "field 'started_at' is not a number"
    return None


def attribute(entry, job, holders_of, live_others):
    """Decide whether a leftover entry is this job's.

    entry: {path, name, uid, ctime, mtime}; job: {uid, started_at, held (set of paths its processes held)};
    holders_of: path -> set of live PIDs (outside the job) holding it open or mapped;
    live_others: set of live PIDs outside the job. Returns (ours: bool, why: str).
    """
    path = entry["path"]
    others = holders_of.get(path) or set()
    if others:
        return False, holder_words(others)
    if path in job["held"]:
        return True, "held by the job"
    m = TORCH_SHM.match(entry["name"])
    if m and int(m.group(1)) in live_others:
        return False, "created by live PID %s (not this job)" % m.group(1)
    if job["started_at"] is None:
        return False, "job start time unknown (no launch state or log): not attributed"
    if job["uid"] is not None and entry["uid"] != job["uid"]:
        return False, "owned by uid %d, the job runs as uid %d" % (entry["uid"], job["uid"])
    if max(entry["ctime"], entry["mtime"]) < job["started_at"]:
        return False, "older than the job (changed %s, job started %s)" % (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(max(entry["ctime"], entry["mtime"]))),
            time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(job["started_at"])))
    return True, "created during the job by its user, held by no one"


# --------------------------------------------------------------------------------------------- /proc scans

def proc_mapped_paths(pid):
    out = set()
    try:
        with open("/proc/%d/maps" % pid) as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    out.add(parts[5].rstrip("\n").replace(" (deleted)", ""))
    except (IOError, OSError):
        pass
    return out


def unix_sockets():
    """{inode: path} of every unix socket bound to a path in this network namespace."""
    try:
        with open("/proc/net/unix") as f:
            return parse_proc_net_unix(f.read())
    except (IOError, OSError):
        return {}


def held_paths(pid, unix=None):
    """{path: how} for everything a process holds: open files, unix sockets bound to a path (through their
    socket inode), mapped files, its working directory and its root (when not /)."""
    out = {}
    for t in fd_targets(pid):
        if t.startswith("/"):
            out.setdefault(t, "open file")
        elif unix and socket_inode(t) is not None:
            path = unix.get(str(socket_inode(t)))
            if path:
                out[path] = "unix socket %s" % path
    for path in proc_mapped_paths(pid):
        out.setdefault(path, "mapped")
    for name in ("cwd", "root"):
        try:
            path = os.readlink("/proc/%d/%s" % (pid, name))
        except OSError:
            continue
        if path.startswith("/") and path != "/":
            out.setdefault(path.replace(" (deleted)", ""), "working directory" if name == "cwd" else "root")
    return out


def open_paths(pid, unix=None):
    return set(held_paths(pid, unix))


def port_owners(port, ours, proc=pg.PROC):
    """The processes holding ``port`` ({pid, comm, cmdline, ours}), through module_utils/proc_sockets.py (the
    rule the preflight's port_check uses too); a holding socket no visible process has is one entry, pid None."""
    stats = dict((st.pid, st) for st in pg.all_stats(proc))
    sockets = port_holders(port, stats, proc)
    if not sockets:
        return []
    out = []
    for pid in sorted(set(pid for s in sockets for pid in s["pids"])):
        out.append({"pid": pid, "comm": stats[pid].comm, "cmdline": pg.read_cmdline(pid, proc), "ours": pid in ours})
    if not out:
        out.append({"pid": None, "comm": "", "cmdline": [], "ours": False,
                    "note": "a socket holds the port but no visible process has it (another PID namespace?)"})
    return out


def container_action(policy, state, files_removed):
    """What the container role's reset does after this call: 'restart', 'create', 'read' (the engine did not
    answer: it reads again) or 'none'. policy: reset_container (auto | always | never); state: container_state()
    or None when no container was asked for; files_removed: the job left files this call removed."""
    if not state or policy == "never":
        return "none"
    if state.get("error"):
        return "read"
    if not state.get("exists"):
        return "create"
    if policy == "always" or files_removed or not state.get("running"):
        return "restart"
    return "none"


def last_change(container_act, probed, keep_lock, remaining):
    """True when nothing of the caller changes the node after this call: the lock may be given back in it."""
    return container_act == "none" and not any((probed or {}).values()) and not keep_lock and not remaining


def unlink_in(dir_path, names=None, check=False):
    """Remove the entries ``names`` (all entries when None) of the directory ``dir_path`` that are not directories,
    through a descriptor of the directory opened without following a link (a planted link is removed as a link).
    A missing or linked directory removes nothing. Returns the paths removed (in check mode, that would be)."""
    try:
        fd = os.open(dir_path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    out = []
    try:
        for name in sorted(os.listdir(fd)) if names is None else names:
            try:
                st = os.lstat(name, dir_fd=fd)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            if not check:
                os.unlink(name, dir_fd=fd)
            out.append(os.path.join(dir_path, name))
    finally:
        os.close(fd)
    return out


class Reset(object):
    def __init__(self, module):
        self.m = module
        p = module.params
        self.p = p
        self.job = p["job"]
        if not self.job or "/" in self.job or self.job in (".", ".."):
            module.fail_json(msg="job %r: a job name names a directory (no '/')" % (self.job,))
        self.dir = os.path.join(p["state_root"], self.job)
        self.me = self.my_lineage()
        self.found = {"processes": [], "files": [], "port_holders": [], "state": None}
        self.cleaned = {"terminated": [], "killed": [], "files": [], "bytes": 0}
        self.kept = []
        self.records = []
        self.remaining = []
        self.warnings = []

    @staticmethod
    def my_lineage():
        """This module's process and its ancestors: never selected, whatever they carry."""
        out, pid = set(), os.getpid()
        while pid and pid not in out:
            out.add(pid)
            st = pg.read_stat(pid)
            pid = st.ppid if st else 0
        return out

    # ------------------------------------------------------------------ state
    def states(self):
        """The launch states to clean: the file and/or the copy passed in (different launches both count).
        A torn or forged state (not an object, PIDs that are not integers) is named and not used."""
        out = []
        self.state_problems = []
        path = os.path.join(self.dir, STATE_FILE)
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    data = json.load(f)
                why = state_problem(data)
            except (IOError, OSError, ValueError) as e:
                data, why = None, str(e)
            if why:
                self.state_problems.append("%s is unreadable (%s): processes found by it are not cleaned; remove "
                                           "it after checking no process of job %s runs" % (path, why, self.job))
            else:
                out.append(data)
        given = self.p["launch_state"]
        if given and isinstance(given, dict) and given.get("pid"):
            why = state_problem(given)
            if why:
                self.state_problems.append("launch_state (the copy passed in) is unusable (%s): not cleaned" % why)
            elif not any(s.get("token") == given.get("token") and s.get("pid") == given.get("pid") for s in out):
                out.append(given)
        self.warnings.extend(self.state_problems)
        return out

    def job_uid(self):
        for path in (os.path.join(self.dir, STATE_FILE), self.dir):
            try:
                return os.lstat(path).st_uid
            except OSError:
                continue
        return None

    def started_at(self, states):
        times = [float(s["started_at"]) for s in states if isinstance(s.get("started_at"), (int, float))]
        if times:
            return min(times)
        logs = [s.get("log") for s in states if s.get("log")] + [os.path.join(self.dir, "torchrun.log")]
        for log in logs:
            try:  # job-rw/torchrun.log: the job's; a regular file only, never a FIFO or device it planted
                fd = jt.open_root(os.path.dirname(log) or ".")
                try:
                    head = jt.read_bytes(fd, os.path.basename(log), 4 * 1024 * 1024)
                finally:
                    os.close(fd)
            except (IOError, OSError, ValueError):
                continue
            t = started_from_log(head.decode("utf-8", "replace"))
            if t is not None:
                return t
        return None

    # ------------------------------------------------------------------ processes
    def job_procs(self, states):
        """procgroup.find_job: the rule the launch's stop uses too."""
        return pg.find_job(states, exclude=self.me)

    # ------------------------------------------------------------------ files
    def scan_candidates(self):
        out = []
        for d, pats in sorted((self.p["patterns"] or {}).items()):
            if isinstance(pats, str):
                pats = [pats]
            try:
                it = os.scandir(d)
            except OSError:
                continue
            with it:
                for e in it:
                    if not match_patterns(e.name, pats):
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    out.append({"path": e.path, "name": e.name, "uid": st.st_uid, "ctime": st.st_ctime,
                                "mtime": st.st_mtime, "is_dir": stat.S_ISDIR(st.st_mode),
                                "size": st.st_size if stat.S_ISREG(st.st_mode) else 0})
        return out

    @staticmethod
    def holders(paths, exclude):
        """path -> {pid: how} of live processes (not in exclude) holding it or something beneath it in any way:
        open, mapped, working directory or root, or a unix socket bound there. A bound socket whose holder is
        not visible here (another PID namespace) counts as held, by PID 0."""
        wanted = set(paths)
        unix = unix_sockets()
        out = {}
        seen_inodes = set()

        def add(target, pid, how):
            for w in wanted:
                if target == w or target.startswith(w + "/"):
                    out.setdefault(w, {})[pid] = how

        for st in pg.all_stats():
            if st.state in ("Z", "X", "x"):
                continue
            targets = fd_targets(st.pid)
            seen_inodes.update(str(socket_inode(t)) for t in targets if socket_inode(t) is not None)
            if st.pid in exclude:
                continue
            for t, how in held_paths(st.pid, unix).items():
                add(t, st.pid, how)
        for inode, path in unix.items():
            if inode not in seen_inodes:
                add(path, 0, "unix socket %s" % path)
        return out

    @staticmethod
    def remove(entry):
        """Bytes removed with one leftover (a top-level entry of /dev/shm or /tmp): unlinkat/rmdir relative to
        descriptors (module_utils/jobtree.py), so a directory the job swaps for a symlink (to a FIFO, to a host
        directory) is removed as a link, and nothing found is ever opened but a directory. Over the layer's caps
        (entries, depth) a TreeError: reported, what was removed so far stays removed."""
        parent, name = os.path.split(entry["path"])
        fd = jt.open_root(parent)  # /dev/shm, /tmp: the host's own
        try:
            return jt.remove_tree(fd, name)["bytes"]
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ port
    @staticmethod
    def port_holders(port, ours):
        return port_owners(port, ours)

    def gpu_users(self, exclude):
        prefix = self.p["gpu_devices"]
        out = []
        for st in pg.all_stats():
            if st.pid in exclude or st.state in ("Z", "X", "x"):
                continue
            devs = sorted(set(t for t in fd_targets(st.pid) if t.startswith(prefix)))
            if devs:
                out.append({"pid": st.pid, "comm": st.comm, "cmdline": pg.read_cmdline(st.pid), "devices": devs})
        return out

    # ------------------------------------------------------------------ run
    def run(self):
        check = self.m.check_mode
        states = self.states()
        self.found["state"] = {"present": bool(states), "pids": [s.get("pid") for s in states],
                               "problems": self.state_problems}
        procs = self.job_procs(states)
        self.found["processes"] = [{"pid": st.pid, "comm": st.comm, "cmdline": pg.read_cmdline(st.pid)}
                                   for st in procs]
        ours = set(st.pid for st in procs)
        held = set()
        unix = unix_sockets()
        for st in procs:
            held |= open_paths(st.pid, unix)
        port = int(self.p["port"] or next((s.get("master_port") for s in states if s.get("master_port")), 0) or 0)
        holders_before = self.port_holders(port, ours) if port else []
        self.found["port_holders"] = holders_before

        if procs and not check:
            outcome = pg.terminate(lambda: self.job_procs(states), grace=float(self.p["stop_timeout"]))
            self.cleaned["terminated"] = outcome["terminated"]
            self.cleaned["killed"] = outcome["killed"]
            self.remaining = outcome["remaining"]
            if outcome["remaining"]:
                self.warnings.append("processes of job %s survived SIGKILL: %s" % (self.job, outcome["remaining"]))
        elif procs:
            self.cleaned["terminated"] = sorted(ours)

        # Leftover files, decided after the job's processes are gone (check mode: as if they were).
        job = {"uid": self.job_uid(), "started_at": None, "held": held}
        t0 = self.started_at(states)
        job["started_at"] = t0 - float(self.p["started_slack"]) if t0 is not None else None
        cands = self.scan_candidates()
        exclude = self.me | ours
        holder_map = self.holders([c["path"] for c in cands], exclude) if cands else {}
        live_others = set(st.pid for st in pg.all_stats() if st.pid not in exclude)
        for c in cands:
            is_ours, why = attribute(c, job, holder_map, live_others)
            if not is_ours:
                self.kept.append({"path": c["path"], "why": why})
                continue
            self.found["files"].append(c["path"])
            if check:
                self.cleaned["files"].append(c["path"])
                self.cleaned["bytes"] += c["size"]
                continue
            try:
                self.cleaned["bytes"] += self.remove(c)
                self.cleaned["files"].append(c["path"])
            except OSError as e:
                self.warnings.append("cannot remove %s: %s" % (c["path"], e.strerror or e))

        # The port, after the job is gone.
        if port:
            after = holders_before if check else self.port_holders(port, set())
            if check:
                after = [h for h in after if not h["ours"]]
            notes = ["port %d is held by PID %s (%s), not by job %s: left alone"
                     % (port, h.get("pid"), " ".join(h["cmdline"]) or h["comm"] or h.get("note", ""), self.job)
                     for h in after]
            self.warnings.extend(notes)
            port_info = {"port": port, "free": not after, "holders": after, "report": "; ".join(notes)}
        else:
            port_info = {"port": 0, "free": True, "holders": [], "report": ""}

        gpu = self.gpu_users(self.me | ours)
        if self.p["remove_state"]:
            self.remove_records(check)
        changed = bool(self.cleaned["terminated"] or self.cleaned["killed"] or self.cleaned["files"] or self.records)
        summary = "%s: processes %d found, %d stopped; leftovers %d found, %d removed (%d bytes), %d kept; " \
                  "port %s %s; %d other GPU users" % (
                      self.job, len(procs), len(set(self.cleaned["terminated"]) | set(self.cleaned["killed"])),
                      len(self.found["files"]), len(self.cleaned["files"]), self.cleaned["bytes"], len(self.kept),
                      port or "-", "free" if port_info["free"] else "held by PID %s" % ",".join(
                          str(h.get("pid")) for h in port_info["holders"]), len(gpu))
        if self.records:
            summary += "; launch records removed: %d" % len(self.records)
        extra = {"container": self.container_state()} if self.p["container"] else {}
        act = container_action(self.p["container_restart"], extra.get("container"), bool(self.cleaned["files"]))
        if "container" in extra:
            extra["container"]["action"] = act
        extra["probed"] = dict((path, os.path.lexists(path)) for path in self.p["probe_paths"])
        extra["lock_released"] = self.release_lock(last_change(act, extra["probed"], self.p["keep_lock"],
                                                               self.remaining), check)
        self.m.exit_json(changed=changed, found=self.found, cleaned=self.cleaned, kept=self.kept, gpu_users=gpu,
                         port=port_info, records=self.records, summary=summary, warnings=self.warnings, **extra)

    def container_state(self):
        """{name, exists, running} of the training container from the engine (read-only), or {name, error}."""
        name = self.p["container"]
        docker = self.m.get_bin_path("docker")
        if not docker:
            return {"name": name, "exists": False, "running": False}
        rc, out, err = self.m.run_command([docker, "inspect", "--type", "container", "--format",
                                           "{{.State.Running}}", name])
        if rc == 0 and out.strip() in ("true", "false"):
            return {"name": name, "exists": True, "running": out.strip() == "true"}
        if "no such" in (err or "").lower():
            return {"name": name, "exists": False, "running": False}
        return {"name": name, "error": "docker inspect %s: rc %d: %s" % (name, rc, (err or out).strip()[-200:])}

    def release_lock(self, last, check):
        """Give back the run's cluster lock of this node (release_lock) when this call is its last change."""
        lock = self.p["release_lock"] or {}
        if not lock or not last or check:
            return False
        path, token = lock.get("path"), lock.get("token")
        if not path or not token:
            self.m.fail_json(msg="job_reset: release_lock needs path and token (cluster_lock_dir and the run's lock "
                                 "token), got keys %s" % sorted(lock), found=self.found, cleaned=self.cleaned)
        try:
            return cluster_lock.release(path, token)
        except (cluster_lock.LockError, OSError) as e:
            self.warnings.append("cluster lock %s not given back here (%s): the run's release task does it" % (
                path, e))
            return False

    # ------------------------------------------------------------------ the launch's records
    def remove_records(self, check):
        """The launch state, the secret files and the secrets env file, once the job is gone. A job that survived
        SIGKILL keeps its state (the next reset finds it again) and the run fails."""
        if self.remaining:
            self.m.fail_json(msg="processes of job %s survived SIGKILL: %s; its launch state is kept, so the next "
                                 "reset finds them again (look for a process in state D with ps -o pid,stat,wchan)"
                                 % (self.job, self.remaining), found=self.found, cleaned=self.cleaned)
        try:
            self.records += unlink_in(self.dir, RECORD_FILES, check)
            if self.p["secrets_dir"]:
                self.records += unlink_in(self.p["secrets_dir"], None, check)
            env_file = self.p["secret_env_file"]
            if env_file:
                self.records += unlink_in(os.path.dirname(env_file) or ".", [os.path.basename(env_file)], check)
        except OSError as e:
            self.m.fail_json(msg="job %s stopped, but its launch records cannot be removed: %s (%s); remove them as "
                                 "root and rerun reset.yml" % (self.job, e.strerror or e, e.filename or self.dir),
                             found=self.found, cleaned=self.cleaned)


def main():
    module = AnsibleModule(
        argument_spec=pg.job_args(
            launch_state=dict(type="dict"),
            port=dict(type="int", default=0),
            patterns=dict(type="dict", default={
                "/dev/shm": ["torch_*", "nccl-*", "sem.mp-*", "sem.loky-*", "__KMP_REGISTERED_LIB_*", "psm_*",
                             "psm2_*"],
                "/tmp": [".torch_distributed_*", "torchelastic_*", "pymp-*", ".nccl-*"]}),
            stop_timeout=dict(type="float", default=10.0),
            started_slack=dict(type="float", default=2.0),
            gpu_devices=dict(type="str", default="/dev/nvidia"),
            container=dict(type="str", default=""),
            probe_paths=dict(type="list", elements="path", default=[]),
            container_restart=dict(type="str", default="never", choices=["auto", "always", "never"]),
            release_lock=dict(type="dict", default={}, no_log=False),
            keep_lock=dict(type="bool", default=False),
            remove_state=dict(type="bool", default=False),
            secrets_dir=dict(type="path", default=""),
            secret_env_file=dict(type="path", default=""),
        ),
        supports_check_mode=True,
    )
    Reset(module).run()


if __name__ == "__main__":
    main()
