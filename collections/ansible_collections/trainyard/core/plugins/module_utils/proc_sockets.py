# -*- coding: utf-8 -*-
"""Who holds a TCP port on this node: the one ``/proc/net/tcp{,6}`` parser and the one ``/proc/*/fd`` scan.

Preflight (``port_check``, the rendezvous port verdict) and reset (``job_reset``, the port's owner) both ask this
module, so they can never disagree about who holds the rendezvous port.

The rule, one for both: a socket *holds* a port when torchrun's store could not bind it while the socket lives,
that is a socket in ``LISTEN``, or one bound to the port and not listening (state ``CLOSE`` with no peer). A
``TIME_WAIT`` entry (no inode, no process), an accepted or outgoing connection (``ESTABLISHED``, ``CLOSE_WAIT``,
...) does not hold it: torchrun's store binds with ``SO_REUSEADDR``, which the kernel grants over those.

Limit (kernel, not this code): Linux lists in ``/proc/net/tcp`` only the sockets in its listening and connection
tables; a socket only ``bind()``-ed, never listening nor connecting, is in neither, so it is invisible here (it
still makes torchrun's bind fail: the launch's own error then names the port).

Every reader takes ``proc`` (default ``/proc``) so a test drives it on a /proc look-alike. Stdlib only.
"""

from __future__ import absolute_import, division, print_function

import os
import re

PROC = "/proc"

TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
              "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN",
              "0B": "CLOSING"}


def _hex_addr(text):
    """'0100007F:1F90' -> ('127.0.0.1', 8080) for IPv4; IPv6 addresses come back in their short text form."""
    addr, port = text.split(":")
    raw = bytearray.fromhex(addr)
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw)), int(port, 16)
    if len(raw) != 16:
        raise ValueError("address of %d bytes" % len(raw))
    b = bytearray()
    for i in range(0, 16, 4):
        b.extend(reversed(raw[i:i + 4]))
    ip = ":".join("%02x%02x" % (b[i], b[i + 1]) for i in range(0, 16, 2))
    return _compress_v6(ip), int(port, 16)


def _compress_v6(ip):
    groups = [g.lstrip("0") or "0" for g in ip.split(":")]
    if groups[:5] == ["0"] * 5 and groups[5] == "ffff":
        hexes = "".join(g.zfill(4) for g in groups[6:])
        return "::ffff:" + ".".join(str(int(hexes[i:i + 2], 16)) for i in range(0, 8, 2))
    best, start = (0, 0), None
    for i, g in enumerate(groups + ["x"]):
        if g == "0" and start is None:
            start = i
        elif g != "0" and start is not None:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = None
    if best[1] - best[0] > 1:
        return ":".join(groups[:best[0]]) + "::" + ":".join(groups[best[1]:])
    return ":".join(groups)


def holds_port(state, remote_port):
    """The rule: LISTEN, or CLOSE with no peer (bound, not listening). ``remote_port`` is the peer's port."""
    return state == "LISTEN" or (state == "CLOSE" and remote_port == 0)


def parse_proc_net_tcp(text, port):
    """Sockets that hold ``port`` (see ``holds_port``) in the text of /proc/net/tcp or tcp6.

    Returns [{local, port, state, inode}] in file order; malformed lines and inode 0 (no socket) are skipped."""
    out = []
    for line in (text or "").splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10:
            continue
        try:
            ip, lport = _hex_addr(parts[1])
            _, rport = _hex_addr(parts[2])
            inode = int(parts[9])
        except (ValueError, IndexError):
            continue
        state = TCP_STATES.get(parts[3].upper(), parts[3])
        if lport != int(port) or inode == 0 or not holds_port(state, rport):
            continue
        out.append({"local": ip, "port": lport, "state": state, "inode": inode})
    return out


def socket_inode(link_target):
    """'socket:[12345]' -> 12345, anything else -> None."""
    m = re.match(r"^socket:\[(\d+)\]$", link_target or "")
    return int(m.group(1)) if m else None


def fd_targets(pid, proc=PROC):
    """The link targets of every open descriptor of ``pid`` ('/path', 'socket:[N]', 'pipe:[N]', ...); [] when the
    process is gone or unreadable. The one /proc/PID/fd scan."""
    d = "%s/%d/fd" % (proc, int(pid))
    try:
        names = os.listdir(d)
    except OSError:
        return []
    out = []
    for n in names:
        try:
            out.append(os.readlink(os.path.join(d, n)))
        except OSError:
            continue
    return out


def port_sockets(port, proc=PROC):
    """The sockets holding ``port`` on this node (IPv4 then IPv6), from ``proc``/net/tcp and tcp6."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", name)) as f:
                out.extend(parse_proc_net_tcp(f.read(), port))
        except (IOError, OSError):
            continue
    return out


def port_holders(port, pids, proc=PROC):
    """Who holds ``port``: [{local, port, state, inode, pids}], one entry per socket, ``pids`` the processes of
    ``pids`` (ascending) with that socket open (a socket inherited across fork has several; none when its holder
    is in another PID namespace)."""
    sockets = port_sockets(port, proc)
    if not sockets:
        return []
    owners = dict((s["inode"], []) for s in sockets)
    for pid in sorted(pids):
        for target in fd_targets(pid, proc):
            inode = socket_inode(target)
            if inode in owners and pid not in owners[inode]:
                owners[inode].append(pid)
    return [dict(s, pids=owners[s["inode"]]) for s in sockets]
