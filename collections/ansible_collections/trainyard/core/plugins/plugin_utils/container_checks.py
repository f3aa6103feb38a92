# -*- coding: utf-8 -*-
"""Verdicts of the container role, on the controller: what the engine answered read once (engine_view, for the
engine probe's result), and every record of the role but the in-container health (verify_inputs, for the
container_health action): container.engine, container.gpus, the login and the pull, the image digest and
container.running (the running container against the wanted configuration), then the health records from the
probe's answer (health_records).

Pure: values in, records out, unit-tested in tests/unit/plugin_utils/test_container_checks.py. The actions
(container_engine_probe, container_health) and the role's filters (filter_plugins/container_filters.py) call them.
"""

from __future__ import annotations

import json
import re

from ansible.module_utils.parsing.convert_bool import boolean

_ENGINE_FIX_LIBS = ("Install the Python libraries of the docker modules on the node: apt-get install python3-docker "
                    "python3-requests (container_engine_install: true does it)")
_ENGINE_FIX_START = ("Start the engine on the node (systemctl enable --now docker; journalctl -u docker), or set "
                     "container_engine_install: true to install it")
_GPUS_FIX_RUNTIME = ("Install the NVIDIA container toolkit and register its runtime (container_engine_install: true "
                     "with container_nvidia_toolkit_install: auto does it; by hand: apt-get install "
                     "nvidia-container-toolkit && nvidia-ctk runtime configure --runtime=docker && systemctl restart "
                     "docker), or set container_gpu_mode: devices")
_GPUS_FIX_DEVICES = ("The driver is incomplete on {node}: ldconfig -p must list libcuda.so.1 and libnvidia-ml.so.1 of "
                     "driver {version} and /dev/nvidia0 must exist (nvidia-smi; run ldconfig after installing the "
                     "driver); or install the NVIDIA container toolkit and set container_gpu_mode: runtime")


def truncate(text, length=300, end="...", leeway=5):
    """Jinja's truncate filter (its defaults: whole words, leeway 5), for messages the tasks used to cut with it."""
    text = str(text)
    if len(text) <= length + leeway:
        return text
    return text[:length - len(end)].rsplit(" ", 1)[0] + end


def _flag(value):
    return boolean(value, strict=False) if value is not None else False


def engine_view(answer, container_gpus, container_gpu_mode, nvidiactl):
    """What the role reads of the engine's answer (community.docker.docker_host_info's result), once, for the probe's
    result: engine_ok (it talked to the engine), engine_msg (its message, whitespace-normalised), runtimes (the
    engine's), gpus (the container gets GPUs: container_gpus all, or auto where the node has /dev/nvidiactl) and
    gpu_mode (runtime or devices; container_gpu_mode auto: runtime where the engine has the NVIDIA runtime)."""
    answer = answer or {}
    runtimes = list((answer.get("host_info") or {}).get("Runtimes") or {})
    mode = (container_gpu_mode if container_gpu_mode != "auto"
            else "runtime" if "nvidia" in runtimes else "devices")
    return {"engine_ok": _flag(answer.get("can_talk_to_docker")),
            "engine_msg": re.sub(r"\s+", " ", str(answer.get("msg", "no answer"))),
            "runtimes": runtimes,
            "gpus": container_gpus == "all" or (container_gpus == "auto" and _flag(nvidiactl)),
            "gpu_mode": mode}


# Where the driver's libraries appear inside the container: the directory NVIDIA's CUDA images put on LD_LIBRARY_PATH.
DRIVER_LIB_DIR = "/usr/local/nvidia/lib64"


