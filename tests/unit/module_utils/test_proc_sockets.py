"""module_utils/proc_sockets.py: the one /proc/net/tcp parser and /proc/*/fd scan, and the agreement it buys:
the preflight's port verdict (port_check) and reset's port owner (job_reset) name the same holders on the same
node, whatever state the sockets are in."""

from __future__ import annotations

import builtins
import os

import pytest

from helpers import load
from ansible_collections.trainyard.core.plugins.module_utils import proc_sockets as ps

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:9A4C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0
   1: 0B011DAC:9A4C 0C011DAC:D3F2 01 00000000:00000000 00:00000000 00000000     0        0 4243 1 0
   2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4244 1 0
   3: 0B011DAC:9A4C 0D011DAC:D3F4 06 00000000:00000000 00:00000000 00000000     0        0 0 1 0
   4: 0B011DAC:9A4C 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4245 1 0
   5: 0B011DAC:9A4C 0D011DAC:D3F6 07 00000000:00000000 00:00000000 00000000     0        0 4246 1 0
   6: 00000000:9A4C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 0 1 0
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:9A4C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5555 1 0
   1: 0000000000000000FFFF00000B011DAC:9A4C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5556 1 0
"""


def test_proc_net_tcp_finds_listeners_and_bound_sockets_only():
    found = ps.parse_proc_net_tcp(TCP, 39500)
    assert [(s["local"], s["state"], s["inode"]) for s in found] == [
        ("0.0.0.0", "LISTEN", 4242), ("172.29.1.11", "CLOSE", 4245)]
    assert ps.parse_proc_net_tcp(TCP, 8080)[0]["local"] == "127.0.0.1"
    assert ps.parse_proc_net_tcp(TCP, 1) == []
    assert ps.parse_proc_net_tcp("garbage\nline without fields\n 0: zz:zz 00:00 0A a b c d e f g", 1) == []
    assert ps.parse_proc_net_tcp(None, 1) == []


def test_proc_net_tcp6():
    found = ps.parse_proc_net_tcp(TCP6, 39500)
    assert [s["local"] for s in found] == ["::", "::ffff:172.29.1.11"]


def test_socket_inode():
    assert ps.socket_inode("socket:[4242]") == 4242
    assert ps.socket_inode("pipe:[4242]") is None and ps.socket_inode("/dev/null") is None


def test_fd_targets_of_this_process_and_of_a_gone_one(tmp_path):
    with open(tmp_path / "f", "w"):
        assert str(tmp_path / "f") in ps.fd_targets(os.getpid())
    assert ps.fd_targets(2 ** 22 + 7) == []


# ------------------------------------------------------------------ preflight and reset agree (issue 34)

PORT = 29500  # 0x733C
HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _line(n, local, remote, state, inode):
    return "   %d: %s %s %s 00000000:00000000 00:00000000 00000000     0        0 %d 1 0\n" % (
        n, local, remote, state, inode)


# case -> (/proc/net/tcp lines, {pid: [socket inodes it holds]}, the PIDs that hold the port)
CASES = {
    # a listener whose socket a forked child inherited: both processes keep the port
    "listen": ([_line(0, "00000000:733C", "00000000:0000", "0A", 7001)], {4101: [7001], 4102: [7001]},
               {4101, 4102}),
    # bound, not listening: torchrun's bind fails all the same
    "bound-not-listening": ([_line(0, "0100007F:733C", "00000000:0000", "07", 7002)], {4201: [7002]}, {4201}),
    # a TIME_WAIT left by a closed connection and an accepted connection whose listener is gone: the port is free
    "time-wait-and-established": ([_line(0, "0100007F:733C", "0200007F:D3F2", "06", 0),
                                   _line(1, "0100007F:733C", "0200007F:D3F4", "01", 7004)], {4401: [7004]}, set()),
}


def _fake_proc(root, lines, fds):
    (root / "net").mkdir(parents=True)
    (root / "net" / "tcp").write_text(HEAD + "".join(lines))
    (root / "net" / "tcp6").write_text(HEAD)
    for pid, inodes in fds.items():
        d = root / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text("%d (python3) S 1 %d %d 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5000 0 0\n" % (pid, pid, pid))
        (d / "cmdline").write_bytes(b"python3\0holder.py\0")
        (d / "comm").write_text("python3\n")
        for n, inode in enumerate(inodes, start=3):
            os.symlink("socket:[%d]" % inode, str(d / "fd" / str(n)))


@pytest.fixture
def proc_lookalike(tmp_path, monkeypatch):
    """Point every read of /proc (open, listdir, readlink) at a directory the test fills: both modules read /proc
    through these calls, so the same fixture drives them unchanged."""
    fake = tmp_path / "proc"

    def where(path):
        if isinstance(path, str) and (path == "/proc" or path.startswith("/proc/")):
            return str(fake) + path[len("/proc"):]
        return path

    real_open, real_listdir, real_readlink = builtins.open, os.listdir, os.readlink
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: real_open(where(path), *a, **k))
    monkeypatch.setattr(os, "listdir", lambda path=".": real_listdir(where(path)))
    monkeypatch.setattr(os, "readlink", lambda path, *a, **k: real_readlink(where(path), *a, **k))
    return fake


@pytest.mark.parametrize("case", sorted(CASES))
def test_preflight_verdict_and_reset_owner_agree(case, proc_lookalike):
    lines, fds, holders = CASES[case]
    pc = load("library/port_check.py", "port_check_mod")
    jr = load("library/job_reset.py", "job_reset_mod")
    _fake_proc(proc_lookalike, lines, fds)

    _, verdict, _ = pc.inspect(PORT, "")
    preflight = set(h["pid"] for h in pc.holders_of(PORT))
    reset = set(h["pid"] for h in object.__new__(jr.Reset).port_holders(PORT, set()))

    assert (preflight, reset) == (holders, holders)
    assert verdict["state"] == ("other" if holders else "free")
    for pid in holders:
        assert "PID %d (python3 holder.py)" % pid in verdict["detail"]
