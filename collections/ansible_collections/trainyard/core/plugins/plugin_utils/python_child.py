# -*- coding: utf-8 -*-
"""A controller-side check run in a child Python: the action plugins deepspeed_validate and llamafactory_validate
validate with the library itself (DeepSpeed, LLaMA-Factory), in a fresh interpreter that may not be Ansible's.

The plugin file is the child's script: run as ``python <plugin>.py`` it reads one JSON request on stdin and prints
one JSON result line (``child_main``). The parent (``run_cached``) finds the library's version, caches results by
hash (request, version, the script's own text) and turns a timeout or a child that printed nothing into one error.
The child finds this collection on PYTHONPATH (``child_env``), as plain Python namespace packages.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

# collections/ansible_collections/trainyard/core/plugins/plugin_utils/python_child.py -> collections/
COLLECTIONS_ROOT = str(Path(__file__).resolve().parents[5])


def child_env(pythonpath: str = "") -> dict:
    """The child's environment: pythonpath (the user's extra site), then this collection, then PYTHONPATH; a
    TORCH_CUDA_ARCH_LIST ending in "a" ("9.0a") makes DeepSpeed's import fail, so the "a" is cut."""
    env = dict(os.environ)
    paths = [os.path.expanduser(pythonpath) if pythonpath else "", COLLECTIONS_ROOT, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if env.get("TORCH_CUDA_ARCH_LIST", "").endswith("a"):
        env["TORCH_CUDA_ARCH_LIST"] = env["TORCH_CUDA_ARCH_LIST"].rstrip("a")
    return env


def dist_version(python: str, dist: str, env: dict | None = None) -> str:
    """The installed version of distribution dist as python sees it; "" when absent or python does not run."""
    try:
        out = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                             capture_output=True, text=True, timeout=60, env=env, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def run_cached(python: str, script: str, request: dict, key: list, *, cache_dir: str, timeout: int, env: dict,
               what: str, version_key: str) -> dict:
    """Run ``python script`` with request on stdin; its last JSON line, cached under cache_dir by hash of key and
    the script's text. what names the check in errors ("DeepSpeed"); a result with version_key is cached."""
    with open(script, "rb") as fh:
        me = hashlib.sha256(fh.read()).hexdigest()
    digest = hashlib.sha256(json.dumps([*key, me], sort_keys=True, default=str).encode()).hexdigest()
    path = os.path.join(os.path.expanduser(cache_dir), f"{digest}.json") if cache_dir else ""
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    # One child per distinct request: the nodes' tasks run in parallel forks; the first to take the lock runs the
    # child, the others read its cached answer.
    with open(f"{path}.lock", "a", encoding="utf-8") if path else contextlib.nullcontext() as lock:
        if path:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                result = json.load(fh)
            result["cached"] = True
            return result
        try:
            proc = subprocess.run([python, script], input=json.dumps(request), capture_output=True, text=True,
                                  timeout=timeout, env=env, check=False)
        except subprocess.TimeoutExpired:
            return {"ok": False, "errors": [f"{what} validation took over {timeout}s on the controller"],
                    "cached": False}
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
            return {"ok": False, "errors": [f"{what} validation did not run (rc {proc.returncode}): {tail}"],
                    "cached": False}
        result = json.loads(lines[-1])
        if path and version_key in result:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(result, fh)
            os.replace(tmp, path)
        result["cached"] = False
        return result


def child_main(validate, missing) -> None:
    """The child's side: validate(request) -> result dict, printed as one JSON line on the real stdout (the library
    may print while importing: stdout goes to stderr meanwhile); an ImportError becomes missing(exc), the error.
    Ends with os._exit(0): threads a library started (tokenizers, process groups) must not hold the exit."""
    request = json.load(sys.stdin)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        result = validate(request)
    except ImportError as exc:
        result = {"ok": False, "errors": [missing(exc)]}
    real_stdout.write(json.dumps(result) + "\n")
    real_stdout.flush()
    os._exit(0)
