# -*- coding: utf-8 -*-
"""The cluster lock's heartbeat, kept in ansible-playbook's own process (the callback ``cluster_lock``).

The action ``cluster_lock_guard`` says in its result what it took or gave back (``cluster_lock_keeper``: the node's
lock directory, the run's token, the heartbeat interval, held or not); the callback, which sees every result in the
main process, hands it to a ``Keeper``. A thread of that process runs each due heartbeat, and at exit the release of
every lock still held, as a child process through Ansible's public command line (``python -m ansible.cli.adhoc``,
the run's own inventory and connection options): no fork of a worker, no private API. A beat is the module ``raw``
running one fixed shell script (``BEAT_SCRIPT``): no module is built or sent and no Python starts on the node; the
release at exit is the module ``cluster_lock`` (``state=absent``).

The thread lives exactly as long as ansible-playbook: a run killed with -9 stops beating at once (a beat already
under way ends on its own) and its locks go stale after ``cluster_lock_stale_s``, as the lock's design wants.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time

# ansible-playbook options (their CLIARGS keys) the heartbeat's ad-hoc run repeats: where the inventory is and how to
# reach and become on the nodes. Prompts (-k, -K, -J) are not repeated: a child never asks.
_VALUE_OPTS = (
    ("remote_user", "--user"), ("connection", "--connection"), ("private_key_file", "--private-key"),
    ("timeout", "--timeout"), ("ssh_common_args", "--ssh-common-args"), ("ssh_extra_args", "--ssh-extra-args"),
    ("sftp_extra_args", "--sftp-extra-args"), ("scp_extra_args", "--scp-extra-args"),
    ("connection_password_file", "--connection-password-file"), ("become_method", "--become-method"),
    ("become_user", "--become-user"), ("become_password_file", "--become-password-file"),
)
_LIST_OPTS = (("inventory", "--inventory"), ("extra_vars", "--extra-vars"), ("vault_ids", "--vault-id"),
              ("vault_password_files", "--vault-password-file"))
# Longest a beat or the release at exit may take (an unreachable node costs the SSH ConnectTimeout).
RUN_TIMEOUT_S = 120.0
# One heartbeat on a node, module_utils/cluster_lock.heartbeat's rule in POSIX sh: touch the lock when it is a plain
# file (not a link) holding this run's token, as the module writes it (json.dumps: '"token": "<token>"'), else fail.
# The lock directory and the token are the script's arguments ($1, $2), each quoted by shlex.quote: the script's text
# is fixed, nothing from the inventory becomes shell code. The lock directory is 0700 and root's (ensure_dir), so
# nobody else can swap the file between the test and the touch.
BEAT_SCRIPT = ('f="$1/cluster.lock"; [ -f "$f" ] && [ ! -h "$f" ] '
               '&& grep -qF -e "\\"token\\": \\"$2\\"" -- "$f" && touch -c -- "$f"')
_HEADER = re.compile(r"^\S+ \| ([A-Z!]+)")


def beat_command(path, token):
    """The raw module's command of one heartbeat of the lock in directory path held with token."""
    return " ".join(["sh", "-c", shlex.quote(BEAT_SCRIPT), "trainyard-lock-beat", shlex.quote(str(path)),
                     shlex.quote(str(token))])


def adhoc_argv(cliargs, hosts, module_args, python=None, module="cluster_lock"):
    """The ad-hoc command that runs module with module_args (a dict, sent as JSON, or the raw module's command) on
    hosts (inventory names), with the inventory, connection and become options of the ansible-playbook run (cliargs:
    its ansible.context.CLIARGS). Options are given as --name=value, so a value that starts with '-' stays a value."""
    argv = [python or sys.executable, "-m", "ansible.cli.adhoc", ",".join(hosts)]
    for key, opt in _LIST_OPTS:
        for value in cliargs.get(key) or ():
            argv.append("%s=%s" % (opt, value))
    for key, opt in _VALUE_OPTS:
        value = cliargs.get(key)
        if value not in (None, ""):
            argv.append("%s=%s" % (opt, value))
    if cliargs.get("become"):
        argv.append("--become")
    module_path = cliargs.get("module_path")
    if module_path:
        argv.append("--module-path=%s" % (os.pathsep.join(module_path) if isinstance(module_path, (list, tuple))
                                           else module_path))
    args = module_args if isinstance(module_args, str) else json.dumps(module_args, sort_keys=True)
    argv += ["--module-name=%s" % module, "--args=%s" % args]
    return argv


def beat_argv(cliargs, hosts, path, token, python=None):
    """The ad-hoc command of one heartbeat of hosts (BEAT_SCRIPT through the module raw)."""
    return adhoc_argv(cliargs, hosts, beat_command(path, token), python, module="raw")


