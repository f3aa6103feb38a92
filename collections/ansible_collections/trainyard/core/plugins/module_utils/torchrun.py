# -*- coding: utf-8 -*-
"""Pure helpers of the torchrun launch: the command, the environment, the state file, log parsing.

Kept apart from the code that starts processes (library/torchrun_launch.py, the launcher module_utils/launcher.py)
so the logic is unit-tested without launching anything (tests/unit/module_utils/test_torchrun*.py).

State file (``<state_root>/<job>/launch.json``, docs/architecture.md)::

    {"job": "train", "runtime": "docker", "container": "trainyard-train",
     "pid": 4242, "pgid": 4242, "start_ticks": 123456, "started_at": 1763800000.0,
     "command": ["torchrun", "--nnodes=3", ...], "env_files": [...], "log": ".../torchrun.log",
     "node_rank": 0, "master_port": 39500, "resume_from": "/outputs/checkpoint-20",
     "sidecars": [{"name": "janitor", "pid": 4250, "pgid": 4250, "start_ticks": 123470, "argv": [...]}],
     "token": "...", "fingerprint": "...", "exit_file": ".../launch.exit.json", "version": 1}
"""

from __future__ import annotations

import calendar
import hashlib
import json
import os
import re
import shlex
import time

from ansible_collections.trainyard.core.plugins.module_utils import jobtree as jt

STATE_FILE = "launch.json"
PID_FILE = "launch.pid.json"
EXIT_FILE = "launch.exit.json"
SPEC_FILE = "launch.spec.json"
LAUNCHER_FILE = "launcher.py"
# Node-local layout of a job (docs/architecture.md, docs/security.md): <state_root>/<job>/ is host-only control
# state and is never mounted into the training container; the container mounts JOB_RO_DIR read-only (what the
# job reads: nccl.env, ds_config.json, the launcher and its spec) and JOB_RW_DIR read-write (what the job writes
# that the host reads back: the log, the launcher's pid and exit records), which the host treats as untrusted.
JOB_RO_DIR = "job-ro"
JOB_RW_DIR = "job-rw"
# Records read back from the job-writable directory are small; anything larger is not ours.
RECORD_MAX_BYTES = 64 * 1024
STATE_VERSION = 1
RESUME_ENV = "TRAINYARD_RESUME_FROM"
TOKEN_ENV = "TRAINYARD_LAUNCH_ID"
RDZV_BACKENDS = ("static", "c10d")
LOG_KEEP = 5

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names whose values a result, a log, a state file or a collected bundle never shows: THE secret-name rule, used by
# job_collect (the bundle), plugin_utils/cluster_model.py (the validate play) and here; tests/unit/layout/test_secret_rule.py
# fails on a second one anywhere in the product.
SECRET_NAME = re.compile(r"token|secret|passw|pwd|key|credential|cred|auth|cookie|private|signature|session", re.I)
REDACTED = "********"
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class LaunchError(ValueError):
    """A parameter combination that cannot make a valid torchrun command."""


# ----------------------------------------------------------------------------------------------- command

def validate_job_name(name):
    if not name or not _JOB_NAME.match(name) or name in (".", ".."):
        raise LaunchError("job name %r: use letters, digits, '.', '_' and '-' (it names a directory)" % (name,))
    return name


def validate_sidecar_name(name):
    if not isinstance(name, str) or not _JOB_NAME.match(name) or name in (".", ".."):
        raise LaunchError("sidecar name %r: use letters, digits, '.', '_' and '-' starting with a letter or digit "
                          "(it names the sidecar's log and pid files in the job's state directory)" % (name,))
    return name


def validate_regex(option, pattern):
    """A log marker must compile before the job starts (a bad one used to crash after the start)."""
    if not pattern:
        return pattern
    try:
        re.compile(pattern)
    except re.error as e:
        raise LaunchError("%s %r is not a valid regular expression (%s): fix it (Python re syntax; escape "
                          "literal ( ) [ ] . * + ? with a backslash)" % (option, pattern, e))
    return pattern