def driver_lib_mounts(libs: list, driver_version: str, lib_dir: str = DRIVER_LIB_DIR) -> dict:
    """The driver's libraries that belong to the running driver -> read-only bind mounts.

    libs: the module container_gpu_paths's libraries ({name, path, exists, islnk, lnk_source}, as stat gives the last
    three); driver_version: nvidia-smi's driver version. Like nvidia-container-cli, a library is taken only when the
    file it resolves to carries the driver's version (libcuda.so.580.159.04): a leftover of another driver in the
    cache would crash CUDA with a version mismatch. Returns {mounts: [{source, target, read_only}], libraries:
    [names], stale: ["name -> file"], missing: [stems nvidia-smi and CUDA need that were not found]}.
    """
    mounts, names, stale = [], [], []
    suffix = ".so." + str(driver_version or "").strip()
    for lib in libs or []:
        if not lib.get("exists"):
            continue
        real = (lib.get("lnk_source") if lib.get("islnk") else lib["path"]) or lib["path"]
        if not driver_version or not real.endswith(suffix):
            stale.append(f"{lib['name']} -> {real}")
            continue
        mounts.append({"source": real, "target": f"{lib_dir.rstrip('/')}/{lib['name']}", "read_only": True})
        names.append(lib["name"])
    found = {n.split(".so", 1)[0] for n in names}
    missing = [s for s in ("libcuda", "libnvidia-ml") if s not in found]
    return {"mounts": mounts, "libraries": names, "stale": stale, "missing": missing}


def gpu_device_nodes(paths: list) -> list:
    """/dev/nvidia* paths found on the node -> docker `devices` entries (rwm, same path inside).

    The GPUs (/dev/nvidia0..N), the control devices (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools,
    /dev/nvidia-modeset); /dev/nvidia-caps (MIG capabilities) only when present and asked for by the caller.
    """
    keep = re.compile(r"^/dev/(nvidia\d+|nvidiactl|nvidia-uvm|nvidia-uvm-tools|nvidia-modeset)$")
    return [f"{p}:{p}:rwm" for p in sorted(set(paths or []), key=lambda x: (len(x), x)) if keep.match(p)]


def gpu_paths(read: dict, driver_version, lib_dir: str = DRIVER_LIB_DIR) -> dict:
    """What gpu mode devices gives the container, from the module container_gpu_paths's answer (read) and the running
    driver's version (nvidia_gpu_facts): devices (docker devices entries), driver_libs (driver_lib_mounts), nvidia_smi
    (its path on the node, empty when none), driver_version and driver_lib_dir (for the container.gpus record)."""
    read = read or {}
    return {"devices": gpu_device_nodes(read.get("device_nodes")),
            "driver_libs": driver_lib_mounts(read.get("libraries"), driver_version, lib_dir),
            "nvidia_smi": str(read.get("nvidia_smi") or ""), "driver_version": driver_version,
            "driver_lib_dir": lib_dir}


def engine_record(ok, host_info=None, msg=""):
    """container.engine: ok, whether community.docker's docker_host_info talked to the engine; host_info, its
    host_info (ServerVersion, Driver, CgroupVersion); msg, its message when it did not (whitespace-normalised)."""
    ok, info, msg = _flag(ok), host_info or {}, str(msg or "")
    if ok:
        detail = (f"docker {info.get('ServerVersion', '')} (storage {info.get('Driver', '')}, cgroup "
                  f"v{info.get('CgroupVersion', '?')})")
    else:
        detail = "cannot talk to the docker engine: " + truncate(msg)
    return {
        "check": "container.engine",
        "ok": ok,
        "detail": detail,
        "fix": _ENGINE_FIX_LIBS if ("requests" in msg or "import" in msg) else _ENGINE_FIX_START,
        "data": {"drift": {"docker_version": info.get("ServerVersion")}},
    }


def _gpus_status(ctx, libs):
    if not _flag(ctx.get("engine_ok")):
        return "skip"
    if ctx.get("container_gpus") == "none" or not _flag(ctx.get("gpus")):
        return "pass"
    mode = ctx.get("gpu_mode")
    if mode == "runtime" and "nvidia" not in (ctx.get("runtimes") or []):
        return "fail"
    if mode == "devices" and (not ctx.get("devices") or libs.get("missing")):
        return "fail"
    return "pass"


