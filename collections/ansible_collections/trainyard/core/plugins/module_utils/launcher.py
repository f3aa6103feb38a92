#!/usr/bin/env python3
# trainyard launcher (written by torchrun_launch; do not edit). Usage: launcher.py SPEC.json
# Written into the job's read-only directory (<state_root>/<job>/job-ro/launcher.py) and run with the job's python
# (host or inside the training container, which mounts that directory read-only at the same path); standard library
# only. It becomes a session leader, writes its PID, start time and the torchrun PID, runs torchrun with the
# environment applied, forwards SIGTERM/SIGINT, records torchrun's exit status, and on the way out ends any process
# still carrying the job's launch token (workers orphaned by an agent that was killed), so a dead agent never leaves
# ranks hanging at a collective.
import json, os, signal, sys, time

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


def write_json(path, data):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640), "w") as f:
        json.dump(data, f)
    os.rename(tmp, path)


def secret_env(path):
    """KEY=value lines taken literally (the module checked the file: 0600, every line KEY=value)."""
    env = {}
    with open(path) as f:
        for line in f.read().split("\n"):
            k, sep, v = line.rstrip("\r").partition("=")
            if sep and k and not k.lstrip().startswith("#"):
                env[k] = v
    return env


def env_file(path):
    env = {}
    with open(path) as f:
        for raw in f.read().split("\n"):
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
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace")
    except (OSError, TypeError):
        return ""


def main():
    spec = json.load(open(sys.argv[1]))
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader (started with start_new_session)
    me = os.getpid()
    my_ticks = stat(me)["start_ticks"]
    env = dict(os.environ)
    for path in spec.get("env_files", []):
        env.update(env_file(path))
    env.update(spec.get("env", {}))
    if spec.get("secret_env_file"):
        env.update(secret_env(spec["secret_env_file"]))
    env[TOKEN_ENV] = spec["token"]
    if not spec.get("resume_from"):
        env.pop("TRAINYARD_RESUME_FROM", None)
    log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
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
    child_ticks = None
    for _ in range(200):
        st = stat(child)
        if st is not None:
            child_ticks = st["start_ticks"]
            break
        time.sleep(0.005)
    write_json(spec["pid_file"], {"pid": me, "pgid": os.getpgid(0), "sid": os.getsid(0), "start_ticks": my_ticks,
                                  "child_pid": child, "child_start_ticks": child_ticks, "token": spec["token"]})
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
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            status = 255 << 8
            break
    exec_failed = bool(os.read(r, 1))
    rc = os.waitstatus_to_exitcode(status)
    sys.stdout.write("trainyard-launch: %s %s exited with %s\n" % (
        time.strftime("%Y-%m-%dT%H:%M:%S"), spec.get("name", "job"),
        "signal %d" % -rc if rc < 0 else "code %d" % rc))
    sys.stdout.flush()
    failfast = failfast_finish(watcher, spec, rc, bool(stopping))
    write_json(spec["exit_file"], {"returncode": rc, "ended_at": time.time(), "stopped": bool(stopping),
                                   "exec_failed": exec_failed, "token": spec["token"],
                                   "peer_stop": (failfast or {}).get("peer_stop"), "failfast": failfast})
    # Workers torchrun left behind (their agent was killed): end them so peers fail fast instead of waiting.
    grace = float(spec.get("leftover_grace", 5))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        procs = leftovers(spec["token"], me, my_ticks)
        if not procs:
            break
        for pid, ticks in procs:
            kill_if_same(pid, ticks, sig)
        deadline = time.time() + grace
        while time.time() < deadline and leftovers(spec["token"], me, my_ticks):
            time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
