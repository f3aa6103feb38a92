#!/usr/bin/python
# -*- coding: utf-8 -*-
"""The rendezvous port: who holds it on the head, a short-lived probe listener, and TCP reach from workers."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: port_check
short_description: Rendezvous port ownership on the head, a probe listener, and TCP reach from the workers
description:
  - C(mode=inspect) (head) finds the sockets bound to I(port) in C(/proc/net/tcp) and C(/proc/net/tcp6) and
    maps their inodes to processes through C(/proc/*/fd); never by process name. A holder belongs to this
    tool's job when it is in the job recorded in the launch state file I(state_file) (leader PID with a
    matching start time, its process group, its descendants, the sidecars).
  - C(mode=listen) (head), or C(mode=inspect) with I(listen), starts a detached listener on I(address):I(port)
    for the workers' probe when the port is free. It exits by itself after I(listen_seconds) or after I(expect) connections, so it is gone
    even when the play stops half-way; C(mode=stop) ends it earlier (PID and start time checked).
  - C(mode=connect) (worker) opens one TCP connection with a I(timeout) and tells a timeout (packets dropped,
    e.g. a firewall DROP rule) from a refusal, an ICMP unreachable and a local blackhole/prohibit route.
  - "C(mode=stop_job_holders) (reset) stops the processes holding the port that belong to this tool's job
    (SIGTERM, then SIGKILL after I(grace), through C(module_utils/procgroup.py): a PID is signalled only while it is
    the process that was found); a holder outside the job is reported and left alone."
options:
  mode:
    description: What to do.
    type: str
    choices: [inspect, listen, stop, connect, stop_job_holders]
    required: true
  port:
    description: The rendezvous port.
    type: int
    required: true
  address:
    description: Address to listen on (listen) or connect to (connect).
    type: str
    default: ""
  state_file:
    description: The launch state file (launch.json) of this tool's job on this node.
    type: path
    default: ""
  timeout:
    description: Seconds a connect may take before it counts as dropped.
    type: float
    default: 3.0
  listen_seconds:
    description: Most seconds the probe listener lives.
    type: int
    default: 60
  expect:
    description: The listener exits after this many connections (0 waits for listen_seconds).
    type: int
    default: 0
  listen:
    description: With C(mode=inspect), also start the probe listener (as C(mode=listen)) when the port is free.
    type: bool
    default: false
  pid:
    description: Listener PID to stop (mode stop).
    type: int
    default: 0
  start_ticks:
    description: Start time (field 22 of /proc/PID/stat) of the listener to stop.
    type: int
    default: 0
  grace:
    description: Seconds between SIGTERM and SIGKILL (stop, stop_job_holders).
    type: float
    default: 5.0
attributes:
  check_mode:
    support: full
    details: listen, stop and stop_job_holders change nothing in check mode (the listener is a read-only probe
      otherwise).
  diff_mode:
    support: none
  idempotent:
    support: full
author: trainyard
"""

EXAMPLES = r"""
- name: Who holds the rendezvous port; a probe listener for the workers when nobody does
  port_check:
    mode: inspect
    port: 39500
    state_file: /var/lib/trainyard/train/launch.json
    listen: true
    address: 10.0.0.11
    listen_seconds: 600
    expect: 3

- name: Connect from a worker
  port_check:
    mode: connect
    address: 10.0.0.11
    port: 39500
    timeout: 3
"""

RETURN = r"""
holders:
  description: Sockets holding the port, C({pid, command, local, state, inode}) (inspect, stop_job_holders).
  returned: inspect, stop_job_holders
  type: list
verdict:
  description: C({state, ok, detail, fix}), state free, ours or other (inspect, stop_job_holders).
  returned: inspect, stop_job_holders
  type: dict
listener:
  description: C({listening, pid, start_ticks, address, port, reason}) (listen, inspect with I(listen) on a free port).
  returned: listen, inspect with listen
  type: dict
outcome:
  description: ok, timeout, refused, unreachable, blocked or error (connect).
  returned: connect
  type: str
seconds:
  description: How long the connect took (connect).
  returned: connect
  type: float
message:
  description: The socket error text (connect).
  returned: connect
  type: str
stopped:
  description: PIDs ended (stop, stop_job_holders).
  returned: stop, stop_job_holders
  type: list
"""