def _gpus_detail(ctx, libs):
    mode, option = ctx.get("gpu_mode"), ctx.get("container_gpu_mode")
    runtimes = list(ctx.get("runtimes") or [])
    if not _flag(ctx.get("engine_ok")):
        return "not checked: the engine does not answer"
    if ctx.get("container_gpus") == "none":
        return "GPUs not requested (container_gpus: none)"
    if not _flag(ctx.get("gpus")):
        return "no GPUs on this node (/dev/nvidiactl absent): the container runs on CPU"
    if mode == "runtime" and "nvidia" in runtimes:
        return "gpu mode runtime: all GPUs through the NVIDIA runtime"
    if mode == "runtime":
        return (f"gpu mode runtime (container_gpu_mode: {option}) but the engine has no NVIDIA runtime "
                f"(runtimes: {', '.join(runtimes)})")
    why = "auto: the engine has no NVIDIA runtime" if option == "auto" else "container_gpu_mode: devices"
    nodes = " ".join(re.sub(r":.*$", "", str(d)) for d in ctx.get("devices") or [])
    detail = (f"gpu mode devices ({why}): {nodes}; driver {ctx.get('driver_version', '')} libraries "
              f"{' '.join(libs.get('libraries') or [])} mounted read-only at {ctx.get('driver_lib_dir', '')}")
    if libs.get("missing"):
        detail += "; missing " + ", ".join(libs["missing"])
    if libs.get("stale"):
        detail += "; left out (another driver version): " + ", ".join(libs["stale"])
    return detail


def gpus_record(ctx):
    """container.gpus from ctx: node (inventory name), engine_ok, container_gpus and container_gpu_mode (the
    options), gpus (whether the container gets GPUs), gpu_mode (runtime or devices, auto resolved), runtimes (the
    engine's), and for gpu mode devices: devices (docker devices entries), driver_libs (driver_lib_mounts's
    answer), driver_version (None: not read), driver_lib_dir."""
    ctx = ctx or {}
    libs = ctx.get("driver_libs") or {}
    mode = ctx.get("gpu_mode") if _flag(ctx.get("gpus")) else "none"
    if ctx.get("gpu_mode") == "runtime":
        fix = _GPUS_FIX_RUNTIME
    else:
        version = ctx.get("driver_version")
        fix = _GPUS_FIX_DEVICES.format(node=ctx.get("node"), version="?" if version is None else version)
    return {
        "check": "container.gpus",
        "status": _gpus_status(ctx, libs),
        "detail": _gpus_detail(ctx, libs),
        "fix": fix,
        "data": {"gpu_mode": mode, "devices": list(ctx.get("devices") or []),
                 "driver_libraries": list(libs.get("libraries") or []), "drift": {"container_gpu_mode": mode}},
    }


def pull_records(pull, login, image, registry, username, check_mode=False):
    """container.registry_login and container.image_pull, each only where its step ran in this run (the result
    registered and not skipped; tasks/preflight.yml pulls nothing: no record then): the login's result, the pull's
    (the image present, pulled, or not present yet in check mode; else the engine's message), the image, its
    registry and the registry user. The pull record is pending on the pull in check mode."""
    out = []
    if isinstance(login, dict) and not _flag(login.get("skipped")):
        ok = "login_result" in login
        out.append({"check": "container.registry_login", "ok": ok,
                    "detail": ("logged in to " if ok else "login failed at ") + f"{registry} as {username}",
                    "fix": "Check container_registry_username and container_registry_password (a token may have "
                           "expired) and container_registry_url"})
    if isinstance(pull, dict) and not _flag(pull.get("skipped")):
        pulled = "image" in pull and "msg" not in pull
        if pulled:
            detail = image + (" present" if not pull.get("changed") else " not present yet" if _flag(check_mode)
                              else " pulled")
        else:
            detail = f"pulling {image} failed: " + truncate(re.sub(r"\s+", " ", str(pull.get("msg", "?"))))
        out.append({"check": "container.image_pull", "ok": pulled, "detail": detail,
                    "fix": f"Check that the node reaches the registry ({registry}), the image name and tag, and the "
                           "registry credentials (container_registry_username, container_registry_password)",
                    "pending_on": {"container : Pull the training image": pull}})
    return out


