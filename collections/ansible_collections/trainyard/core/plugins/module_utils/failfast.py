#!/usr/bin/env python3
# trainyard fail-fast watcher (written by torchrun_launch beside launcher.py; do not edit).
"""Cross-node fail-fast for one torchrun job: once any node's torchrun ends with an error, every other node's
torchrun is stopped, whatever the collectives are doing (NCCL can sit ~60 s in its error path, and a rank busy in
a long compute phase never notices a dead peer).

How: each node's launcher (launcher.py, the job's Python, on the host or inside the training container) joins, as a
plain client (is_master=False, no world size: it never counts towards torchrun's rendezvous), the TCPStore that the
head's torchrun agent hosts at master_addr:master_port (both rendezvous backends, static and c10d, serve it there).
All keys sit under a private prefix (trainyard-failfast/<job>/<rdzv id>/). A node whose torchrun exits non-zero
(not stopped by an operator, not stopped by this watcher) sets the key `failed` (first writer wins: compare_set)
to its node rank, return code and the root cause torchrun reported (rank, local rank, exit code, signal). Every
launcher polls the key once a second; when another node's failure is there, or when the store has been
unreachable for `lost_s` seconds after it was once reached (the head's torchrun ended: its store went with it), it
stops its own torchrun (SIGTERM, `grace_s`, SIGKILL; launcher.py then ends the workers left behind) and its exit
record (launch.exit.json) says why: key `peer_stop`.

Standard library, plus torch imported lazily (in the watcher's thread): the launcher runs with the job's Python,
which has torch; without it the watcher says so in the log and the job runs without fail-fast.
The pure parts (spec_for, root_cause_of, stop_words) are unit-tested; the rest runs in tests/unit/module_utils/test_failfast.py
against a real TCPStore and in tests/integration/test_failfast.py on the simulated cluster.
"""
import json
import os
import re
import signal
import sys
import threading
import time

KEY = "failed"
FILE = "failfast.py"  # its name beside launcher.py in the job's read-only directory

_ROOT = re.compile(r"^Root Cause", re.M)
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.M)
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)
_HOST = re.compile(r"^\s*host\s*:\s*(\S+)", re.M)
_SIGNAMES = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def spec_for(nnodes, node_rank, master_addr, master_port, job, rdzv_id="", poll_s=1.0, lost_s=5.0, grace_s=5.0,
             min_nnodes=0):
    """The launcher spec's `failfast` section (torchrun_launch writes it), or None where there is nothing to watch
    (one node: torchrun itself stops the node's other ranks) or where the job must outlive a node (an elastic job,
    min_nnodes set: the other nodes' agents rendezvous again without it)."""
    if int(nnodes or 1) < 2 or not master_addr or int(min_nnodes or 0):
        return None
    return {"host": str(master_addr), "port": int(master_port), "node_rank": int(node_rank),
            "prefix": "trainyard-failfast/%s/%s/" % (job, rdzv_id or "-"),
            "poll_s": float(poll_s), "lost_s": float(lost_s), "grace_s": float(grace_s)}


def root_cause_of(text):
    """{rank, local_rank, exitcode, signal, host} from the last torchrun failure report in a log ({} if none)."""
    starts = [m.end() for m in _ROOT.finditer(text)]
    if not starts:
        return {}
    block = text[starts[-1]:starts[-1] + 4000]
    out = {}
    m = _RANK.search(block)
    if m:
        out.update(rank=int(m.group(1)), local_rank=int(m.group(2)))
    m = _EXIT.search(block)
    if m:
        code = int(m.group(1))
        out["exitcode"] = code
        if code < 0:
            out["signal"] = _SIGNAMES.get(-code, "signal %d" % -code)
    m = _HOST.search(block)
    if m:
        out["host"] = m.group(1)
    return out


def stop_words(peer):
    """One line on why this node was stopped: peer is the `peer_stop` record."""
    if peer.get("why") == "store_lost":
        return ("stopped because the head's rendezvous store (%s) was unreachable for %.0f s: node rank 0 ended or "
                "its network failed" % (peer.get("store"), peer.get("lost_s", 0)))
    f = peer.get("failure") or {}
    what = "exit code %s" % f.get("exitcode", f.get("returncode"))
    if f.get("signal"):
        what += " (%s)" % f["signal"]
    rank = "rank %s (local rank %s)" % (f.get("rank"), f.get("local_rank")) if f.get("rank") is not None \
        else "its torchrun agent"
    return "stopped because node rank %s failed: %s, %s" % (f.get("node_rank"), rank, what)


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _workers_left(pid):
    """Whether torchrun (pid) still has a child process (its workers): False once every worker exited, when torchrun
    only waits in its exit barrier; None when /proc does not say (no /proc/PID/task/TID/children)."""
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                if f.read().split():
                    return True
        return False
    except OSError:
        return None


