"""Health probe of the training container: one run answers every check (the role execs it once).

Run as `python3 -c "$(cat container_health.py)" '<json params>'` inside the container, or as a file.
params: {code_dir, output_root, shared_root, inputs (the job's local model and dataset paths), logger_module,
         shm_size_bytes, ulimits: {name: value}, gpus, instance, import_cache, nvidia_smi, gpu_skip_reason}
Prints one JSON line: {check: {ok|status, detail}, ...}. Stdlib only; each check is independent.

The imports (torch: about 1.5 s of CPU, the probe's whole cost) are checked once per container instance: with
`instance` (the container's id, start time and image, from the role) and `import_cache` (a path inside the
container), passing import results are kept there and reused while the instance is the same. The software in a
container cannot change without a restart, which gives a new instance; a failed import is never kept, and the
directories, ulimits and /dev/shm are checked every run.
"""

import importlib
import json
import os
import socket
import sys
import time


def _err(exc):
    return f"{type(exc).__name__}: {exc}"


def check_code_dir(path):
    if not path:
        return {"status": "skip", "detail": "no code directory configured"}
    if os.path.isdir(path):
        return {"ok": True, "detail": f"{path} exists ({len(os.listdir(path))} entries)"}
    return {"ok": False, "detail": f"{path} does not exist in the container"}


def check_output_writable(path):
    if not path:
        return {"status": "skip", "detail": "no output root configured"}
    probe = os.path.join(path, f".trainyard-probe-{socket.gethostname()}-{os.getpid()}")
    payload = b"trainyard probe\n"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(probe, "rb") as f:
            back = f.read()
        os.unlink(probe)
    except OSError as exc:
        return {"ok": False, "detail": f"cannot write {probe}: {_err(exc)}"}
    if back != payload:
        return {"ok": False, "detail": f"{probe} read back differs from what was written"}
    return {"ok": True, "detail": f"wrote, read back and removed a probe file in {path}"}


def check_home():
    """HOME of the job (the probe runs as the job's user, with its environment): created if missing, as pip, Hugging
    Face and torch do, and written. A uid the image has no passwd entry for would get HOME=/ from docker."""
    home = os.environ.get("HOME") or ""
    who = f"uid {os.getuid()}:{os.getgid()}"
    if not home:
        return {"ok": False, "detail": f"HOME is not set for {who}"}
    try:
        os.makedirs(home, exist_ok=True)
    except OSError as exc:
        return {"ok": False, "detail": f"HOME {home} cannot be created by {who}: {_err(exc)}"}
    res = check_output_writable(home)
    res["detail"] = f"HOME {home}, {who}: " + res["detail"]
    return res


# The walk of the job's inputs is bounded: it opens at most this many files, this deep, for this long.
READ_MAX_FILES = 20000
READ_MAX_DEPTH = 8
READ_MAX_S = 10.0
READ_NAMED = 5


def _unreadable(top, state):
    """Open each regular file under top (symlinks followed, as the job's loaders do) for reading, as the probe's
    user; collect the ones it may not read: [(path, mode, uid, gid)]. Bounded by the READ_MAX_* caps (state)."""
    out = []
    stack = [(top, 0)]
    while stack:
        d, depth = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError as exc:
            out.append((d, None, None, None, _err(exc)))
            continue
        for e in entries:
            if state["files"] >= READ_MAX_FILES or time.monotonic() > state["deadline"]:
                state["truncated"] = True
                return out
            try:
                st = os.stat(e.path)
            except OSError:
                continue  # a dangling link: nothing to read
            if e.is_dir():
                if depth + 1 < READ_MAX_DEPTH and not e.is_symlink():
                    stack.append((e.path, depth + 1))
                continue
            if not e.is_file():
                continue
            state["files"] += 1
            try:
                os.close(os.open(e.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)))
            except PermissionError as exc:
                out.append((e.path, st.st_mode & 0o7777, st.st_uid, st.st_gid, _err(exc)))
            except OSError:
                continue
    return out