def digest_record(verdict, engine_ok, image, pull=None):
    """container.image_digest from this node's verdict (container_digest_verdicts' entry: ok, detail, fix, id,
    repo_digest, reference), whether the engine answered, container_image and the pull's result (pending on it in
    check mode). The drift value is the repo digest, else the image id."""
    verdict = verdict or {}
    answered = _flag(engine_ok)
    return {
        "check": "container.image_digest",
        "status": "skip" if not answered else "pass" if verdict.get("ok") else "fail",
        "detail": verdict.get("detail") if answered else "not checked: the engine does not answer",
        "fix": verdict.get("fix", ""),
        "data": {"image": image, "image_id": verdict.get("id"), "repo_digest": verdict.get("repo_digest"),
                 "reference": verdict.get("reference"),
                 "drift": {"image_digest": verdict.get("repo_digest") or verdict.get("id")}},
        "pending_on": {"container : Pull the training image": pull if pull is not None else {}},
    }


def running_record(ctx):
    """container.running from ctx: engine_ok, name (container_name), problems (config_problems's answer:
    the running container against the wanted configuration), mounts (how many), user (container_user), caps
    (container_caps_spec's list), no_new_privileges, ulimits (container_ulimits_spec's list), run_msg (the start
    task's message, None when it has none), run_ran (whether the start task ran in this run), pending_on."""
    ctx = ctx or {}
    name, problems = ctx.get("name"), list(ctx.get("problems") or [])
    run_msg = ctx.get("run_msg")
    if not _flag(ctx.get("engine_ok")):
        status, detail = "skip", "not checked: the engine does not answer"
    elif not problems:
        status = "pass"
        detail = (f"{name}: running, host network/IPC/PID, {ctx.get('mounts', 0)} mounts, user "
                  f"{ctx.get('user') or 'of the image'}, capabilities {' '.join(ctx.get('caps') or []) or 'none'}, "
                  f"no-new-privileges {'on' if _flag(ctx.get('no_new_privileges')) else 'off'}")
    else:
        status, detail = "fail", f"{name}: " + "; ".join(problems)
    if run_msg is not None:
        detail += " (start failed: " + truncate(re.sub(r"\s+", " ", str(run_msg))) + ")"
    if "rlimit" in (str(run_msg or "") + " ".join(problems)):
        fix = (f"The engine may not raise these ulimits ({', '.join(ctx.get('ulimits') or [])}): run dockerd with "
               "LimitMEMLOCK=infinity and LimitSTACK=infinity (docker.service), or lower container_ulimits")
    elif _flag(ctx.get("run_ran")):
        fix = (f"Fix the cause above and rerun site.yml; it recreates {name} when its configuration changed "
               f"(docker logs {name} on the node)")
    else:
        fix = f"Run site.yml (container role) to create {name} with the wanted configuration"
    rec = {"check": "container.running", "status": status, "detail": detail, "fix": fix}
    if ctx.get("pending_on"):
        rec["pending_on"] = ctx["pending_on"]
    return rec


def manifest_digest(stdout):
    """The digest `docker manifest inspect -v` printed: one manifest, or a list per platform (then amd64's, the
    platform the nodes run, else the first); '?' when there is none."""
    try:
        found = json.loads(stdout or "{}")
    except ValueError:
        found = {}
    if isinstance(found, list):
        amd64 = [m for m in found if isinstance(m, dict)
                 and ((m.get("Descriptor") or {}).get("platform") or {}).get("architecture") == "amd64"]
        found = (amd64 or found or [{}])[0]
    descriptor = found.get("Descriptor") if isinstance(found, dict) else None
    return (descriptor or {}).get("digest") or "?"