def first_problem(returncode, output):
    """None when every node answered, else one line: the first node's line of the ad-hoc output that is not a
    success ("node3 | FAILED | rc=1 >>", "node3 | UNREACHABLE! => ..."), else its first line."""
    if returncode == 0:
        return None
    lines = [ln.strip() for ln in (output or "").splitlines() if ln.strip()]
    heads = [ln for ln in lines if _HEADER.match(ln) and _HEADER.match(ln).group(1) not in ("SUCCESS", "CHANGED")]
    line = (heads or lines or ["exit status %s" % returncode])[0]
    if line.endswith("| FAILED | rc=1 >>"):  # BEAT_SCRIPT's "not this run's lock"
        line = "%s: the lock file is gone or holds another run's token" % line.split(" | ", 1)[0]
    return line if len(line) <= 300 else line[:297] + "..."


class Keeper:
    """The locks this run holds: {(host, path): {token, interval}}, grouped per (path, token, interval) into one
    heartbeat each (one ad-hoc run for every node of the group), each due every interval seconds."""

    def __init__(self):
        self._held = {}
        self._next = {}  # group -> monotonic time of its next beat
        self._mutex = threading.Lock()

    def note(self, host, keep, now):
        """A cluster_lock_keeper result of host: {path, token, interval_s, hold}."""
        if not isinstance(keep, dict) or not keep.get("path"):
            return
        key = (str(host), str(keep["path"]))
        with self._mutex:
            if keep.get("hold") and keep.get("token"):
                group = (key[1], str(keep["token"]), max(1.0, float(keep.get("interval_s") or 1.0)))
                self._held[key] = group
                self._next.setdefault(group, now + group[2])
            else:
                self._held.pop(key, None)
            live = set(self._held.values())
            for group in [g for g in self._next if g not in live]:
                del self._next[group]

    def holding(self):
        with self._mutex:
            return bool(self._held)

    def _hosts(self, group):
        return sorted(h for (h, _), g in self._held.items() if g == group)

    def due(self, now):
        """[(hosts, module_args)] of the heartbeats due at now (each then scheduled an interval later)."""
        out = []
        with self._mutex:
            for group, at in sorted(self._next.items()):
                if at <= now:
                    path, token, interval = group
                    out.append((self._hosts(group), {"path": path, "state": "heartbeat", "token": token}))
                    self._next[group] = now + interval
        return out

    def release_all(self):
        """[(hosts, module_args)] that give back every lock still held; nothing is held afterwards."""
        with self._mutex:
            groups = sorted(set(self._held.values()))
            out = [(self._hosts(g), {"path": g[0], "state": "absent", "token": g[1]}) for g in groups]
            self._held.clear()
            self._next.clear()
        return out


def run_adhoc(argv, timeout=RUN_TIMEOUT_S):
    """(returncode, output) of one ad-hoc run, in a session of its own (a Ctrl-C of the terminal does not cut a beat
    or the release at exit), stdin closed (it never asks)."""
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, start_new_session=True, check=False)
    except subprocess.TimeoutExpired:
        return 124, "the cluster lock's ad-hoc run took over %d s" % timeout
    except OSError as exc:
        return 127, "could not start %s: %s" % (argv[0], exc)
    return r.returncode, r.stdout.decode("utf-8", "replace")


class Heartbeat:
    """The thread that beats a Keeper's locks while the process lives; release_at_exit gives back what is left.
    run: (argv) -> (returncode, output); problems: the first failure of each kind, for the main thread to show
    (a thread of ansible-playbook never writes to its display)."""

    TICK_S = 0.5

    def __init__(self, keeper, cliargs, run=run_adhoc, clock=time.monotonic):
        self.keeper, self.cliargs, self.run, self.clock = keeper, cliargs, run, clock
        self.problems = []
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="trainyard-cluster-lock-heartbeat", daemon=True)
            self._thread.start()

    def _loop(self):
        while not self._stop.wait(self.TICK_S):
            self.beat_once()

    def beat_once(self):
        for hosts, args in self.keeper.due(self.clock()):
            if self._stop.is_set():
                return
            problem = first_problem(*self.run(beat_argv(self.cliargs, hosts, args["path"], args["token"])))
            if problem and not self.problems:
                self.problems.append("cluster lock heartbeat of %s: %s" % (", ".join(hosts), problem))

    def release_at_exit(self):
        """Stop beating, wait for a beat under way (nothing touches a lock after ansible-playbook exited), give back
        every lock still held."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(RUN_TIMEOUT_S)
        for hosts, args in self.keeper.release_all():
            self.run(adhoc_argv(self.cliargs, hosts, args))