def check_shared_readable(path, inputs=()):
    """The shared root, and the job's other local inputs (the model and dataset paths), are readable by the job's
    user: every file, not only the top directory (safetensors' save_file writes 0600 files, which a non-root job
    cannot open; safetensors then reports the file as missing)."""
    if not path and not inputs:
        return {"status": "skip", "detail": "no shared root configured"}
    who = f"uid {os.getuid()}:{os.getgid()}"
    state = {"files": 0, "deadline": time.monotonic() + READ_MAX_S, "truncated": False}
    entries = None
    if path:
        try:
            entries = os.listdir(path)
        except OSError as exc:
            return {"ok": False, "detail": f"cannot list {path}: {_err(exc)}"}
    bad = []
    tops = [path] if path else []
    tops += [p for p in inputs if p and os.path.isabs(p) and not (path and (p + "/").startswith(path.rstrip("/") + "/"))]
    for top in tops:
        if os.path.isdir(top):
            bad += _unreadable(top, state)
        elif os.path.exists(top):
            state["files"] += 1
            try:
                os.close(os.open(top, os.O_RDONLY | os.O_NONBLOCK))
            except PermissionError as exc:
                st = os.stat(top)
                bad.append((top, st.st_mode & 0o7777, st.st_uid, st.st_gid, _err(exc)))
    checked = f"{state['files']} file(s) under {', '.join(tops)}" + (
        f" (the first {state['files']}: the walk stops at {READ_MAX_FILES} files or {READ_MAX_S:.0f} s)"
        if state["truncated"] else "")
    if bad:
        named = "; ".join(f"{p} (mode {m:04o}, owner {u}:{g})" if m is not None else f"{p} ({why})"
                          for p, m, u, g, why in bad[:READ_NAMED])
        more = f" and {len(bad) - READ_NAMED} more" if len(bad) > READ_NAMED else ""
        return {"ok": False, "detail": f"{who} cannot read {len(bad)} of {checked}: {named}{more}",
                "unreadable": [p for p, *_ in bad[:READ_NAMED]]}
    head = f"{path} readable ({len(entries)} entries)" if path else "the job's inputs are readable"
    return {"ok": True, "detail": f"{head}; {who} can open every one of {checked}"}


def check_import(module):
    t0 = time.monotonic()
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # any import-time failure is the finding
        return None, {"ok": False, "detail": f"import {module} failed: {_err(exc)}"}
    version = getattr(mod, "__version__", "") or ""
    took = time.monotonic() - t0
    return mod, {"ok": True, "detail": f"import {module} {version} ok ({took:.1f} s)".replace("  ", " "),
                 "version": str(version)}


def check_torch(gpus):
    torch, res = check_import("torch")
    if torch is None:
        return res
    try:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # a broken CUDA stack raises all sorts
        return {"ok": False, "detail": f"torch {torch.__version__}: CUDA query failed: {_err(exc)}"}
    res["cuda_devices"] = n
    res["detail"] += f", {n} CUDA device(s)"
    if gpus and n == 0:
        res.update(ok=False, detail=res["detail"] + ": the node has GPUs but torch sees none")
    return res


_RLIMITS = {
    "core": "RLIMIT_CORE", "cpu": "RLIMIT_CPU", "data": "RLIMIT_DATA", "fsize": "RLIMIT_FSIZE",
    "locks": "RLIMIT_LOCKS", "memlock": "RLIMIT_MEMLOCK", "msgqueue": "RLIMIT_MSGQUEUE", "nice": "RLIMIT_NICE",
    "nofile": "RLIMIT_NOFILE", "nproc": "RLIMIT_NPROC", "rss": "RLIMIT_RSS", "rtprio": "RLIMIT_RTPRIO",
    "rttime": "RLIMIT_RTTIME", "sigpending": "RLIMIT_SIGPENDING", "stack": "RLIMIT_STACK",
}


