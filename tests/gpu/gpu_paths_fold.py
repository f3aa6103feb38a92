#!/usr/bin/env python3
"""gpu mode devices on a real GPU machine: the container role's engine probe reads the GPU device nodes, the driver's
libraries and nvidia-smi in its own task (action container_engine_probe, gpu_paths; module container_gpu_paths), and
what it gives the container matches what the machine has, read here another way (the /dev listing, `ldconfig -p`
resolved with os.path.realpath, nvidia-smi's own driver version).

    OUT=/tmp/out python3 tests/gpu/gpu_paths_fold.py     # a machine with >= 1 NVIDIA GPU, as root, repo root

(ANSIBLE_BIN: the `ansible` to run, else the one beside this Python.)

Runs the action with the real `ansible` (local connection; the engine's answer given as one without the NVIDIA
runtime, so no docker engine is needed), writes its result, the reference reading and the verdicts to
$OUT/gpu_paths_fold.json, and exits 1 (printing what differs) when a verdict fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = Path(os.environ.get("ANSIBLE_BIN") or Path(sys.executable).parent / "ansible")
LIB_DIR = "/usr/local/nvidia/lib64"
CONTROL = re.compile(r"^nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)$")


def probe(driver_version: str) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    args = {"answer": {"can_talk_to_docker": True, "host_info": {"Runtimes": {"runc": {}}}},
            "container_gpus": "auto", "container_gpu_mode": "auto",
            "gpu_paths": {"lib_dir": LIB_DIR, "nvidia_smi_paths": ["/usr/bin/nvidia-smi"]}}
    p = subprocess.run([str(ANSIBLE), "localhost", "-i", "localhost,", "-c", "local", "-m", "container_engine_probe",
                        "-a", json.dumps(args), "-e", json.dumps({"nvidia_gpu_facts": {"driver_version": driver_version},
                                                                  "ansible_python_interpreter": sys.executable})],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if "{" not in p.stdout:
        sys.exit("ansible gave no result (rc %s): %s" % (p.returncode, (p.stdout + p.stderr)[-3000:]))
    out, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index("{"):])
    return out["plays"][0]["tasks"][0]["hosts"]["localhost"]


def reference() -> dict:
    """The machine read another way: /dev, the ld cache's 64-bit libcuda and NVML resolved, nvidia-smi's version."""
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    version = (smi.stdout.split() or [""])[0]
    cache = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    libs = {}
    for line in cache.splitlines():
        m = re.match(r"\s*(libcuda\.so\.1|libnvidia-ml\.so\.1) \(libc6,x86-64\) => (\S+)", line)
        if m and m.group(1) not in libs:
            libs[m.group(1)] = os.path.realpath(m.group(2))
    return {"driver_version": version, "devices": sorted(n for n in os.listdir("/dev") if CONTROL.match(n)),
            "libs": libs, "nvidiactl": os.path.exists("/dev/nvidiactl")}


def main() -> int:
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    ref = reference()
    got = probe(ref["driver_version"])
    paths = got.get("gpu_paths") or {}
    libs = paths.get("driver_libs") or {}
    mounts = {m["target"].rsplit("/", 1)[1]: m["source"] for m in libs.get("mounts") or []}
    smi = paths.get("nvidia_smi") or ""
    verdicts = {
        "the GPUs are found (nvidiactl) and gpu mode is devices": got.get("gpus") is True
        and got.get("gpu_mode") == "devices",
        "every GPU and control device node, nothing else": sorted(d.split(":")[0][5:] for d in paths.get("devices")
                                                                 or []) == ref["devices"],
        "libcuda and NVML mounted from the files the cache resolves to": bool(ref["libs"]) and all(
            mounts.get(name) == real for name, real in ref["libs"].items()),
        "every mounted library is the running driver's": bool(mounts) and all(
            src.endswith(".so." + ref["driver_version"]) for src in mounts.values()),
        "nothing missing": libs.get("missing") == [],
        "nvidia-smi found and it runs": bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0,
        "one task, nothing changed": got.get("changed") is False and not got.get("failed"),
    }
    (out / "gpu_paths_fold.json").write_text(json.dumps({"probe": got, "reference": ref, "verdicts": verdicts},
                                                        indent=2, default=str))
    for name, ok in verdicts.items():
        print(("PASS " if ok else "FAIL ") + name)
    print(json.dumps({"devices": paths.get("devices"), "libraries": libs.get("libraries"), "stale": libs.get("stale"),
                      "nvidia_smi": smi, "driver_version": ref["driver_version"]}, indent=1))
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
