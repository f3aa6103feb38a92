#!/usr/bin/env python3
# trainyard launcher (written by torchrun_launch; do not edit). Usage: launcher.py SPEC.json
# Written into the job's read-only directory (<state_root>/<job>/job-ro/launcher.py) and run with the job's python
# (host or inside the training container, which mounts that directory read-only at the same path); standard library
# only. It becomes a session leader, writes its PID, start time and the torchrun PID, runs torchrun with the
# environment applied, forwards SIGTERM/SIGINT, records torchrun's exit status, and on the way out ends every process
# the job left: it is the child subreaper of the job (prctl PR_SET_CHILD_SUBREAPER), so a process that double-forks
# and calls setsid is re-parented to it and stays its descendant; those and any process still carrying the job's
# launch token (workers orphaned by an agent that was killed) get SIGTERM, then (frozen with SIGSTOP first, so none
# forks away) SIGKILL, so a dead agent never leaves ranks hanging at a collective and nothing of the job outlives it.
import json, os, signal, stat as stat_mod, sys, time

PR_SET_CHILD_SUBREAPER = 36

TOKEN_ENV = "TRAINYARD_LAUNCH_ID"


def stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            t = f.read()
    except OSError:
        return None
    rest = t[t.rfind(")") + 2:].split()
    return {"state": rest[0], "ppid": int(rest[1]), "pgrp": int(rest[2]), "session": int(rest[3]),
            "start_ticks": int(rest[19])}


NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
READ_CAP = 16 * 1024 * 1024


def read_file(path, tail=None):
    """A regular file's text (no link followed, no FIFO or device opened for good: O_NONBLOCK, fstat after the open),
    at most READ_CAP bytes (with tail: its last tail bytes), newlines as open() in text mode reads them."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise OSError("%s is not a regular file" % path)
        if tail is not None:
            os.lseek(fd, max(0, st.st_size - tail), os.SEEK_SET)
        chunks, left = [], READ_CAP
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    finally:
        os.close(fd)


def write_json(path, data):
    """A fresh temporary file beside path (created exclusively, never through a link), renamed over it."""
    tmp = "%s.tmp.%d.%s" % (path, os.getpid(), os.urandom(4).hex())
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o640), "w") as f:
        json.dump(data, f)
    os.rename(tmp, path)


def secret_env(path):
    """KEY=value lines taken literally (the module checked the file: 0600, every line KEY=value)."""
    env = {}
    for line in read_file(path).split("\n"):
        k, sep, v = line.rstrip("\r").partition("=")
        if sep and k and not k.lstrip().startswith("#"):
            env[k] = v
    return env


def env_file(path):
    env = {}
    for raw in read_file(path).split("\n"):
        line = raw.lstrip(" \t")
        if not line.strip() or line.startswith("#"):
            continue
        k, sep, v = line.partition("=")
        if not sep or not k:
            continue
        env[k] = v  # literally, as parse_env_file (which the module ran on this file first) reads it
    return env


def leftovers(token, me, since):
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        st = stat(int(name))
        if st is None or st["state"] == "Z" or st["start_ticks"] < since:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if (TOKEN_ENV + "=" + token).encode() in env:
            out.append((int(name), st["start_ticks"]))
    return out


def become_subreaper():
    """Make this process the child subreaper of everything below it; False where prctl is not reachable."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError, ImportError):
        return False