def check_ulimits(wanted):
    import resource

    if not wanted:
        return {"status": "skip", "detail": "no ulimits configured"}
    bad, seen = [], []
    for name, value in sorted(wanted.items()):
        attr = _RLIMITS.get(name)
        if not attr or not hasattr(resource, attr):
            seen.append(f"{name}=?")
            continue
        soft, _hard = resource.getrlimit(getattr(resource, attr))
        want = int(str(value).split(":", 1)[0])
        shown = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
        seen.append(f"{name}={shown}")
        unlimited = soft == resource.RLIM_INFINITY
        if want == -1 and not unlimited:
            bad.append(f"{name} is {shown}, wanted unlimited")
        elif want != -1 and not unlimited and soft < want:
            bad.append(f"{name} is {shown}, wanted {want}")
    if bad:
        return {"ok": False, "detail": "; ".join(bad)}
    return {"ok": True, "detail": ", ".join(seen)}


def check_shm(want):
    try:
        st = os.statvfs("/dev/shm")
    except OSError as exc:
        return {"ok": False, "detail": f"/dev/shm: {_err(exc)}"}
    size = st.f_blocks * st.f_frsize
    detail = f"/dev/shm {size / 2 ** 30:.2f} GiB"
    if want and size < want:
        return {"status": "warn", "detail": f"{detail}, smaller than container_shm_size ({want / 2 ** 30:.2f} GiB)",
                "size_bytes": size}
    return {"ok": True, "detail": detail, "size_bytes": size}


def _cached_imports(path, instance, logger):
    """The passing import results of this container instance's earlier probe of the same modules, or None."""
    if not (path and instance):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("instance") != instance or data.get("logger") != logger:
        return None
    results = data.get("results")
    if not isinstance(results, dict) or not all(isinstance(r, dict) and r.get("ok") for r in results.values()):
        return None
    return data


def _keep_imports(path, instance, logger, results):
    if not (path and instance) or not all(r.get("ok") or r.get("status") == "skip" for r in results.values()):
        return
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump({"instance": instance, "logger": logger, "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "results": {k: r for k, r in results.items() if r.get("ok")}}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # the cache is an optimisation: a read-only /tmp only costs the next probe its imports


def check_imports(params):
    logger = params.get("logger_module")
    instance, path = params.get("instance"), params.get("import_cache")
    cached = _cached_imports(path, instance, logger or "")
    if cached is not None:
        out = {}
        for name, res in cached["results"].items():
            out[name] = dict(res, cached=cached["at"],
                             detail=f"{res['detail']} (checked at {cached['at']} in this container instance)")
        if not logger:
            out["logger"] = {"status": "skip", "detail": "no logger configured"}
        return out
    out = {"logger": check_import(logger)[1] if logger else {"status": "skip", "detail": "no logger configured"},
           "torch": check_torch(str(params.get("gpus")).lower() in ("true", "1", "yes"))}
    _keep_imports(path, instance, logger or "", out)
    return out


def check_gpu_visible(params):
    """The GPUs nvidia-smi lists inside the container ({uuids} or {error}); the role compares them with the node's
    nvidia_gpu_facts. Not run when the container gets no GPU (gpu_skip_reason says why)."""
    import subprocess

    if str(params.get("gpus")).lower() not in ("true", "1", "yes"):
        return {"status": "skip", "detail": params.get("gpu_skip_reason") or "the container gets no GPU"}
    smi = params.get("nvidia_smi") or "nvidia-smi"
    if not os.path.exists(smi):
        smi = "nvidia-smi"
    try:
        p = subprocess.run([smi, "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"{smi}: {_err(exc)}"}
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()
        return {"error": f"{smi} exited {p.returncode}: {tail[-1] if tail else ''}"}
    return {"uuids": [ln.strip() for ln in p.stdout.splitlines() if ln.strip().startswith("GPU-")]}


def main(argv):
    params = json.loads(argv[1]) if len(argv) > 1 else {}
    out = {
        "python": {"ok": True, "detail": f"{sys.executable} {sys.version.split()[0]}"},
        "code_dir": check_code_dir(params.get("code_dir")),
        "output_writable": check_output_writable(params.get("output_root")),
        "shared_readable": check_shared_readable(params.get("shared_root"), params.get("inputs") or ()),
        "home": check_home(),
        "ulimits": check_ulimits(params.get("ulimits") or {}),
        "shm": check_shm(int(params.get("shm_size_bytes") or 0)),
    }
    out["gpu_visible"] = check_gpu_visible(params)
    out.update(check_imports(params))
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
