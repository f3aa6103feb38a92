#!/usr/bin/env python3
"""Install and start what the simulated cluster needs on a fresh Debian machine without systemd.

    python3 tests/sim/engine.py ensure     # docker engine + local registry, idempotent
    python3 tests/sim/engine.py status

The docker engine comes from Debian's docker.io and is started in the background (there is no
systemd here). The image registry is Debian's docker-registry, listening on REGISTRY_PORT and
storing its data under CACHE_DIR so images survive between runs. Only processes this script
started (recorded in pidfiles) are ever stopped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CACHE_DIR = Path(os.environ.get("TRAINYARD_SIM_CACHE", "/var/cache/trainyard-sim"))
REGISTRY_PORT = int(os.environ.get("TRAINYARD_REGISTRY_PORT", "5055"))
APT_PACKAGES = ["docker.io", "docker-registry", "debootstrap", "iptables", "openssh-client", "chromium",
                "rsync"]  # rsync: molecule copies a scenario's Dockerfile context with it (molecule/janitor)
DOCKERD_LOG = Path("/var/log/trainyard-dockerd.log")


def log(msg: str) -> None:
    print(f"[engine] {msg}", flush=True)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, **kw)


def docker_ready() -> bool:
    if not shutil.which("docker"):
        return False
    r = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                       capture_output=True, text=True, timeout=20)
    return r.returncode == 0


def ensure_packages() -> None:
    missing = [p for p in APT_PACKAGES
               if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                 text=True).stdout.strip() != "install ok installed"]
    if not missing:
        return
    log(f"installing {' '.join(missing)} from Debian")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env,
        stdout=subprocess.DEVNULL)


def ensure_dockerd() -> None:
    if docker_ready():
        return
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    log("starting dockerd in the background (no systemd)")
    with open(DOCKERD_LOG, "ab") as out:
        proc = subprocess.Popen([dockerd, "--storage-driver=overlay2"], stdout=out, stderr=out,
                                start_new_session=True)
    (CACHE_DIR / "dockerd.pid").write_text(str(proc.pid))
    for _ in range(120):
        if docker_ready():
            return
        if proc.poll() is not None:
            sys.exit(f"dockerd exited with {proc.returncode}; see {DOCKERD_LOG}")
        time.sleep(0.5)
    sys.exit(f"dockerd did not become ready; see {DOCKERD_LOG}")


def registry_ready() -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{REGISTRY_PORT}/v2/", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def ensure_registry() -> None:
    if registry_ready():
        return
    data = CACHE_DIR / "registry"
    data.mkdir(parents=True, exist_ok=True)
    config = CACHE_DIR / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        "storage:\n"
        f"  filesystem:\n    rootdirectory: {data}\n"
        "  delete:\n    enabled: true\n"
        "http:\n"
        f"  addr: 0.0.0.0:{REGISTRY_PORT}\n"
    )
    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    log(f"starting the local image registry on port {REGISTRY_PORT}")
    with open(CACHE_DIR / "registry.log", "ab") as out:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=out,
                                start_new_session=True)
    (CACHE_DIR / "registry.pid").write_text(str(proc.pid))
    for _ in range(60):
        if registry_ready():
            return
        if proc.poll() is not None:
            sys.exit(f"docker-registry exited with {proc.returncode}; see {CACHE_DIR}/registry.log")
        time.sleep(0.25)
    sys.exit("docker-registry did not become ready")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["ensure", "status"])
    args = parser.parse_args()
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    if args.action == "status":
        print(f"docker engine: {'ready' if docker_ready() else 'not running'}")
        print(f"registry :{REGISTRY_PORT}: {'ready' if registry_ready() else 'not running'}")
        return 0
    if os.geteuid() != 0:
        sys.exit("engine.py ensure must run as root (it installs packages and starts dockerd)")
    ensure_packages()
    ensure_dockerd()
    ensure_registry()
    log(f"docker engine and registry (:{REGISTRY_PORT}) ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