def validate_topology(nnodes, nproc_per_node, node_rank, master_port):
    if int(nnodes) < 1:
        raise LaunchError("nnodes=%s: must be at least 1" % nnodes)
    if int(nproc_per_node) < 1:
        raise LaunchError("nproc_per_node=%s: must be at least 1" % nproc_per_node)
    if not 0 <= int(node_rank) < int(nnodes):
        raise LaunchError("node_rank=%s is outside 0..%d (nnodes=%s): take node ranks from the cluster model"
                          % (node_rank, int(nnodes) - 1, nnodes))
    if not 1 <= int(master_port) <= 65535:
        raise LaunchError("master_port=%s: must be a TCP port (1-65535)" % master_port)


def resume_args(resume_path, resume_arg):
    """The entry point's extra arguments for a resume: [] without a path or flag; ['--flag', path] or
    ['--flag=path'] when the flag ends with '='."""
    if not resume_path or not resume_arg:
        return []
    if resume_arg.endswith("="):
        return [resume_arg + resume_path]
    return [resume_arg, resume_path]


def build_command(nnodes, nproc_per_node, node_rank, master_addr, master_port, entrypoint, args=(),
                  rdzv_backend="static", rdzv_id="", max_restarts=0, torchrun=("torchrun",),
                  extra_torchrun_args=(), resume_path=None, resume_arg=None, min_nnodes=0):
    """The torchrun argv for one node. static: ranks come from --node_rank (the cluster model);
    c10d: the rendezvous endpoint is master_addr:master_port and torchrun assigns node ranks itself.
    min_nnodes > 0 (c10d only): torchrun's elastic mode, --nnodes=min_nnodes:nnodes."""
    validate_topology(nnodes, nproc_per_node, node_rank, master_port)
    if rdzv_backend not in RDZV_BACKENDS:
        raise LaunchError("rdzv_backend=%r: use one of %s" % (rdzv_backend, ", ".join(RDZV_BACKENDS)))
    if not master_addr:
        raise LaunchError("master_addr is empty: it is the head node's data address (cluster_model.master_addr)")
    if not entrypoint:
        raise LaunchError("entrypoint is empty: give the training script (train_args_entrypoint)")
    if int(max_restarts) < 0:
        raise LaunchError("max_restarts=%s: must be 0 or more" % max_restarts)
    if int(min_nnodes or 0) and rdzv_backend != "c10d":
        raise LaunchError("min_nnodes=%s needs rdzv_backend=c10d (a static rendezvous has a fixed size): set "
                          "launch_rdzv_backend: c10d, or launch_nnodes_min: 0" % min_nnodes)
    if int(min_nnodes or 0) and not 1 <= int(min_nnodes) <= int(nnodes):
        raise LaunchError("min_nnodes=%s is outside 1..%d (nnodes): set launch_nnodes_min to at most the number "
                          "of nodes, or 0 for a fixed size" % (min_nnodes, int(nnodes)))
    cmd = list(torchrun) or ["torchrun"]
    size = "%d:%d" % (int(min_nnodes), int(nnodes)) if int(min_nnodes or 0) else "%d" % int(nnodes)
    cmd += ["--nnodes=%s" % size, "--nproc_per_node=%d" % int(nproc_per_node)]
    if rdzv_backend == "static":
        cmd += ["--node_rank=%d" % int(node_rank), "--master_addr=%s" % master_addr,
                "--master_port=%d" % int(master_port), "--rdzv_backend=static"]
    else:
        cmd += ["--rdzv_backend=c10d", "--rdzv_endpoint=%s:%d" % (master_addr, int(master_port))]
    if rdzv_id:
        cmd += ["--rdzv_id=%s" % rdzv_id]
    cmd += ["--max_restarts=%d" % int(max_restarts)]
    cmd += [str(a) for a in extra_torchrun_args]
    cmd += [str(entrypoint)] + [str(a) for a in args]
    cmd += resume_args(resume_path, resume_arg)
    return cmd


def command_options(**more):
    """The argument spec of the options build_command takes (torchrun_launch and slurm_job build the same command)."""
    return dict(nnodes=dict(type="int"), nproc_per_node=dict(type="int"), node_rank=dict(type="int"),
                master_addr=dict(type="str"), master_port=dict(type="int", default=29500),
                rdzv_id=dict(type="str", default=""), max_restarts=dict(type="int", default=0),
                torchrun=dict(type="list", elements="str", default=["torchrun"]),
                extra_torchrun_args=dict(type="list", elements="str", default=[]),
                entrypoint=dict(type="str"), args=dict(type="list", elements="str", default=[]), **more)


