# -*- coding: utf-8 -*-
"""The Slurm backend's runner: the batch script and the per-node task of a job submitted by library/slurm_job.py.

Written (this file's own text) to <state_root>/<job>/slurm/slurm_node.py on every node; standard library only.

    slurm_node.py batch <batch.json>   the sbatch script (sbatch runs it with the shebang's Python): execs srun,
                                       one task per node, each running `slurm_node.py node <node.json>`
    slurm_node.py node <node.json>     on each node: this node's torchrun inside the training container through
                                       `docker exec` (argument lists, no shell), its output to the node-local log

Every process the task starts in the container carries TRAINYARD_LAUNCH_ID=<token> (token = slurm-<job id>); the
engine does not pass a signal to `docker exec`'s client on to the process it started, so on SIGTERM (scancel, the end
of the job step) the task ends exactly the processes holding its token, and a watchdog it leaves behind does the same
when the task itself is killed with SIGKILL (--kill-on-bad-exit, KillWait). Nothing is found by name.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

TOKEN_ENV = "TRAINYARD_LAUNCH_ID"
GRACE_S = 10.0


def load(path):
    with open(path) as f:
        return json.load(f)


def token_holders(token):
    """PIDs whose environment carries TRAINYARD_LAUNCH_ID=<token> (the job's processes in the container: pid_mode
    host makes them visible here), this process excluded."""
    needle = ("%s=%s" % (TOKEN_ENV, token)).encode()
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(name))
        except OSError:
            continue
    return out


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def end_token(token, grace=GRACE_S):
    """SIGTERM every holder of the token, SIGKILL what is left after grace seconds. Returns how many were killed."""
    pids = token_holders(token)
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.2)
        pids = token_holders(token)
    signal_all(pids, signal.SIGKILL)
    return len(pids)


def watchdog(parent, token):
    """A detached process (double fork, new session: outside the job step's process tree) that ends the token's
    processes once the task process `parent` is gone, however it went."""
    if os.fork() != 0:
        return
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    while True:
        try:
            os.kill(parent, 0)
        except OSError:
            break
        time.sleep(0.5)
    end_token(token)
    os._exit(0)


def docker_argv(spec, token):
    """docker exec for this node's torchrun: the environment and the secrets by --env-file (host-only files docker
    reads on the host: no value on a command line, where `ps` shows it), the token, the working directory, then the
    container and the torchrun argv."""
    argv = [spec.get("docker") or "docker", "exec"]
    for key in ("env_file", "secret_env_file"):
        if spec.get(key):
            argv += ["--env-file", spec[key]]
    argv += ["-e", "%s=%s" % (TOKEN_ENV, token)]
    if spec.get("chdir"):
        argv += ["-w", spec["chdir"]]
    return argv + [spec["container"]] + list(spec["argv"])


def srun_argv(spec, script, node_spec):
    """srun for the batch step: one task per node of the allocation, each running this script in node mode."""
    return ([spec.get("srun") or "srun", "--ntasks-per-node=1", "--nodes=%d" % int(spec["nnodes"]),
             "--kill-on-bad-exit=1", "--unbuffered"] + list(spec.get("srun_args") or [])
            + [spec.get("python") or sys.executable, script, "node", node_spec])


def open_log(path):
    """This run's log in the job-writable directory: the previous run's moved to <log>.1 (a rename: nothing followed),
    then a new regular file opened without following a link the job may have planted (O_NOFOLLOW, O_NONBLOCK against
    a FIFO, a regular file only)."""
    try:
        os.rename(path, path + ".1")
    except OSError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SystemExit("%s is not a regular file: remove it (ansible-playbook reset.yml)" % path)
    return os.fdopen(fd, "ab", buffering=0)


def run_node(spec_path):
    spec = load(spec_path)
    token = "slurm-%s" % os.environ.get("SLURM_JOB_ID", "0")
    log = open_log(spec["log"])
    log.write(("trainyard: slurm job %s step %s on %s, node rank %s\n" % (
        os.environ.get("SLURM_JOB_ID", "?"), os.environ.get("SLURM_STEP_ID", "?"),
        os.environ.get("SLURMD_NODENAME", "?"), spec.get("node_rank"))).encode())
    watchdog(os.getpid(), token)
    child = subprocess.Popen(docker_argv(spec, token), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def stop(signum, _frame):
        log.write(("trainyard: signal %d from Slurm: ending the job's processes on this node\n" % signum).encode())
        end_token(token)
        try:
            child.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    rc = child.wait()
    log.write(("trainyard: torchrun on this node exited with %d\n" % rc).encode())
    return rc


def main(argv):
    if len(argv) != 3 or argv[1] not in ("batch", "node"):
        sys.stderr.write("usage: slurm_node.py batch <batch.json> | node <node.json>\n")
        return 2
    if argv[1] == "node":
        return run_node(argv[2])
    spec = load(argv[2])
    # sbatch runs a copy of this script from its spool directory: srun runs the node-local copy spec["script"].
    cmd = srun_argv(spec, spec["script"], spec["node_spec"])
    sys.stdout.write("trainyard: %s\n" % " ".join(cmd))
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
