#!/usr/bin/env python3
"""Slurm prolog written by trainyard's playbooks/export.yml: the product's quick checks on this node before a job.

    Prolog=/etc/slurm/trainyard-prolog.py   (slurm.conf; the health file beside it: trainyard-health.json)

Compares what this node shows now with what the trainyard run proved (trainyard-health.json, per Slurm node): the
NVIDIA driver version and GPU count (nvidia-smi), the fabric manager version (nv-fabricmanager --version), the data
NIC's MTU (/sys/class/net), the InfiniBand port rate (/sys/class/infiniband) where the run measured one. A value the
run did not prove is not compared. Exit 0 when everything matches; otherwise one line per mismatch on stderr and exit
1, so Slurm drains the node and requeues the job instead of starting it on a node that drifted. Standard library only.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys

HEALTH = os.environ.get("TRAINYARD_HEALTH", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "trainyard-health.json"))
TIMEOUT = 20


def run(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    return (r.stdout if r.returncode == 0 else None), (r.stderr or r.stdout).strip()[-200:]


def observe(pinned, sys_root="/sys"):
    """What this node shows now, for the values pinned (None where it cannot be read, with why)."""
    seen, why = {}, {}
    if pinned.get("driver_version") or pinned.get("gpu_count"):
        out, err = run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        rows = [r.strip() for r in (out or "").splitlines() if r.strip()]
        seen["driver_version"] = rows[0] if rows else None
        seen["gpu_count"] = len(rows) if out is not None else None
        why["driver_version"] = why["gpu_count"] = err
    if pinned.get("fabricmanager_version"):
        out, err = run(["nv-fabricmanager", "--version"])
        words = [w for w in (out or "").replace(":", " ").split() if w[:1].isdigit()]
        seen["fabricmanager_version"] = words[0] if words else None
        why["fabricmanager_version"] = err
    if pinned.get("data_iface") and pinned.get("data_mtu"):
        try:
            with open(os.path.join(sys_root, "class/net", pinned["data_iface"], "mtu")) as f:
                seen["data_mtu"] = int(f.read().strip())
        except (OSError, ValueError) as e:
            seen["data_mtu"], why["data_mtu"] = None, str(e)
    if pinned.get("ib_rate_gbps"):
        rates = []
        for path in glob.glob(os.path.join(sys_root, "class/infiniband/*/ports/*/rate")):
            try:
                with open(path) as f:
                    rates.append(int(f.read().split()[0]))
            except (OSError, ValueError, IndexError):
                continue
        seen["ib_rate_gbps"] = min(rates) if rates else None
        why["ib_rate_gbps"] = "no InfiniBand port rate under %s/class/infiniband" % sys_root
    return seen, why


def mismatches(pinned, seen, why):
    """One line per pinned value this node does not show (empty: healthy)."""
    out = []
    for key in ("driver_version", "gpu_count", "fabricmanager_version", "data_mtu", "ib_rate_gbps"):
        want = pinned.get(key)
        if want in (None, ""):
            continue
        have = seen.get(key)
        if have is None:
            out.append("%s: cannot read (%s); the run proved %s" % (key, why.get(key) or "not readable", want))
        elif str(have) != str(want):
            what = " on %s" % pinned.get("data_iface") if key == "data_mtu" else ""
            out.append("%s%s is %s, the run proved %s" % (key, what, have, want))
    return out


def main():
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    try:
        with open(HEALTH) as f:
            health = json.load(f)
    except (OSError, ValueError) as e:
        sys.stderr.write("trainyard prolog: %s unreadable (%s): run playbooks/export.yml and install it\n" % (HEALTH, e))
        return 1
    pinned = (health.get("nodes") or {}).get(node)
    if pinned is None:
        return 0  # not a node of the validated cluster: nothing pinned here
    problems = mismatches(pinned, *observe(pinned))
    for line in problems:
        sys.stderr.write("trainyard prolog: %s: %s (run %s)\n" % (node, line, health.get("run_id")))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