class Watcher(object):
    """The watcher thread of one launcher. start() after torchrun was forked; publish() once it exited."""

    def __init__(self, cfg, child, say):
        self.cfg, self.child, self.say = cfg, child, say
        self.key = cfg["prefix"] + KEY
        self.store = None
        self.reached = False
        self.peer_stop = None
        self.note = ""
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.run, name="trainyard-failfast")
        self.thread.daemon = True

    def start(self):
        self.thread.start()
        return self

    def connect(self, timeout):
        from datetime import timedelta
        from torch.distributed import TCPStore
        return TCPStore(self.cfg["host"], self.cfg["port"], None, False, timedelta(seconds=timeout),
                        wait_for_workers=False)

    def run(self):
        # torch's C++ side logs every retry to stderr (the job's log): only fatal lines from here on. The job's own
        # environment was built before this point, so this does not reach it.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
        try:
            import importlib
            importlib.import_module("torch.distributed")
        except Exception as e:  # any import failure: the job runs, without fail-fast
            self.note = "off: torch.distributed not importable (%s)" % str(e)[:200]
            self.say("fail-fast watcher %s" % self.note)
            self.ready.set()
            return
        self.ready.set()
        poll, lost_s = self.cfg["poll_s"], self.cfg["lost_s"]
        lost_since = None
        while not self.done.is_set():
            try:
                with self.lock:
                    if self.store is None:
                        self.store = self.connect(1.0)  # torch retries within it: about 2.5 s to a dead port
                    raw = self.store.get(self.key) if self.store.check([self.key]) else None
                if not self.reached:
                    self.say("fail-fast watcher joined the head's store %s:%s" % (self.cfg["host"], self.cfg["port"]))
                self.reached, lost_since = True, None
                if raw:
                    failure = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
                    if failure.get("node_rank") != self.cfg["node_rank"]:
                        if self.cfg["node_rank"] == 0:
                            # The head's torchrun hosts the store: give the other nodes one more poll to read the
                            # failure (and name it) before the store goes with the head's torchrun.
                            self.done.wait(poll * 1.5)
                        self.stop({"why": "peer_failed", "failure": failure, "seen_at": time.time()})
                        return
            except Exception:  # the store's errors (DistNetworkError, timeouts): the head is gone or not up yet
                with self.lock:
                    self.store = None
                # A lost store with no worker left is the job's normal end: the head's torchrun ended (its store with
                # it) while this node's torchrun waits in its exit barrier, which ends by itself. Nothing to stop.
                if self.reached and self.cfg["node_rank"] != 0 and _workers_left(self.child) is not False:
                    now = time.monotonic()
                    lost_since = lost_since or now
                    if now - lost_since >= lost_s:
                        self.stop({"why": "store_lost", "store": "%s:%s" % (self.cfg["host"], self.cfg["port"]),
                                   "lost_s": round(now - lost_since, 1), "seen_at": time.time()})
                        return
            self.done.wait(poll)

    def stop(self, peer):
        """Stop this node's torchrun: SIGTERM (torchrun stops its workers), then SIGKILL after grace_s; the
        launcher's exit path ends any worker left behind."""
        if self.done.is_set():
            return  # torchrun already ended by itself
        self.peer_stop = peer
        peer["reason"] = stop_words(peer)
        self.say(peer["reason"])
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(self.child, sig)
            except OSError:
                return
            deadline = time.monotonic() + self.cfg["grace_s"]
            while time.monotonic() < deadline and _alive(self.child) and not self.done.is_set():
                time.sleep(0.1)
            if self.done.is_set() or not _alive(self.child):
                return

    def publish(self, returncode, log_text, operator_stop):
        """After torchrun exited: stop watching; a failure of this node's own goes into the store for the others.
        Returns the `failfast` part of the exit record."""
        self.done.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(3)  # a store call in flight ends within its timeout (a connect: about 2.5 s)
        record = {"peer_stop": self.peer_stop}
        if self.note:
            record["note"] = self.note
        if returncode == 0 or operator_stop or self.peer_stop is not None:
            return record
        failure = dict(root_cause_of(log_text), node_rank=self.cfg["node_rank"], returncode=returncode,
                       at=time.time())
        failure.setdefault("exitcode", returncode)
        if returncode < 0 and "signal" not in failure and failure.get("rank") is None:
            failure["signal"] = _SIGNAMES.get(-returncode, "signal %d" % -returncode)
        if self.store is None:  # unreachable (the head's torchrun, which served it, ended): the others see it lost
            record.update(published=False, note="the head's store was unreachable: not published")
            return record
        try:
            with self.lock:
                first = self.store.compare_set(self.key, "", json.dumps(failure))
            first = json.loads(first.decode() if isinstance(first, bytes) else first)
            record["published"] = first.get("node_rank") == self.cfg["node_rank"]
        except Exception as e:  # the head's store is gone (this is the head, or it ended too): the others see it lost
            record["published"] = False
            record["note"] = "could not publish the failure: %s" % str(e).splitlines()[0][:200] if str(e) else \
                "could not publish the failure"
        return record


def watch(spec, child, say):
    """The launcher's hook: a started Watcher for a multi-node job's torchrun, or None."""
    cfg = spec.get("failfast")
    if not cfg or spec.get("name", "torchrun") != "torchrun":
        return None
    return Watcher(cfg, child, say).start()


if __name__ == "__main__":
    sys.exit("failfast.py is imported by launcher.py, not run")