import json
import os
import select
import socket
import struct
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg
from ansible_collections.trainyard.core.plugins.module_utils import proc_sockets
from ansible_collections.trainyard.core.plugins.module_utils.netcheck import port_verdict
from ansible_collections.trainyard.core.plugins.module_utils.netprobe import connect


def read(path, mode="r"):
    try:
        with open(path, mode) as fh:
            return fh.read()
    except (IOError, OSError):
        return None


def command_of(pid, proc=pg.PROC):
    raw = read("%s/%d/cmdline" % (proc, pid), "rb")
    if raw:
        return " ".join(x.decode("utf-8", "replace") for x in raw.split(b"\0") if x)
    comm = read("%s/%d/comm" % (proc, pid))
    return "[%s]" % comm.strip() if comm else ""


def holders_of(port, proc=pg.PROC):
    """One entry per (socket holding the port, process holding that socket), through module_utils/proc_sockets.py
    (the rule reset uses too); a socket no visible process holds is one entry with pid None."""
    out = []
    for s in proc_sockets.port_holders(port, [st.pid for st in pg.all_stats(proc)], proc):
        for pid in s["pids"] or [None]:
            out.append({"pid": pid, "command": command_of(pid, proc) if pid else
                        "no process visible (another namespace?)",
                        "local": "%s:%d" % (s["local"], s["port"]), "state": s["state"], "inode": s["inode"]})
    return out


def load_state(path):
    if not path:
        return None
    text = read(path)
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def inspect(port, state_file, proc=pg.PROC):
    holders = holders_of(port, proc)
    state = load_state(state_file)
    ours, live = set(), False
    if holders and state:
        # The job's processes, selected as reset.yml selects them (a leftover of a crashed job, its launcher gone,
        # is known by the launch token in its environment).
        ours = {st.pid for st in pg.recorded_job(state, pg.all_stats(proc))}
        live = pg.recorded_alive(state, proc=proc)
    return holders, port_verdict(port, holders, ours, live=live), ours


def stop(targets, grace):
    """Stop the processes (pid, start_ticks) in targets that still run: procgroup's SIGTERM, SIGKILL after grace s,
    each signal only while the PID is the process that was found. The PIDs that were running."""
    found = [st.pid for st in pg.running(targets)]
    if found:
        pg.terminate(lambda: pg.running(targets), grace=grace)
    return found


def serve(sock, seconds, expect):
    """Accept probe connections until every expected worker came (or the deadline). Each connection is closed
    after its client closed it (a passive close leaves TIME_WAIT on the client's ephemeral port, not on the
    rendezvous port a job binds next); one still open at the end is reset (RST, no TIME_WAIT either)."""
    deadline = time.time() + seconds
    seen = 0
    conns = []
    while time.time() < deadline and (expect <= 0 or seen < expect or conns):
        ready, _, _ = select.select([sock] + conns, [], [], max(0.0, min(1.0, deadline - time.time())))
        for r in ready:
            if r is sock:
                try:
                    conn, _ = sock.accept()
                    conns.append(conn)
                    seen += 1
                except (OSError, socket.error):
                    pass
                continue
            try:
                data = r.recv(64)
            except (OSError, socket.error):
                data = b""
            if not data:  # the client closed: close our side
                conns.remove(r)
                r.close()
    for conn in conns:
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except (OSError, socket.error):
            pass
        conn.close()
    sock.close()