def registry_reach_record(manifest, image, registry):
    """container.registry_reach (check mode, where the run would pull) from the result of `docker manifest inspect
    -v <image>` run on the node (rc, stdout, stderr; None: not run)."""
    manifest = manifest or {}
    ok = manifest.get("rc", 1) == 0
    digest = manifest_digest(manifest.get("stdout")) if ok else None
    if ok:
        detail = f"{image} is in the registry, digest {digest}"
    else:
        why = truncate(re.sub(r"\s+", " ", str(manifest.get("stderr", "?"))))
        detail = f"the run would pull {image} but this node cannot read it from the registry: {why}"
    return {
        "check": "container.registry_reach",
        "ok": ok,
        "detail": detail,
        "fix": (f"Make the registry ({registry}) reachable from this node (address, port, firewall, TLS or the engine's "
                "insecure-registries), check the image name and tag and the registry credentials "
                "(container_registry_username, container_registry_password)"),
        "data": {"registry_digest": digest},
    }


def gpu_visible_verdict(seen: dict | None, expected_uuids: list, mode: str) -> dict:
    """The GPUs nvidia-smi lists inside the container against the node's nvidia_gpu_facts.

    seen: the probe's {uuids: [...], error: str}; expected_uuids: every GPU of the node. Returns {status, detail}.
    """
    want = sorted(u for u in (expected_uuids or []) if u)
    if seen is None:
        return {"status": "skip", "detail": "not reported by the probe"}
    if seen.get("error"):
        return {"status": "fail", "detail": f"nvidia-smi in the container ({mode}): {seen['error']}"}
    got = sorted(seen.get("uuids") or [])
    missing = [u for u in want if u not in got]
    extra = [u for u in got if u not in want]
    if not want:
        return {"status": "skip", "detail": "nvidia_gpu_facts lists no GPU on this node"}
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"not on the node {', '.join(extra)}")
        return {"status": "fail", "detail": f"the container ({mode}) sees {len(got)} of {len(want)} GPU(s): "
                                            + "; ".join(parts)}
    return {"status": "pass", "detail": f"the container ({mode}) sees all {len(want)} GPU(s) of the node, "
                                        f"same UUIDs ({', '.join(u[:12] for u in want)})"}


_HEALTH_FIX = {
    "code_dir": "Create the code directory on the node ({path}) and put the training code there, "
                "or set cluster_code_dir / container_mounts",
    "output_writable": "The output root {path} is not writable inside the container: check the node's disk "
                       "(mount -o remount,rw, df -h, dmesg for I/O errors), that container_mounts does not "
                       "mount it read-only, and that the uid:gid of container_user may write it (the role gives "
                       "it a root-owned directory only; chown that uid:gid {path} for another owner's)",
    "shared_readable": "The job's user cannot read the shared root {path} or a file of the job's inputs (the files "
                       "named above): mount the shared filesystem on the node (findmnt {path}) and make its files "
                       "readable by the uid of container_user (chmod -R a+rX on the node; safetensors' save_file "
                       "writes 0600 files), or set container_user to a uid that may read them",
    "home": "The job's HOME is not writable by its user: set container_home to a path the uid of container_user can "
            "create (the default /tmp/trainyard-home), or HOME in container_env",
    "logger": "The training code logs through {module}, which the image cannot import: add it to the image "
              "(pip install {module}), or set container_logger_module to the logger the code uses",
    "python": "The image has no working {python}: use an image with Python, or set container_python",
    "torch": "torch does not import in the image: install torch in the image (matching the node's CUDA driver)",
    "ulimits": "The engine could not give the container these limits: raise them for dockerd "
               "(LimitMEMLOCK=infinity / LimitSTACK in docker.service) and recreate the container",
    "gpu_visible": "The container does not see every GPU of the node: with container_gpu_mode devices check that "
                   "every /dev/nvidia* node and the driver's libraries are given (container.gpus lists them); with "
                   "runtime, the NVIDIA runtime's configuration (nvidia-ctk runtime configure); then rerun site.yml",
    "shm": "/dev/shm is the node's (ipc_mode host): enlarge it on the node (mount -o remount,size={want} "
           "/dev/shm, or in /etc/fstab), or lower container_shm_size",
}