def shell_quote(argv):
    """argv as one copy-pasteable line (display only; nothing is ever run through a shell)."""
    return " ".join(shlex.quote(a) for a in argv)


# ------------------------------------------------------------------------------------------- environment

# Env files are read the way `docker run --env-file` and systemd's EnvironmentFile= both read them: KEY=value, the
# value literally (";", ",", ":", "=", "#", "$", inner quotes and blanks kept). A line those two would read
# differently is refused, naming both readings (plugin_utils/nccl_vars.py writes only lines they agree on).
_ENV_LINE_PROBLEMS = (
    (lambda v: "\\" in v, "a backslash (systemd's EnvironmentFile= reads it as an escape, docker --env-file keeps it)"),
    (lambda v: v[:1] in ("'", '"'), "a value that starts with a quote (systemd's EnvironmentFile= removes the quotes, "
                                    "docker --env-file keeps them): write the value without them"),
    (lambda v: v != v.rstrip(" \t\r"),
     "blanks at the end of the value (systemd drops them, docker --env-file keeps them)"),
)


def parse_env_file(text, source="env file"):
    """KEY=value lines, read as docker's --env-file and systemd's EnvironmentFile= both read them; blank lines and
    # comments are skipped. Returns (env, problems): a line they would read differently (or that is not KEY=value)
    is a problem naming the line and why, and is left out of env."""
    env, problems = {}, []
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.lstrip(" \t")
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _ENV_NAME.match(key):
            why = ("`export` is a shell word: docker --env-file refuses the line and systemd ignores it; write "
                   "KEY=value" if key.startswith("export ") else "not KEY=value (no blanks around the name)")
            problems.append("%s line %d: %s: %r" % (source, n, why, raw[:80]))
            continue
        bad = [why for test, why in _ENV_LINE_PROBLEMS if test(value)]
        if bad:
            problems.append("%s line %d: %s has %s" % (source, n, key, bad[0]))
            continue
        env[key] = value
    return env, problems


def validate_env(env):
    bad = [k for k in env if not _ENV_NAME.match(str(k))]
    if bad:
        raise LaunchError("env: %s not valid variable name(s)" % ", ".join(sorted(map(repr, bad))))
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def looks_secret(name):
    """True when an environment variable's name looks like it holds a secret (token, password, key, ...)."""
    return bool(SECRET_NAME.search(str(name)))


def redact_env(env):
    """env with the values of secret-looking names replaced by REDACTED (what a module result may show)."""
    return dict((k, REDACTED if looks_secret(k) and v != "" else v) for k, v in (env or {}).items())


def parse_secret_env(text, source="secret env file"):
    """KEY=value lines, taken literally (no quotes removed, no 'export': the format docker exec --env-file
    reads); blank lines and # comments are skipped. Returns (env, problems); a problem names the line number
    only, never its text."""
    env, problems = {}, []
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _ENV_NAME.match(key):
            problems.append("%s line %d is not KEY=value (KEY: letters, digits and _; the value is not shown)"
                            % (source, n))
            continue
        env[key] = value
    return env, problems


def merge_env(file_envs, extra_env, resume_path=None, token=None):
    """What the job sees on top of the process environment: env files in order, then extra env, then
    TRAINYARD_RESUME_FROM and the launch token."""
    out = {}
    for e in file_envs:
        out.update(e)
    out.update(extra_env or {})
    if resume_path:
        out[RESUME_ENV] = resume_path
    else:
        out.pop(RESUME_ENV, None)
    if token:
        out[TOKEN_ENV] = token
    return out


