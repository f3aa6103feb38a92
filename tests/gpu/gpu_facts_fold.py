#!/usr/bin/env python3
"""The GPU facts read on a real GPU machine: one nvidia_gpu_facts call with the health, the device order and the
fabric manager's unit folded in gives the same GPU facts as the plain call, and health for every GPU.

    OUT=/tmp/out python3 tests/gpu/gpu_facts_fold.py     # a machine with >= 1 NVIDIA GPU, as root, repo root

Rehearsal on a CPU machine against the stand-in nvidia-smi (tests/sim/standin):

    PATH=$PWD/tests/sim/standin:$PATH TRAINYARD_STANDIN_DATA=$PWD/tests/data/nvidia-smi/h200x4 \
      TRAINYARD_STANDIN_HOST=n1 TRAINYARD_STANDIN_FAULT=/dev/null OUT=/tmp/out .venv/bin/python tests/gpu/gpu_facts_fold.py

Runs the project's module with the real `ansible` (local connection), writes both raw results and the verdicts to
$OUT/gpu_facts_fold.json, and exits 1 (printing what differs) when a verdict fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / ".venv" / "bin" / "ansible"


def module(args: dict) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    p = subprocess.run([str(ANSIBLE), "localhost", "-i", "localhost,", "-c", "local", "-m", "nvidia_gpu_facts",
                        "-a", json.dumps(args), "-e", f"ansible_python_interpreter={sys.executable}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index("{"):])
    return out["plays"][0]["tasks"][0]["hosts"]["localhost"]


def main() -> int:
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        env_file = str(Path(tmp) / "environment")
        plain = module({"timeout": 60})
        folded = module({"health": True, "environment_file": env_file, "set_device_order": True,
                         "service": "nvidia-fabricmanager"})
    facts, ffacts = plain.get("nvidia_gpu_facts") or {}, folded.get("nvidia_gpu_facts") or {}
    volatile = ("nvlink",)  # link speeds are read live; the rest is the machine's configuration
    same = [{k: v for k, v in g.items() if k not in volatile} for g in facts.get("gpus", [])] == \
        [{k: v for k, v in g.items() if k not in volatile} for g in ffacts.get("gpus", [])]
    health = folded.get("health") or {}
    verdicts = {
        "plain call answers": bool(facts.get("gpu_count")),
        "folded call answers the same GPUs": same and facts.get("driver_version") == ffacts.get("driver_version"),
        "health for every GPU": len(health.get("gpus") or []) == facts.get("gpu_count") and not health.get("smi_error"),
        "kernel log read or skipped with a reason": bool(health.get("kernel", {}).get("source")
                                                         or health.get("kernel", {}).get("skipped")),
        "device order written": folded.get("device_order") == "PCI_BUS_ID" and folded.get("changed") is True,
        "service manager named": bool(folded.get("service_manager")),
    }
    (out / "gpu_facts_fold.json").write_text(json.dumps({"plain": plain, "folded": folded, "verdicts": verdicts},
                                                        indent=2, default=str))
    for name, ok in verdicts.items():
        print(("PASS " if ok else "FAIL ") + name)
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