def descendants(me, since):
    """(pid, start_ticks) of every live process below ``me`` (started no earlier than ``since``)."""
    kids, stats = {}, {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = stat(int(name))
            if st is not None:
                stats[int(name)] = st
                kids.setdefault(st["ppid"], []).append(int(name))
    out, todo = [], [me]
    while todo:
        for c in kids.get(todo.pop(), ()):
            st = stats[c]
            if c != me and st["start_ticks"] >= since:
                todo.append(c)
                if st["state"] not in ("Z", "X"):
                    out.append((c, st["start_ticks"]))
    return out


def reap():
    """Collect every exited child (orphans re-parented to this subreaper included) without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            return


def end_job(token, me, since, grace):
    """End what the job left: descendants (kept by the subreaper) and processes carrying its token. SIGTERM, up to
    ``grace`` seconds, then SIGSTOP rounds until no new process appears, then SIGKILL."""
    def left():
        found = dict(descendants(me, since))
        found.update(leftovers(token, me, since))
        return sorted(found.items())

    procs = left()
    if not procs:
        return
    for pid, ticks in procs:
        kill_if_same(pid, ticks, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and procs:
        time.sleep(0.1)
        reap()
        procs = left()
    for _ in range(20):
        frozen = {}
        for _ in range(20):
            new = [(p, t) for p, t in left() if p not in frozen]
            if not new:
                break
            for pid, ticks in new:
                kill_if_same(pid, ticks, signal.SIGSTOP)
                frozen[pid] = ticks
        if not frozen:
            break
        for pid, ticks in frozen.items():
            kill_if_same(pid, ticks, signal.SIGKILL)
        time.sleep(0.05)
        reap()


def kill_if_same(pid, ticks, sig):
    st = stat(pid)
    if st is not None and st["start_ticks"] == ticks:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def say(line):
    sys.stdout.write("trainyard-launch: %s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), line))
    sys.stdout.flush()


def failfast_watch(spec, child):
    """The cross-node fail-fast watcher (failfast.py, written beside this file) for a multi-node job, or None."""
    if not spec.get("failfast"):
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "failfast.py")
    try:
        import importlib.util
        loader = importlib.util.spec_from_file_location("trainyard_failfast", path)
        mod = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(mod)
    except (ImportError, OSError, SyntaxError) as e:
        say("fail-fast watcher off: cannot load %s: %s" % (path, e))
        return None
    return mod.watch(spec, child, say)


def failfast_finish(watcher, spec, rc, operator_stop):
    """After torchrun exited: the watcher publishes this node's own failure; its record for launch.exit.json."""
    if watcher is None:
        return None
    return watcher.publish(rc, watcher_log_tail(spec.get("log")), operator_stop)


def watcher_log_tail(path, limit=256 * 1024):
    try:
        return read_file(path, tail=limit)
    except (OSError, TypeError):
        return ""


def main():
    spec = json.loads(read_file(sys.argv[1]))
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader (started with start_new_session)
    me = os.getpid()
    my_ticks = stat(me)["start_ticks"]
    subreaper = become_subreaper()
    env = dict(os.environ)
    for path in spec.get("env_files", []):
        env.update(env_file(path))
    env.update(spec.get("env", {}))
    if spec.get("secret_env_file"):
        env.update(secret_env(spec["secret_env_file"]))
    env[TOKEN_ENV] = spec["token"]
    if not spec.get("resume_from"):
        env.pop("TRAINYARD_RESUME_FROM", None)
    # The log is in job-rw (runtime docker) where the job can plant a link: never followed (the launch fails).
    log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o640)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    if spec.get("chdir"):
        os.chdir(spec["chdir"])
    sys.stdout.write("trainyard-launch: %s start %s: %s\n" % (
        time.strftime("%Y-%m-%dT%H:%M:%S"), spec.get("name", "job"), " ".join(spec["argv"])))
    sys.stdout.flush()
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        os.set_inheritable(w, False)
        try:
            os.execvpe(spec["argv"][0], spec["argv"], env)
        except OSError as e:
            os.write(2, ("trainyard-launch: cannot run %s: %s\n" % (spec["argv"][0], e)).encode())
            os.write(w, b"x")
            os._exit(127)
    os.close(w)
    # Wait for the exec (the pipe closes on success, carries a byte on failure): the child recorded below is then the
    # job's own program with its own environment (the host checks the token there), never the copy between the two.
    exec_failed = bool(os.read(r, 1))
    os.close(r)
    child_ticks = None
    for _ in range(200):
        st = stat(child)
        if st is not None:
            child_ticks = st["start_ticks"]
            break
        time.sleep(0.005)
    write_json(spec["pid_file"], {"pid": me, "pgid": os.getpgid(0), "sid": os.getsid(0), "start_ticks": my_ticks,
                                  "child_pid": child, "child_start_ticks": child_ticks, "token": spec["token"],
                                  "subreaper": subreaper})
    stopping = []

    def forward(signum, _frame):
        stopping.append(signum)
        try:
            os.kill(child, signum)
        except OSError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    watcher = failfast_watch(spec, child)
    while True:
        # Any child: orphans re-parented to this subreaper are collected as they exit, torchrun ends the wait.
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            status = 255 << 8
            break
        if pid == child:
            break
    rc = os.waitstatus_to_exitcode(status)
    sys.stdout.write("trainyard-launch: %s %s exited with %s\n" % (
        time.strftime("%Y-%m-%dT%H:%M:%S"), spec.get("name", "job"),
        "signal %d" % -rc if rc < 0 else "code %d" % rc))
    sys.stdout.flush()
    failfast = failfast_finish(watcher, spec, rc, bool(stopping))
    write_json(spec["exit_file"], {"returncode": rc, "ended_at": time.time(), "stopped": bool(stopping),
                                   "exec_failed": exec_failed, "token": spec["token"],
                                   "peer_stop": (failfast or {}).get("peer_stop"), "failfast": failfast})
    # Workers torchrun left behind (their agent was killed) and anything else the job started: end them so peers
    # fail fast instead of waiting and nothing of this launch meets the next one.
    end_job(spec["token"], me, my_ticks, float(spec.get("leftover_grace", 5)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