def fingerprint(command, env, env_files, chdir, runtime, container):
    """What makes two launches 'the same job': command, extra environment (the files by path: they are
    rendered identically by the render play), working directory, runtime and container. The resume point is
    not part of it (a running job is not a different job because a newer checkpoint appeared)."""
    blob = json.dumps({"command": list(command), "env": dict(sorted((env or {}).items())),
                       "env_files": list(env_files or []), "chdir": chdir or "", "runtime": runtime,
                       "container": container or ""}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def fingerprint_parts(env, env_files, chdir, runtime, container):
    """What the launch record keeps of the fingerprint's inputs, so that a refused relaunch can name what changed:
    the extra environment by name with a digest of each value (never the value: a secret is already "<secret>"
    here), the env files by path, the working directory, the runtime and the container."""
    return {"env": dict((k, hashlib.sha256(str(v).encode("utf-8")).hexdigest()[:16])
                        for k, v in sorted((env or {}).items())),
            "env_files": list(env_files or []), "chdir": chdir or "", "runtime": runtime, "container": container or ""}


def fingerprint_changes(running, wanted):
    """What differs between two launches' fingerprint_parts, as short phrases (names and paths, never a value);
    empty when the running launch's record has no parts (written by an earlier version) or only the command
    differs (the caller shows both commands)."""
    if not isinstance(running, dict) or not isinstance(running.get("env"), dict):
        return []
    out = []
    old, new = running["env"], wanted["env"]
    for label, names in (("set anew", sorted(set(new) - set(old))), ("no longer set", sorted(set(old) - set(new))),
                         ("another value", sorted(k for k in set(old) & set(new) if old[k] != new[k]))):
        if names:
            out.append("environment %s: %s" % (label, ", ".join(str(n) for n in names)))
    for key, label in (("env_files", "env files"), ("chdir", "working directory"), ("runtime", "runtime"),
                       ("container", "container")):
        if running.get(key) != wanted[key]:
            out.append("%s %s -> %s" % (label, json.dumps(running.get(key)), json.dumps(wanted[key])))
    return out


# -------------------------------------------------------------------------------------------- state file

def job_dir(state_root, job):
    return os.path.join(state_root, validate_job_name(job))


def job_layout(state_root, job):
    """{dir, ro, rw}: the host-only state directory of a job, and its read-only and job-writable parts."""
    d = job_dir(state_root, job)
    return {"dir": d, "ro": os.path.join(d, JOB_RO_DIR), "rw": os.path.join(d, JOB_RW_DIR)}


def check_pid_record(data, token, stat_of, environ_of):
    """The launcher's pid record, as read back from a place the job can write, checked against what the host
    sees in /proc before anything is recorded (and later signalled) by it: the launcher's PID must be alive,
    started at the recorded time, and carry this launch's token in its own environment (a process the job
    cannot forge: the host gave it the token when it started it). ``stat_of(pid)`` returns an object with
    ``start_ticks`` and ``pgrp`` (or None); ``environ_of(pid)`` a dict (or None).
    Returns {pid, pgid, start_ticks, child_pid, child_start_ticks}; ValueError says what does not match."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    pid, ticks = data.get("pid"), data.get("start_ticks")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or not isinstance(ticks, int):
        raise ValueError("pid/start_ticks missing or not integers")
    if data.get("token") != token:
        raise ValueError("written for another launch (token differs)")
    st = stat_of(pid)
    if st is None or st.start_ticks != ticks:
        raise ValueError("pid %d is not a live process started at %d" % (pid, ticks))
    env = environ_of(pid) or {}
    if env.get(TOKEN_ENV) != token:
        raise ValueError("pid %d does not carry this launch's token: not the launcher the host started" % pid)
    out = {"pid": pid, "pgid": st.pgrp, "start_ticks": ticks, "child_pid": None, "child_start_ticks": None}
    child, cticks = data.get("child_pid"), data.get("child_start_ticks")
    if isinstance(child, int) and not isinstance(child, bool) and isinstance(cticks, int) and child > 1:
        cst = stat_of(child)
        if cst is not None and cst.start_ticks == cticks and (environ_of(child) or {}).get(TOKEN_ENV) == token:
            out.update(child_pid=child, child_start_ticks=cticks)
    return out


def make_state(job, runtime, container, pid, pgid, start_ticks, started_at, command, env_files, log, node_rank,
               master_port, resume_from, sidecars, token, fingerprint_, exit_file, torchrun_pid=None):
    return {"version": STATE_VERSION, "job": job, "runtime": runtime, "container": container or "",
            "pid": int(pid), "pgid": int(pgid), "start_ticks": int(start_ticks), "started_at": float(started_at),
            "command": list(command), "env_files": list(env_files), "log": log, "node_rank": int(node_rank),
            "master_port": int(master_port), "resume_from": resume_from or "", "sidecars": list(sidecars),
            "token": token, "fingerprint": fingerprint_, "exit_file": exit_file,
            "torchrun_pid": int(torchrun_pid) if torchrun_pid else None, "fingerprint_parts": None}


_REQUIRED = {"job": str, "pid": int, "pgid": int, "start_ticks": int, "command": list, "log": str}


def read_state(state_root, job):
    """The launch record of ``job`` under ``state_root`` (host-only control state, never mounted into the container):
    None where there is none; raises ValueError (a torn or foreign file, a bad job name) or OSError."""
    path = os.path.join(job_dir(state_root, job), STATE_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return parse_state(f.read())


def parse_state(text):
    """launch.json text → dict; raises ValueError naming what is wrong (a torn or foreign file)."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    for key, typ in _REQUIRED.items():
        if not isinstance(data.get(key), typ) or isinstance(data.get(key), bool):
            raise ValueError("field %r missing or not %s" % (key, typ.__name__))
    sidecars = data.setdefault("sidecars", [])
    if not isinstance(sidecars, list) or not all(isinstance(s, dict) for s in sidecars):
        raise ValueError("field 'sidecars' is not a list of objects")
    for i, sc in enumerate(sidecars):
        for key in ("pid", "pgid", "start_ticks"):
            if sc.get(key) is not None and (not isinstance(sc[key], int) or isinstance(sc[key], bool)):
                raise ValueError("field 'sidecars[%d].%s' is not an integer" % (i, key))
        for key in ("name", "token", "log"):
            if sc.get(key) is not None and not isinstance(sc[key], str):
                raise ValueError("field 'sidecars[%d].%s' is not a string" % (i, key))
    for key in ("torchrun_pid", "master_port", "node_rank"):
        if data.get(key) is not None and (not isinstance(data[key], int) or isinstance(data[key], bool)):
            raise ValueError("field %r is not an integer" % key)
    for key in ("token", "fingerprint", "exit_file", "resume_from"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError("field %r is not a string" % key)
    if not isinstance(data.get("fingerprint_parts"), dict):
        data["fingerprint_parts"] = None  # a record of an earlier version, or a torn one: nothing to compare
    data.setdefault("token", None)
    data.setdefault("fingerprint", None)
    data.setdefault("runtime", "host")
    data.setdefault("container", "")
    return data


def dumps_state(state):
    return json.dumps(state, indent=2, sort_keys=True) + "\n"


def write_atomic(path, text, mode=0o644, gid=None):
    """Replace path with text: a fresh temporary file beside it (created exclusively, never through a symlink),
    then a rename (which replaces a symlink at path rather than following it). gid: the file's group (on the
    descriptor, before the mode is set), else the creator's."""
    tmp = "%s.tmp.%d.%s" % (path, os.getpid(), os.urandom(4).hex())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            if gid is not None:
                os.fchown(f.fileno(), -1, gid)
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_n(fd, n):
    """Up to n bytes from fd, in reads of at most 1 MiB (fewer at end of file)."""
    chunks, left = [], n
    while left > 0:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def read_untrusted(path, limit=RECORD_MAX_BYTES, tail=False):
    """Bytes of a file the job can write (module_utils/jobtree.py): never through a symlink, a regular file only
    (a FIFO or device node is never opened), at most ``limit`` bytes (the last ones with tail). b"" when absent or
    refused."""
    try:
        dfd = jt.open_root(os.path.dirname(path) or ".")
    except OSError:
        return b""
    try:
        return jt.read_bytes(dfd, os.path.basename(path), limit, tail)
    except (OSError, ValueError):
        return b""
    finally:
        os.close(dfd)


def read_untrusted_json(path, limit=RECORD_MAX_BYTES):
    """A small JSON object from the job-writable directory; None when absent, too large, torn, too deep, with
    NaN/Infinity or not an object (jobtree.loads_bounded)."""
    data = read_untrusted(path, limit + 1)
    if not data or len(data) > limit:
        return None
    try:
        return jt.loads_bounded(data, expect=dict)
    except ValueError:
        return None


def rotated_names(log, keep=LOG_KEEP):
    """[(src, dst)] renames that shift log → log.1 → … → log.<keep> (oldest first, so nothing is overwritten
    before it moved)."""
    pairs = [("%s.%d" % (log, i), "%s.%d" % (log, i + 1)) for i in range(keep - 1, 0, -1)]
    pairs.append((log, "%s.1" % log))
    return pairs


# --------------------------------------------------------------------------------------------- log parsing

# Text the job writes (its log, error files, py-spy output, the analyzer's report of its dumps, kernel log lines
# naming its processes) is parsed line by line, each line cut to LINE_MAX characters first, and every regex
# applied to it is linear in the line (no nested quantifier, no unanchored `.*` that rescans the line from each
# start): a 1 MiB line costs a 1 MiB scan, never hours (docs/security.md "Bad input";
# tests/unit/module_utils/test_job_text_regex.py runs each parser on adversarial lines under a subprocess timeout).
LINE_MAX = 4096


def capped_lines(text, max_len=LINE_MAX):
    """The lines of job-written text, each cut to max_len characters (what any regex over job text sees)."""
    return [line[:max_len] for line in (text or "").splitlines()]


_BLOCK = re.compile(r"^\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s{2,}(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_RANK = re.compile(r"^(-?\d+)(?:\s*\(local_rank:\s*(-?\d+)\))?")
_EXIT = re.compile(r"^(-?\d+)(?:\s*\(pid:\s*(\d+)\))?(?:\s*\((SIG[A-Z0-9]+)\))?")
_SIGNAL_TB = re.compile(r"Signal (\d+) \((SIG[A-Z0-9]+)\) received by PID (\d+)")
_FAILED_HDR = re.compile(r"^(\S.*) FAILED\s*$")
# torchrun's own log line when it sees a worker die (glog format, microseconds, no year):
# E1122 21:31:10.522000 6089 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 6123) of binary: ...
_GLOG_FAILED = re.compile(r"E(\d{4}) (\d\d:\d\d:\d\d(?:\.\d+)?) +\d+ \S+\] failed \(exitcode: (-?\d+)\) "
                          r"local_rank: (\d+) \(pid: (\d+)\)")
_SIGNAMES = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def _torch_time(value):
    """'2026-11-22_21:25:32' (torchrun's local-time format) → epoch seconds (UTC assumed when parsing; only
    compared across nodes of one cluster); None when unparsable."""
    try:
        return float(calendar.timegm(time.strptime(value.strip(), "%Y-%m-%d_%H:%M:%S")))
    except (ValueError, TypeError):
        return None


def _glog_time(detected, coarse):
    """Precise epoch of a glog 'failed' line: month/day and time of day from glog, the year from torchrun's
    coarse report time ('YYYY-MM-DD_HH:MM:SS')."""
    mmdd, tod = detected
    year = coarse[:4] if coarse and coarse[:4].isdigit() else time.strftime("%Y")
    whole, _, frac = tod.partition(".")
    try:
        base = calendar.timegm(time.strptime("%s%s %s" % (year, mmdd, whole), "%Y%m%d %H:%M:%S"))
    except ValueError:
        return None
    return base + (float("0." + frac) if frac else 0.0)


def parse_failures(text):
    """Failures that torchrun reports (ChildFailedError) in a log: a list of dicts
    {rank, local_rank, exitcode, pid, signal, time, time_epoch, host, traceback, root_cause, script}.
    The root cause (torchrun's "first observed failure") comes first; later failure reports (a restarted
    group) come after. Lines of an indented multi-line traceback are joined."""
    failures = []
    section = None
    script = None
    cur = None
    last_field = None

    def close():
        if cur is not None and "_tb" in cur:
            # joined once: adding each line to a string copies the whole traceback per line (quadratic)
            cur["traceback"] = "\n".join(cur.pop("_tb")).strip("\n")
        if cur is not None and ("rank" in cur or "exitcode" in cur):
            failures.append(cur)

    lines = capped_lines(text)
    for line in lines:
        m = _FAILED_HDR.match(line)
        if m and not line.startswith(" "):
            script = m.group(1).strip()
        s = line.strip()
        if s.startswith("Failures:"):
            close()
            cur, section = None, "other"
            continue
        if s.startswith("Root Cause"):
            close()
            cur, section = None, "root"
            continue
        if s.startswith("=====") or s.startswith("-----"):
            close()
            cur = None
            if s.startswith("====="):
                section = section if section else None
            continue
        if section is None:
            continue
        mb = _BLOCK.match(line)
        if mb:
            close()
            cur = {"root_cause": section == "root", "script": script, "index": int(mb.group(1))}
            last_field = None
            continue
        if cur is None:
            continue
        mf = _FIELD.match(line)
        if mf:
            key, value = mf.group(1), mf.group(2).rstrip()
            last_field = key
            if key == "rank":
                mr = _RANK.match(value.strip())
                if mr:
                    cur["rank"] = int(mr.group(1))
                    if mr.group(2) is not None:
                        cur["local_rank"] = int(mr.group(2))
            elif key == "exitcode":
                me = _EXIT.match(value.strip())
                if me:
                    cur["exitcode"] = int(me.group(1))
                    if me.group(2):
                        cur["pid"] = int(me.group(2))
                    if me.group(3):
                        cur["signal"] = me.group(3)
            elif key == "time":
                cur["time"] = value.strip()
                cur["time_epoch"] = _torch_time(value)
            else:
                cur[key] = value.strip()
        elif last_field == "traceback" and line.startswith("  ") and s:
            cur.setdefault("_tb", [cur.get("traceback", "")]).append(line[2:].rstrip())
    close()
    detected = {}
    for line in lines:
        m = _GLOG_FAILED.match(line) if line.startswith("E") else None
        if m:
            detected.setdefault(int(m.group(5)), (m.group(1), m.group(2)))
    for f in failures:
        f.setdefault("local_rank", None)
        f.setdefault("pid", None)
        f.setdefault("time", None)
        f.setdefault("time_epoch", None)
        f.setdefault("host", None)
        f.setdefault("traceback", "")
        f.setdefault("rank", None)
        f.setdefault("exitcode", None)
        if f["pid"] in detected:
            precise = _glog_time(detected[f["pid"]], f["time"])
            # glog marks when the agent noticed; an error file's whole-second time can be earlier still.
            if precise is not None and (f["time_epoch"] is None or int(precise) <= f["time_epoch"]):
                f["time_epoch"] = precise
        if "signal" not in f:
            mt = _SIGNAL_TB.search(f.get("traceback") or "")
            if mt:
                f["signal"] = mt.group(2)
            elif isinstance(f["exitcode"], int) and f["exitcode"] < 0:
                f["signal"] = _SIGNAMES.get(-f["exitcode"], "SIG%d" % -f["exitcode"])
            else:
                f["signal"] = None
    failures.sort(key=lambda f: (not f["root_cause"],))
    return failures


# Literal alternatives only (linear); "ProcessGroupNCCL ... abort" is _pg_abort's, by plain string search.
_COMM_ERROR = re.compile(
    r"Connection (reset|closed|refused)|connection closed by peer|Broken pipe|pair\.cc|Timed out|timed out|"
    r"Timeout|DistNetworkError|DistBackendError|NCCL (communicator was aborted|error)|watchdog|"
    r"Socket Timeout|recvBytes|sendBytes", re.I)
_WORD = re.compile(r"\w*")


def _pg_abort(line):
    """A line naming a ProcessGroup<Backend> and, after it, an abort (ProcessGroupNCCL ... aborted): a word
    ending in ProcessGroup<word characters> followed by a space, 'abort' later in the line. Linear: the first
    such word is found by one split, not by a regex retried from every 'ProcessGroup'."""
    low = line.lower()
    if "processgroup" not in low or "abort" not in low:
        return False
    words = low.split(" ")
    for k, word in enumerate(words[:-1]):
        i = word.rfind("processgroup")
        if i >= 0 and _WORD.fullmatch(word, i + 12):
            return "abort" in " ".join(words[k + 1:])
    return False


def _comm_error(text):
    return any(_COMM_ERROR.search(line) or _pg_abort(line) for line in capped_lines(text))
_TEARDOWN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


def failure_class(failure):
    """How likely a failure is the cause rather than a consequence (lower = cause):
    0 killed by a signal from outside (SIGKILL, SIGSEGV, SIGABRT, ...: the OOM killer, a crash, kill -9);
    1 an error of its own (an exception that is not a communication error);
    2 a communication error (a peer went away: connection reset/closed, collective timeout);
    3 terminated by SIGTERM/SIGINT without an error of its own (torchrun tearing the group down)."""
    sig = failure.get("signal")
    tb = failure.get("traceback") or ""
    own_tb = bool(tb) and not tb.startswith("Signal ") and not tb.startswith("To enable traceback")
    if sig and sig not in _TEARDOWN_SIGNALS:
        return 0
    if own_tb and _comm_error(tb):
        return 2
    if own_tb:
        return 1
    if sig:
        return 3
    return 1  # exited with an error code and no traceback recorded: its own failure as far as we know


def failure_sort_key(failure):
    """Order failures (of one node or of all nodes) so the cause comes first: by failure_class, then the
    earliest time, then the lower node rank and rank. torchrun's own "first observed failure" is by time
    only, and a killed rank's time is when its agent noticed, after the survivors already logged their
    connection errors: time alone names a victim."""
    t = failure.get("time_epoch")
    return (failure_class(failure), t if t is not None else float("inf"),
            failure.get("node_rank") if failure.get("node_rank") is not None else 1 << 30,
            failure.get("rank") if failure.get("rank") is not None else 1 << 30)


def root_cause(text):
    """The failure in a log that most likely caused the others (see failure_sort_key), or None."""
    fs = parse_failures(text)
    return min(fs, key=failure_sort_key) if fs else None


def first_failure(failures):
    """The failure to name first among per-node failures (dicts as returned by parse_failures, with
    node_rank/node added by the caller); None when the list is empty."""
    fs = [f for f in failures if f]
    return min(fs, key=failure_sort_key) if fs else None


def log_tail(text, lines=30):
    return "\n".join(text.splitlines()[-lines:])


def failure_tail(text, lines=30):
    """The log tail without torchrun's own traceback and failure report (the agent's stack says nothing about
    the job, and the report is returned parsed): what the ranks printed last, then the launcher's exit line."""
    all_lines = text.splitlines()
    cut_from = cut_to = None
    for i in range(len(all_lines) - 1, -1, -1):
        if "ChildFailedError" in all_lines[i] and all_lines[i].startswith("torch.distributed"):
            j = i
            while j > 0 and not all_lines[j].startswith("Traceback (most recent call last):"):
                j -= 1
            cut_from = j if all_lines[j].startswith("Traceback") else i
            # the report ends at the second "=====" rule after the Root Cause header
            k, seen_root = i + 1, False
            while k < len(all_lines):
                if all_lines[k].startswith("Root Cause"):
                    seen_root = True
                if seen_root and all_lines[k].startswith("====="):
                    break
                k += 1
            cut_to = k
            break
    if cut_from is not None:
        all_lines = all_lines[:cut_from] + all_lines[cut_to + 1:]
    return "\n".join(fold_dumps(all_lines)[-lines:])


# A line that continues a block the job printed: indented, or only a closing bracket (a config or JSON dump).
_CONTINUATION = re.compile(r"^\s+\S|^[\]})]+,?\s*$")


def fold_dumps(lines, keep=2):
    """Runs of more than keep + 1 continuation lines (a model config or JSON dump the job printed just before it
    failed) cut to their first `keep` lines and a count, so the lines that say what happened fit in the tail. A
    Python traceback is kept whole: from its "Traceback" line to the exception line."""
    out, i, in_tb = [], 0, False
    while i < len(lines):
        line = lines[i]
        if line.startswith("Traceback (most recent call last):"):
            in_tb = True
        elif in_tb:
            in_tb = not line or line[0].isspace()
        elif _CONTINUATION.match(line):
            j = i
            while j < len(lines) and _CONTINUATION.match(lines[j]):
                j += 1
            if j - i > keep + 1:
                out += lines[i:i + keep] + [f"  ... {j - i - keep} more lines of the job's output"]
            else:
                out += lines[i:j]
            i = j
            continue
        out.append(line)
        i += 1
    return out


def last_line(text):
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.rstrip()
    return ""


def find_marker(text, pattern):
    """The first line matching the regex ``pattern`` (None when absent or no pattern)."""
    if not pattern:
        return None
    rx = re.compile(pattern)
    for line in capped_lines(text):
        if rx.search(line):
            return line
    return None


def job_status(alive, exit_info, failure):
    """running | finished | failed from what the node knows: live job processes, the launcher's exit record,
    a torchrun failure report in the log."""
    if alive:
        return "running"
    if exit_info is not None and exit_info.get("returncode") == 0 and not failure:
        return "finished"
    return "failed"
