#!/usr/bin/python
# -*- coding: utf-8 -*-
"""One read-only probe of a node's basics for the preflight report."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_facts
short_description: Read a training node's basics in one round trip
description:
  - Reads, without changing anything, what the host-basics preflight checks need, in one module run
    instead of one task per check.
  - Free and total space of the filesystem that holds I(paths) (the nearest existing parent when a
    path does not exist yet); size of C(/dev/shm); the locked-memory and open-files limits of the session;
    the node's clock; whether C(/dev/nvidiactl) exists; the Python that runs the module; the docker CLI and
    whether the engine answers on its socket.
  - Its action plugin notes the controller's clock just before and after the module runs and returns the
    node's offset from it (I(clock)), so no second call is needed to measure the clock.
  - The docker engine is asked over its Unix socket (C(GET /_ping), C(GET /version)); no command is run.
options:
  keep:
    description:
      - Values of this node to keep in the result as C(kept), unchanged (the action keeps them; they are not sent to
        the node). The cluster role keeps the options each node's host-basics records use, as the node's own
        variables give them, for the task that records every node's at once.
    type: dict
    default: {}
  paths:
    description: Paths whose filesystem space is reported, e.g. the output root.
    type: list
    elements: path
    default: []
  shm_path:
    description: Shared-memory mount to measure.
    type: path
    default: /dev/shm
  docker_socket:
    description: Unix socket of the docker engine.
    type: path
    default: /var/run/docker.sock
  timeout:
    description: Seconds to wait for the docker engine to answer.
    type: float
    default: 3.0
  users:
    description:
      - Users whose login shell is returned in C(trainyard_init.users) (null for a user that does not exist), read
        through the system's user database (C(getpwnam), so NSS sources count). The janitor role creates its user
        only where this says it is missing or has another shell.
    type: list
    elements: str
    default: []
  job:
    description:
      - C({name, state_root}) of a job this tool launched, whose state is returned in C(job), read the way the launch's
        status reads it (C(procgroup.job_procs), the processes of the job the launch record names, sidecars left out).
        Empty, nothing is read. The nccl_check role leaves the data-path measurement alone where the job trains.
    type: dict
    default: {}
extends_documentation_fragment: [trainyard.core.attributes]
author: trainyard
"""

EXAMPLES = r"""
- name: Read the host basics
  host_facts:
    paths: ["{{ cluster_output_root }}"]
  register: __cluster_host
  check_mode: false
"""

RETURN = r"""
kept:
  description: I(keep), as given.
  returned: always
  type: dict
time:
  description: The node's clock (seconds since the epoch) when the module ran.
  returned: always
  type: float
clock:
  description: C({offset, uncertainty}) seconds - the node's clock less the midpoint of the controller's readings
    before and after the module ran, and half that window (the bound of the measurement error).
  returned: always
  type: dict
python:
  description: C({version, executable}) of the interpreter that ran the module.
  returned: always
  type: dict
paths:
  description: Per requested path, C({path, probed, exists, free_bytes, total_bytes}); probed is the existing parent measured.
  returned: always
  type: list
shm:
  description: C({path, exists, total_bytes, free_bytes}) of the shared-memory mount.
  returned: always
  type: dict
limits:
  description: C({memlock_soft_kb, memlock_hard_kb, nofile_soft, nofile_hard}); -1 means unlimited.
  returned: always
  type: dict
docker:
  description: C({cli, socket, reachable, version, api_version, error}).
  returned: always
  type: dict
job:
  description: C({name, state, processes}) with I(job) - C(state) C(running) (live processes of the job),
    C(stopped) (a launch record, no live process), C(absent) (no launch record) or C(unknown) (C(error) says why, an
    unreadable record or a bad job name).
  returned: with I(job)
  type: dict
ansible_facts:
  description:
    - C(trainyard_init) C({systemd, pid1, container, container_evidence, nvidiactl, users}) - whether systemd runs the
      node (/run/systemd/system is a directory), PID 1's name, whether C(/dev/nvidiactl) exists (an NVIDIA driver is
      loaded), the engine when the node is itself a container (C(docker), C(podman), C(lxc), C(kubernetes),
      C(containerd), ... or null), with what showed it, and the login shell of each of I(users) (a mapping of user name to shell). Later roles of the run (cluster, fabric manager, janitor,
      network, container) read it instead of probing again.
  returned: always
  type: dict
"""

import json
import os
import platform
import pwd
import resource
import shutil
import socket
import sys
import time

from ansible.module_utils.basic import AnsibleModule


def statvfs(path: str) -> dict:
    probed = path
    while probed and not os.path.exists(probed):
        parent = os.path.dirname(probed.rstrip("/")) or "/"
        if parent == probed:
            break
        probed = parent
    out = {"path": path, "probed": probed, "exists": os.path.exists(path), "free_bytes": None, "total_bytes": None}
    try:
        st = os.statvfs(probed)
        out["free_bytes"] = st.f_bavail * st.f_frsize
        out["total_bytes"] = st.f_blocks * st.f_frsize
    except OSError as exc:
        out["error"] = str(exc)
    return out


def limit_kb(value: int) -> int:
    return -1 if value == resource.RLIM_INFINITY else value // 1024


def unlimited(value: int) -> int:
    return -1 if value == resource.RLIM_INFINITY else value