def health_records(exec_result: dict | None, params: dict) -> list:
    """docker_container_exec result of files/container_health.py -> preflight_check records.

    params: {code_dir, output_root, shared_root, logger_module, python, shm_size, ulimits, container}
    Each record: {check, status, detail, fix}.
    """
    import json

    names = ["code_dir", "output_writable", "shared_readable", "home", "logger", "python", "torch", "ulimits", "shm",
             "gpu_visible"]
    fmt = {"path": "", "module": params.get("logger_module", ""), "python": params.get("python", "python3"),
           "want": params.get("shm_size", "")}
    paths = {"code_dir": params.get("code_dir"), "output_writable": params.get("output_root"),
             "shared_readable": params.get("shared_root")}

    def rec(name, status, detail, fix=""):
        return {"check": f"container.health.{name}", "status": status, "detail": detail, "fix": fix}

    if not exec_result or exec_result.get("skipped"):
        reason = (exec_result or {}).get("skip_reason") or "the container is not running"
        return [rec(n, "skip", f"not checked: {reason}") for n in names]
    data = None
    for line in reversed((exec_result.get("stdout") or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
                break
            except ValueError:
                continue
    if data is None:
        err = (exec_result.get("stderr") or exec_result.get("msg") or "").strip().splitlines()
        why = err[-1] if err else f"exit code {exec_result.get('rc', '?')}"
        records = [rec("python", "fail", f"{fmt['python']} did not run in {params.get('container', 'the container')}"
                       f": {why}", _HEALTH_FIX["python"].format(**fmt))]
        records += [rec(n, "skip", "not checked: the health probe could not run") for n in names if n != "python"]
        return records
    out = []
    for name in names:
        r = data.get(name)
        if r is None:
            out.append(rec(name, "skip", "not reported by the probe"))
            continue
        f = dict(fmt, path=paths.get(name) or "")
        if name == "gpu_visible" and "status" not in r:
            r = gpu_visible_verdict(r, params.get("gpu_uuids") or [], params.get("gpu_mode") or "runtime")
        status = r.get("status") or ("pass" if r.get("ok") else "fail")
        out.append(rec(name, status, r.get("detail", ""),
                       "" if status in ("pass", "skip") else _HEALTH_FIX[name].format(**f)))
    return out


# The running container against the wanted configuration (the role's container.running record).


def short_digest(digest: str) -> str:
    return digest.split(":", 1)[-1][:12] if digest else "-"


def mount_target(mount: dict) -> str:
    """Path of a container_mounts entry inside the container (its source unless target is given)."""
    return mount.get("target") or mount.get("source") or ""


def mounts_spec(mounts: list) -> list:
    """container_mounts entries -> docker_container `mounts` (bind mounts, same path inside by default)."""
    out = []
    for m in mounts or []:
        out.append({"type": "bind", "source": m["source"], "target": mount_target(m),
                    "read_only": bool(m.get("read_only", False))})
    return out


def ulimits_spec(ulimits: dict) -> list:
    """{memlock: -1, stack: 67108864, nofile: '1024:4096'} -> ['memlock:-1:-1', 'stack:...', 'nofile:1024:4096']."""
    out = []
    for name, value in sorted((ulimits or {}).items()):
        value = str(value)
        soft, _, hard = value.partition(":")
        out.append(f"{name}:{soft}:{hard or soft}")
    return out


def caps_spec(caps: list) -> list:
    """container_cap_add -> the names docker records (CAP_ prefix, upper case, sorted, once each): the role passes
    these, so the engine's inspect data compares equal on a converged run."""
    names = set()
    for cap in caps or []:
        name = str(cap).strip().upper()
        if name:
            names.add(name if name.startswith("CAP_") or name == "ALL" else "CAP_" + name)
    return sorted(names)


def hardening_problems(inspect: dict, expected: dict) -> list:
    """The container's user, capabilities and no-new-privileges against the wanted ones (config_problems' part).

    expected: {user: str, cap_add: [names], no_new_privileges: bool}; a key left out (or user "") is not checked.
    """
    problems = []
    host, config = inspect.get("HostConfig") or {}, inspect.get("Config") or {}
    want = str(expected.get("user") or "")
    if want and want != str(config.get("User") or ""):  # "" (the image's USER) is whatever the image says
        problems.append(f"runs as user {config.get('User') or 'root (the image default)'}, expected {want}")
    if "cap_add" in expected:
        if caps_spec(host.get("CapDrop")) != ["ALL"]:
            problems.append(f"capabilities dropped: {', '.join(host.get('CapDrop') or []) or 'none'}, expected ALL")
        want_caps, have_caps = caps_spec(expected["cap_add"]), caps_spec(host.get("CapAdd"))
        if want_caps != have_caps:
            problems.append(f"capabilities added: {', '.join(have_caps) or 'none'}, expected "
                            f"{', '.join(want_caps) or 'none'}")
    if "no_new_privileges" in expected:
        # docker accepts no-new-privileges, no-new-privileges:true and no-new-privileges=true
        nnp = any(key == "no-new-privileges" and value in ("", "true")
                  for key, _, value in (str(o).replace("=", ":", 1).partition(":")
                                        for o in host.get("SecurityOpt") or []))
        if nnp != bool(expected["no_new_privileges"]):
            problems.append("no-new-privileges is " + ("set" if nnp else "not set") + ", expected "
                            + ("set" if expected["no_new_privileges"] else "not set"))
    return problems


def config_problems(inspect: dict | None, expected: dict) -> list:
    """Differences between a container's inspect data and what the role wants (empty list: as wanted).

    expected: {image_id, network_mode, ipc_mode, pid_mode, mounts: [{source, target, read_only}], gpus: bool,
               user, cap_add, no_new_privileges (hardening_problems)}
    """
    if not inspect:
        return ["container does not exist"]
    problems = []
    state = inspect.get("State") or {}
    if not state.get("Running"):
        problems.append(f"not running (status {state.get('Status', '?')}, exit code {state.get('ExitCode', '?')}"
                        + (f", error: {state['Error']}" if state.get("Error") else "") + ")")
    host = inspect.get("HostConfig") or {}
    for key, field in (("network_mode", "NetworkMode"), ("ipc_mode", "IpcMode"), ("pid_mode", "PidMode")):
        want = expected.get(key)
        if want and (host.get(field) or "") != want:
            problems.append(f"{key} is {host.get(field) or 'default'!s}, expected {want}")
    want_image = expected.get("image_id")
    if want_image and inspect.get("Image") and inspect["Image"] != want_image:
        problems.append(f"runs image {short_digest(inspect['Image'])}, the node's {expected.get('image', 'image')} "
                        f"is {short_digest(want_image)}")
    have = {m.get("Destination"): m for m in inspect.get("Mounts") or []}
    for m in mounts_spec(expected.get("mounts") or []):
        got = have.get(m["target"])
        if not got:
            problems.append(f"mount {m['target']} missing")
            continue
        if got.get("Source") and got["Source"] != m["source"]:
            problems.append(f"mount {m['target']} comes from {got['Source']}, expected {m['source']}")
        if bool(got.get("RW", True)) == m["read_only"]:
            problems.append(f"mount {m['target']} is {'rw' if got.get('RW', True) else 'ro'}, expected "
                            f"{'ro' if m['read_only'] else 'rw'}")
    problems.extend(hardening_problems(inspect, expected))
    if expected.get("gpus") and expected.get("gpu_mode", "runtime") == "runtime":
        reqs = host.get("DeviceRequests") or []
        if not any("gpu" in (c for caps in (r.get("Capabilities") or []) for c in caps) for r in reqs):
            problems.append("no GPU device request (the node has GPUs)")
    elif expected.get("gpus"):
        have_dev = {d.get("PathInContainer") for d in host.get("Devices") or []}
        lost = [d.split(":")[1] for d in expected.get("devices") or [] if d.split(":")[1] not in have_dev]
        if lost:
            problems.append(f"GPU device node(s) {', '.join(lost)} not given to the container (gpu_mode devices)")
    return problems


def verify_inputs(v):
    """Everything tasks/verify.yml records but the health (the container_health action's part before the probe),
    from v: the registered results engine (the probe's, with engine_view's keys), run (the start of the container),
    info (its read: tasks/reads.yml's on the read-only path, else the start's own under info), pull (the engine probe's pull: the login's result under login, the registry's answer in check mode under
    manifest), check_mode, digest (this node's container_digest_verdicts entry); the role's
    options name, image, registry (the image's, resolved), registry_username, user, cap_add, no_new_privileges,
    ulimits, mounts (container_mounts + container_mounts_extra), container_gpus, container_gpu_mode, and what
    the engine probe's gpu_paths gave (devices, driver_libs, driver_version, driver_lib_dir; absent elsewhere).

    Returns {records, inspect (the container's inspect data, None when it does not exist), running (it runs and the
    engine answers: the probe can run), skip_reason (why not)}.
    """
    engine, run = v.get("engine") or {}, v.get("run") or {}
    info = v.get("info") or run.get("info") or {}
    ok, check_mode = _flag(engine.get("engine_ok")), _flag(v.get("check_mode"))
    inspect = run["container"] if "container" in run and not check_mode else info.get("container")
    gpus, gpu_mode, devices = _flag(engine.get("gpus")), engine.get("gpu_mode"), list(v.get("devices") or [])
    digest = v.get("digest") or {}
    wanted = {"image": v.get("image"), "image_id": digest.get("id") or "", "network_mode": "host",
              "ipc_mode": "host", "pid_mode": "host", "mounts": v.get("mounts") or [], "gpus": gpus,
              "gpu_mode": gpu_mode, "devices": devices, "user": v.get("user"), "cap_add": v.get("cap_add") or [],
              "no_new_privileges": _flag(v.get("no_new_privileges"))}
    started = {"container : Create the mounted directories and start the training container": v.get("run") or {}}
    records = [
        engine_record(ok, engine.get("host_info") or {}, engine.get("engine_msg")),
        gpus_record({"node": v.get("node"), "engine_ok": ok, "container_gpus": v.get("container_gpus"),
                     "container_gpu_mode": v.get("container_gpu_mode"), "gpus": gpus, "gpu_mode": gpu_mode,
                     "runtimes": engine.get("runtimes") or [], "devices": devices,
                     "driver_libs": v.get("driver_libs") or {}, "driver_version": v.get("driver_version"),
                     "driver_lib_dir": v.get("driver_lib_dir") or ""}),
        *pull_records(v.get("pull"), (v.get("pull") or {}).get("login"), v.get("image"), v.get("registry"),
                      v.get("registry_username"), check_mode),
        *([registry_reach_record(v["pull"]["manifest"], v.get("image"), v.get("registry"))]
          if isinstance((v.get("pull") or {}).get("manifest"), dict) else []),
        digest_record(digest, ok, v.get("image"), v.get("pull") or {}),
        running_record({"engine_ok": ok, "name": v.get("name"), "problems": config_problems(inspect, wanted),
                        "mounts": len(wanted["mounts"]), "user": v.get("user"), "caps": caps_spec(wanted["cap_add"]),
                        "no_new_privileges": wanted["no_new_privileges"], "ulimits": ulimits_spec(v.get("ulimits")),
                        "run_msg": run.get("msg"), "run_ran": "changed" in run, "pending_on": started}),
    ]
    running = ok and bool(((inspect or {}).get("State") or {}).get("Running"))
    return {"records": records, "inspect": inspect, "running": running,
            "skip_reason": "the engine does not answer" if not ok else f"{v.get('name')} is not running"}