def start_listener(address, port, seconds, expect):
    """Bind in a detached grandchild (own session, stdio on /dev/null) and report back through a pipe."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        try:
            os.close(rfd)
            os.setsid()
            if os.fork() > 0:
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            for fd in range(3, 1024):
                if fd not in (wfd,):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(256)
            os.write(wfd, ("ok %d" % os.getpid()).encode())
            os.close(wfd)
            serve(sock, seconds, expect)
        except Exception as exc:  # report any failure to the parent, never raise in a forked child
            try:
                os.write(wfd, ("err %s" % exc).encode())
            except OSError:
                pass
        os._exit(0)
    os.close(wfd)
    os.waitpid(child, 0)
    chunks = []
    while True:
        data = os.read(rfd, 4096)
        if not data:
            break
        chunks.append(data)
    os.close(rfd)
    msg = b"".join(chunks).decode("utf-8", "replace")
    if msg.startswith("ok "):
        pid = int(msg.split()[1])
        return {"listening": True, "pid": pid, "start_ticks": pg.start_ticks(pid) or 0, "address": address,
                "port": port, "reason": "probe listener for %d s" % seconds}
    return {"listening": False, "pid": 0, "start_ticks": 0, "address": address, "port": port,
            "reason": "cannot listen on %s:%d: %s" % (address, port, msg[4:] if msg else "listener died")}


def listen(module, holders, verdict):
    """The probe listener on a free port (none in check mode or when something holds the port)."""
    p = module.params
    reason = ("something already listens: %s" % verdict["detail"] if holders
              else "check mode" if module.check_mode else None)
    if reason:
        return {"listening": False, "pid": 0, "start_ticks": 0, "address": p["address"], "port": p["port"],
                "reason": reason}
    return start_listener(p["address"], p["port"], p["listen_seconds"], p["expect"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", required=True, choices=["inspect", "listen", "stop", "connect", "stop_job_holders"]),
            port=dict(type="int", required=True),
            address=dict(type="str", default=""),
            state_file=dict(type="path", default=""),
            timeout=dict(type="float", default=3.0),
            listen_seconds=dict(type="int", default=60),
            expect=dict(type="int", default=0),
            listen=dict(type="bool", default=False),
            pid=dict(type="int", default=0),
            start_ticks=dict(type="int", default=0),
            grace=dict(type="float", default=5.0),
        ),
        required_if=[("mode", "listen", ["address"]), ("listen", True, ["address"]), ("mode", "connect", ["address"]),
                     ("mode", "stop", ["pid", "start_ticks"])],
        supports_check_mode=True,
    )
    p = module.params
    if not 1 <= p["port"] <= 65535:
        module.fail_json(msg="port %d is not a TCP port (1-65535)" % p["port"])
    mode = p["mode"]
    if mode == "inspect":
        holders, verdict, ours = inspect(p["port"], p["state_file"])
        result = dict(changed=False, holders=holders, verdict=verdict, ours=sorted(ours))
        if p["listen"] and verdict["state"] == "free":
            result["listener"] = listen(module, holders, verdict)
        module.exit_json(**result)
    if mode == "connect":
        outcome, took, message = connect(p["address"], p["port"], p["timeout"])
        module.exit_json(changed=False, outcome=outcome, seconds=took, message=message)
    if mode == "listen":
        holders, verdict, _ = inspect(p["port"], "")
        # A probe listener is transient (it ends itself): not a change to the node.
        module.exit_json(changed=False, listener=listen(module, holders, verdict))
    if mode == "stop":
        if module.check_mode:
            module.exit_json(changed=False, stopped=[])
        module.exit_json(changed=False, stopped=stop([(p["pid"], p["start_ticks"])], p["grace"]))
    # stop_job_holders
    holders, verdict, ours = inspect(p["port"], p["state_file"])
    stopped = []
    if verdict["state"] in ("ours", "running") and not module.check_mode:  # reset stops this job, live or not
        targets = [(st.pid, st.start_ticks) for st in (pg.read_stat(h["pid"]) for h in holders
                                                       if h.get("pid") in ours) if st is not None]
        stopped = stop(targets, p["grace"])
        holders, verdict, ours = inspect(p["port"], p["state_file"])
    module.exit_json(changed=bool(stopped), holders=holders, verdict=verdict, stopped=stopped)


if __name__ == "__main__":
    main()
