# -*- coding: utf-8 -*-
"""The host-basics checks of the cluster role (cluster.python, cluster.disk, cluster.shm, cluster.memlock,
cluster.docker, cluster.clock, cluster.container) from the node's probe (library/host_facts.py and its action).

Pure functions, run on the controller by the action host_basics: ``clock_reference`` once over every node's clock
(the median the cluster.clock check measures each node against), ``host_basics_records`` per node.
"""

from __future__ import annotations

from ansible.module_utils.compat.version import LooseVersion
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.trainyard.core.plugins.plugin_utils import check_records

GIB = 1073741824
MIB = 1048576
# Profiles whose transport registers memory with the NIC (RDMA): a locked-memory limit fails there.
RDMA_PROFILES = ("ib", "roce", "efa")
# The thresholds of cluster_preflight (roles/cluster/vars/main.yml has their defaults).
THRESHOLDS = ("min_free_gb", "min_shm_mb", "min_memlock_kb", "max_clock_skew_s", "min_python", "docker")
NOT_PROBED = "the host probe did not run (see cluster.python)"


def clock_reference(clocks):
    """{median, uncertainty, nodes} over the nodes' clocks ({offset, uncertainty} each, from the probe's action):
    the median offset (the upper one of an even count) and the largest measurement error; None when no node has one."""
    clocks = [c for c in clocks if isinstance(c, dict) and "offset" in c]
    if not clocks:
        return None
    offsets = sorted(float(c["offset"]) for c in clocks)
    return {"median": offsets[len(offsets) // 2],
            "uncertainty": max(float(c.get("uncertainty") or 0) for c in clocks), "nodes": len(clocks)}


def truncate(text, length=300, leeway=5, end="..."):
    """Jinja's truncate: text longer than length + leeway cut at the last word boundary before length, with end."""
    if len(text) <= length + leeway:
        return text
    return text[:length - len(end)].rsplit(" ", 1)[0] + end


def probe_failed_records(msg, min_python):
    """The records of a node whose probe did not run (no Python that can run it): cluster.python fails with the
    error, every other check is a skip that says why."""
    return [
        {"check": "cluster.python", "ok": False, "detail": truncate(str(msg or "the probe failed")),
         "fix": f"Install python3 (>= {min_python}) on the node, or point ansible_python_interpreter at a working one"},
        {"check": "cluster.disk", "status": "skip", "detail": NOT_PROBED},
        {"check": "cluster.shm", "status": "skip", "detail": NOT_PROBED},
        {"check": "cluster.memlock", "status": "skip", "detail": NOT_PROBED},
        {"check": "cluster.docker", "status": "skip", "detail": NOT_PROBED},
        {"check": "cluster.clock", "status": "skip", "detail": NOT_PROBED},
    ]


def _s(value):
    """A value as a template interpolates it (None is empty)."""
    return "" if value is None else str(value)


def _kib(value):
    return "unlimited" if int(value) == -1 else f"{value} KiB"


def python_record(probe, pf):
    py = probe["python"]
    return {"check": "cluster.python",
            "ok": LooseVersion(str(py["version"])) >= LooseVersion(str(pf["min_python"])),
            "detail": f"Python {_s(py['version'])} ({_s(py['executable'])})",
            "fix": f"Install Python >= {pf['min_python']} and point ansible_python_interpreter at it",
            "data": {"drift": {"python": str(py["version"])}}}


def disk_record(probe, pf, output_root):
    disk = probe["paths"][0]
    free, total = int(disk.get("free_bytes") or 0), int(disk.get("total_bytes") or 0)
    where = "" if disk["exists"] else f" (not created yet, measured {disk['probed']})"
    return {"check": "cluster.disk",
            "ok": free >= float(pf["min_free_gb"]) * GIB,
            "detail": f"{output_root}{where}: {free / GIB:.1f} GiB free of {total / GIB:.1f} GiB, "
                      f"need {pf['min_free_gb']} GiB",
            "fix": f"Free space on the filesystem of {disk['probed']}, move cluster_output_root to a larger disk, "
                   "or lower cluster_preflight.min_free_gb",
            "data": {"free_gib": round(free / GIB, 1)}}


def shm_record(probe, pf):
    shm = probe["shm"]
    total = int(shm.get("total_bytes") or 0)
    detail = (f"/dev/shm {total // MIB} MiB ({int(shm.get('free_bytes') or 0) // MIB} MiB free), "
              f"need {pf['min_shm_mb']} MiB") if shm["exists"] else "/dev/shm does not exist"
    return {"check": "cluster.shm",
            "ok": bool(shm["exists"]) and total >= int(pf["min_shm_mb"]) * MIB,
            "detail": detail,
            "fix": "Enlarge /dev/shm (mount -o remount,size=<N>G /dev/shm and persist it in /etc/fstab; containers: "
                   "--ipc host or --shm-size), or lower cluster_preflight.min_shm_mb",
            "data": {"drift": {"shm_mb": total // MIB}}}


def memlock_record(probe, pf, profile):
    limits = probe["limits"]
    soft, need = int(limits["memlock_soft_kb"]), int(pf["min_memlock_kb"])
    fatal = profile in RDMA_PROFILES
    status = "pass" if soft == -1 or (need != -1 and soft >= need) else ("fail" if fatal else "warn")
    return {"check": "cluster.memlock",
            "status": status,
            "detail": f"memlock soft {_kib(soft)}, hard {_kib(limits['memlock_hard_kb'])}; "
                      f"need {_kib(pf['min_memlock_kb'])} ({'fatal for' if fatal else 'a warning with'} "
                      f"nccl_env_profile {profile})",
            "fix": "Add '* - memlock unlimited' to /etc/security/limits.d/99-trainyard.conf (and LimitMEMLOCK=infinity "
                   "for dockerd, --ulimit memlock=-1 for containers); RDMA (ib) needs it",
            "data": {"drift": {"memlock_kb": soft}}}


def docker_record(probe, pf, runtime, engine_install):
    docker = probe["docker"]
    needed = pf["docker"] == "required" or (pf["docker"] == "auto" and runtime != "host")
    later = pf["docker"] == "auto" and boolean(engine_install, strict=False)
    if docker["reachable"]:
        status = "pass"
        detail = f"docker {docker['version']} (API {docker['api_version']}) answers on {docker['socket']}"
    elif not needed:
        status = "skip"
        detail = f"not needed (launch_runtime {runtime}, cluster_preflight.docker {pf['docker']})"
    else:
        status = "warn" if later else "fail"
        detail = (f"engine not answering: {docker['error']}; CLI {docker['cli'] or 'missing'}"
                  + ("; the container role installs it" if later else ""))
    return {"check": "cluster.docker", "status": status, "detail": detail,
            "fix": "Install and start the docker engine (or set container_engine_install true so the container role "
                   "does)",
            "data": {"drift": {"docker": docker.get("version") or "-"}}}


def clock_record(probe, pf, reference):
    """The node's clock against the median of the nodes: the skew it surely has is its distance from the median
    less both measurement windows (its own and the widest of the nodes')."""
    clock = probe["clock"]
    rel = float(clock["offset"]) - float(reference["median"])
    skew = max(0, abs(rel) - float(clock["uncertainty"]) - float(reference["uncertainty"]))
    return {"check": "cluster.clock",
            "ok": skew <= float(pf["max_clock_skew_s"]),
            "detail": f"clock {rel:+.2f} s from the median of the nodes (at least {skew:.2f} s after the measurement "
                      f"error of ±{float(clock['uncertainty']):.2f} s), allowed {pf['max_clock_skew_s']} s",
            "fix": "Run NTP on every node (chrony or systemd-timesyncd) against the same servers, then check chronyc "
                   "tracking",
            "data": {"clock_offset_s": round(rel, 3)}}


def container_record(init, runtime, container_enabled):
    """A node that is itself a container with no engine inside (a rented instance): what applies instead, or a
    failure when the configuration needs an engine there (one cannot be installed inside such a container)."""
    needs_engine = runtime == "docker" or boolean(container_enabled, strict=False)
    if needs_engine:
        what = f"container_enabled {container_enabled} and launch_runtime {runtime} need one here"
    else:
        what = ("the job runs on the node (launch_runtime host); the janitor "
                + ("as a systemd timer" if init.get("systemd") else "as a sidecar of the job")
                + "; driver, fabric manager and MTU persistence belong to the provider host (verified, never installed)")
    return {"check": "cluster.container",
            "status": "fail" if needs_engine else "skip",
            "detail": f"{_s(init['container'])} container ({_s(init.get('container_evidence'))}), "
                      f"PID 1 {_s(init.get('pid1', '?'))}, "
                      f"{'systemd' if init.get('systemd') else 'no systemd'}, no docker engine: {what}",
            "fix": "set container_enabled: false and launch_runtime: host (inventory/example-rented-overlay): an engine "
                   "cannot be installed inside the container" if needs_engine else "",
            "data": {"drift": {"node": f"{_s(init['container'])} container"}}}


def host_basics_records(probe, reference, opts):
    """Every host-basics record of one node (preflight_check record specs), from its probe (the registered result
    of host_facts), the clock reference of all nodes (clock_reference) and opts: output_root, thresholds
    (cluster_preflight over its defaults), launch_runtime, nccl_env_profile, container_engine_install,
    container_enabled."""
    pf = opts["thresholds"]
    if not isinstance(probe, dict) or "time" not in probe:
        msg = probe.get("msg") if isinstance(probe, dict) else None
        return probe_failed_records(msg, pf["min_python"])
    runtime = opts["launch_runtime"]
    records = [python_record(probe, pf), disk_record(probe, pf, opts["output_root"]), shm_record(probe, pf),
               memlock_record(probe, pf, opts["nccl_env_profile"]),
               docker_record(probe, pf, runtime, opts["container_engine_install"])]
    if reference and "clock" in probe:
        records.append(clock_record(probe, pf, reference))
    else:
        records.append({"check": "cluster.clock", "status": "skip", "detail": "no node's clock was measured"})
    # the probe's trainyard_init, published (check_records.publish) or as the module returned it
    init = ((probe.get(check_records.PUBLISH_KEY) or {}).get("vars") or probe.get("ansible_facts") or {}) \
        .get("trainyard_init") or {}
    docker = probe["docker"]
    if init.get("container") is not None and not docker["reachable"] and not docker["cli"]:
        records.append(container_record(init, runtime, opts["container_enabled"]))
    return records
