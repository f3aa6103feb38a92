# -*- coding: utf-8 -*-
"""The network probes a module runs on a node that open a socket (netcheck.py stays pure): one TCP connect with a
timeout, its outcome classified (ok, timeout, refused, unreachable, blocked, error). Used by ``port_check``
(mode connect) and ``path_mtu_check`` (its I(connect) option)."""

from __future__ import absolute_import, division, print_function

import socket
import time

from ansible_collections.trainyard.core.plugins.module_utils.netcheck import classify_connect_error


def connect(address, port, timeout):
    """One TCP connect to address:port -> (outcome, seconds, message)."""
    t0 = time.time()
    err = None
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
        sock.close()
    except socket.timeout:
        err = "timeout"
    except (OSError, socket.error) as exc:
        err = exc
    took = round(time.time() - t0, 3)
    outcome = classify_connect_error(err)
    message = "" if err is None else ("no answer within %.1f s" % timeout if err == "timeout" else str(err))
    return outcome, took, message