def docker_get(sock_path: str, url: str, timeout: float) -> tuple[int, str]:
    """HTTP/1.0 GET on a Unix socket: (status, body)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        s.sendall(f"GET {url} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    raw = b"".join(chunks).decode("utf-8", "replace")
    head, _, body = raw.partition("\r\n\r\n")
    status = int(head.split(" ", 2)[1]) if head.startswith("HTTP/") else 0
    return status, body


def docker_facts(sock_path: str, timeout: float) -> dict:
    cli = shutil.which("docker") or next((p for p in ("/usr/bin/docker", "/usr/local/bin/docker")
                                          if os.access(p, os.X_OK)), None)
    out = {"cli": cli, "socket": sock_path, "socket_exists": os.path.exists(sock_path), "reachable": False,
           "version": None, "api_version": None, "error": None}
    if not out["socket_exists"]:
        out["error"] = f"{sock_path} does not exist (engine not installed or not running)"
        return out
    try:
        status, body = docker_get(sock_path, "/_ping", timeout)
        out["reachable"] = status == 200 and body.strip() == "OK"
        if not out["reachable"]:
            out["error"] = f"GET /_ping answered {status} {body.strip()[:80]!r}"
            return out
        status, body = docker_get(sock_path, "/version", timeout)
        if status == 200:
            info = json.loads(body)
            out["version"] = info.get("Version")
            out["api_version"] = info.get("ApiVersion")
    except (OSError, ValueError) as exc:
        out["error"] = f"{sock_path}: {exc}"
    return out


def read_text(path: str, limit: int = 65536) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


_CGROUP_ENGINES = (("kubepods", "kubernetes"), ("docker", "docker"), ("libpod", "podman"), ("lxc", "lxc"),
                   ("containerd", "containerd"), ("crio", "cri-o"))


def container_engine(dockerenv: bool, containerenv: bool, pid1_environ: str, cgroup: str) -> tuple:
    """(engine or None, evidence): whether this node is itself a container, from what the engines leave behind.

    /.dockerenv (docker), /run/.containerenv (podman), PID 1's `container=` variable (podman, lxc,
    systemd-nspawn), then the cgroup path of PID 1 (cgroup v1, or a v2 path that names the engine)."""
    if dockerenv:
        return "docker", "/.dockerenv exists"
    if containerenv:
        return "podman", "/run/.containerenv exists"
    for item in pid1_environ.split("\0"):
        if item.startswith("container=") and item[len("container="):]:
            return item[len("container="):], "PID 1 has " + item
    for line in cgroup.splitlines():
        path = line.split(":", 2)[-1]
        for marker, engine in _CGROUP_ENGINES:
            if marker in path:
                return engine, "cgroup of PID 1 is " + path
    return None, ""


def login_shell(name: str):
    """The user's login shell, None where there is no such user (or the name is not a user name)."""
    try:
        return pwd.getpwnam(name).pw_shell
    except (KeyError, ValueError):
        return None


def job_state(spec: dict) -> dict:
    """Whether the job ``spec`` ({name, state_root}) runs here: its launch record and its live processes."""
    from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg
    from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr

    out = {"name": spec.get("name"), "state": "unknown", "processes": 0}
    try:
        state = tr.read_state(spec.get("state_root") or "", spec.get("name") or "")
    except (OSError, ValueError) as exc:
        return dict(out, error=str(exc)[:300])
    if state is None:
        return dict(out, state="absent")
    procs = pg.job_procs(state)
    return dict(out, state="running" if procs else "stopped", processes=len(procs))


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            paths=dict(type="list", elements="path", default=[]),
            shm_path=dict(type="path", default="/dev/shm"),
            docker_socket=dict(type="path", default="/var/run/docker.sock"),
            timeout=dict(type="float", default=3.0),
            users=dict(type="list", elements="str", default=[]),
            job=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    now = time.time()
    shm = statvfs(p["shm_path"])
    try:
        with open("/proc/1/comm") as f:
            pid1 = f.read().strip()
    except OSError:
        pid1 = None
    engine, evidence = container_engine(os.path.exists("/.dockerenv"), os.path.exists("/run/.containerenv"),
                                        read_text("/proc/1/environ"), read_text("/proc/1/cgroup"))
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    extra = {"job": job_state(p["job"])} if p["job"] else {}
    module.exit_json(
        changed=False,
        time=now,
        python={"version": platform.python_version(), "executable": sys.executable},
        paths=[statvfs(path) for path in p["paths"]],
        shm={"path": p["shm_path"], "exists": shm["exists"], "total_bytes": shm["total_bytes"] if shm["exists"] else None,
             "free_bytes": shm["free_bytes"] if shm["exists"] else None},
        limits={"memlock_soft_kb": limit_kb(memlock[0]), "memlock_hard_kb": limit_kb(memlock[1]),
                "nofile_soft": unlimited(nofile[0]), "nofile_hard": unlimited(nofile[1])},
        docker=docker_facts(p["docker_socket"], p["timeout"]),
        # For the roles after this one in the run (fabric manager, janitor): no second probe of the init system.
        ansible_facts={"trainyard_init": {"systemd": os.path.isdir("/run/systemd/system"), "pid1": pid1,
                                          "container": engine, "container_evidence": evidence,
                                          "nvidiactl": os.path.exists("/dev/nvidiactl"),
                                          "users": {name: login_shell(name) for name in p["users"]}}},
        **extra,
    )


if __name__ == "__main__":
    main()
