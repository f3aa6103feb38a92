# -*- coding: utf-8 -*-
"""Pure parsing of what the NVIDIA stack tells about a node, and the checks built on it.

Inputs are plain strings (the output of ``nvidia-smi -q -x``, ``nvidia-smi nvlink -s``,
/proc/driver/nvidia/version, ``nv-fabricmanager --version``, ``dpkg-query`` lines) and plain data;
outputs are plain dicts and lists. Nothing here runs a command, so every function is unit-tested on the
real outputs captured from an H200 x4 node (tests/data/nvidia-smi/h200x4/) and on edited copies.

Used by the module ``nvidia_gpu_facts`` (library/) on the node and by the roles' filter plugins on the
controller; standard library only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import xml.etree.ElementTree as ET

# Fabric states/statuses as nvidia-smi prints them (nvmlGpuFabricInfo).
FABRIC_OK_STATE = "Completed"
FABRIC_OK_STATUS = "Success"
FABRIC_NOT_APPLICABLE = ("", "N/A", "Not Supported", "Not supported")

_VERSION = re.compile(r"\b(\d{2,4}\.\d{1,3}(?:\.\d{1,3})?)\b")
_PCI = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_MIB = re.compile(r"^\s*(\d+)\s*MiB\s*$")
_NVLINK_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?\s*$")
_NVLINK_LINK = re.compile(r"^\s*Link (\d+): (.*?)\s*$")


class NvidiaSmiParseError(ValueError):
    """The text is not what nvidia-smi prints (truncated, not XML, a field missing)."""


def _text(elem, path, default=None):
    if elem is None:
        return default
    found = elem.find(path)
    if found is None or found.text is None:
        return default
    value = found.text.strip()
    return value if value != "" else default


def normalize_pci(bus_id):
    """'00000000:00:06.0' / '0000:00:06.0' / '00:06.0' -> '0000:00:06.0' (lower case, 4-digit domain).

    This is the form CUDA, torch and sysfs use. A value that is not a PCI address raises
    NvidiaSmiParseError.
    """
    m = _PCI.match((bus_id or "").strip())
    if not m:
        raise NvidiaSmiParseError("%r is not a PCI bus id (expected DDDDDDDD:BB:DD.F)" % (bus_id,))
    domain, bus, dev, fn = m.groups()
    return "%04x:%02x:%02x.%d" % (int(domain or "0", 16), int(bus, 16), int(dev, 16), int(fn))


def pci_sort_key(bus_id):
    """Sort key that orders GPUs the way CUDA_DEVICE_ORDER=PCI_BUS_ID does (domain, bus, device, function)."""
    domain, bus, rest = normalize_pci(bus_id).split(":")
    dev, fn = rest.split(".")
    return (int(domain, 16), int(bus, 16), int(dev, 16), int(fn))


def _mib(value):
    m = _MIB.match(value or "")
    return int(m.group(1)) if m else None


def to_text(data):
    """Text of a command's output whatever its bytes: undecodable bytes (or the surrogates Python's
    surrogateescape left for them) become U+FFFD, so a parser never meets them."""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def undecodable(data):
    """How many characters of a command's output were not UTF-8 (see to_text)."""
    return to_text(data).count(u"\ufffd") - (data.count(u"\ufffd") if not isinstance(data, bytes) else 0)


def mig_problems(gpus):
    """GPUs in MIG mode (current or pending): [(gpu, words)]. The rank map assigns whole GPUs."""
    out = []
    for g in gpus or []:
        current, pending = g.get("mig_mode"), g.get("mig_pending")
        if current == "Enabled":
            n = g.get("mig_devices") or 0
            out.append((g, "MIG Enabled (%d MIG device%s)" % (n, "" if n == 1 else "s")))
        elif pending == "Enabled":
            out.append((g, "MIG Enabled pending (takes effect at the next GPU reset)"))
    return out


def parse_query_xml(text):
    """``nvidia-smi -q -x`` -> {driver_version, cuda_version, attached_gpus, gpus: [...]}.

    Each GPU: index (its position, which is nvidia-smi's index), uuid, pci_bus_id (as printed),
    pci_bus_id_normalized, name, memory_total_mib, persistence_mode, mig_mode, minor_number, module_id,
    fabric {state, status, clique_id, cluster_uuid}. Raises NvidiaSmiParseError naming what is wrong.
    """
    if not text or not text.strip():
        raise NvidiaSmiParseError("nvidia-smi -q -x printed nothing")
    text = to_text(text)
    # The DOCTYPE names an external DTD; ElementTree never fetches it.
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise NvidiaSmiParseError("nvidia-smi -q -x did not print well-formed XML (%s)" % exc)
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiParseError("nvidia-smi -q -x printed <%s>, expected <nvidia_smi_log>" % root.tag)
    driver = _text(root, "driver_version")
    if not driver:
        raise NvidiaSmiParseError("nvidia-smi -q -x has no driver_version")
    attached = _text(root, "attached_gpus")
    try:
        attached = int(attached) if attached is not None else None
    except ValueError:
        raise NvidiaSmiParseError("attached_gpus is %r, not a number" % attached)
    gpus = []
    for index, g in enumerate(root.findall("gpu")):
        bus = _text(g, "pci/pci_bus_id") or g.get("id")
        uuid = _text(g, "uuid")
        if not bus:
            raise NvidiaSmiParseError("GPU %d has no PCI bus id" % index)
        if not uuid:
            raise NvidiaSmiParseError("GPU %d (%s) has no UUID" % (index, bus))
        minor = _text(g, "minor_number")
        gpus.append({
            "index": index,
            "uuid": uuid,
            "pci_bus_id": bus,
            "pci_bus_id_normalized": normalize_pci(bus),
            "name": _text(g, "product_name", ""),
            "serial": _text(g, "serial"),
            "memory_total_mib": _mib(_text(g, "fb_memory_usage/total")),
            "persistence_mode": _text(g, "persistence_mode"),
            "mig_mode": _text(g, "mig_mode/current_mig"),
            "mig_pending": _text(g, "mig_mode/pending_mig"),
            "mig_devices": len(g.findall("mig_devices/mig_device")),
            "minor_number": int(minor) if minor and minor.isdigit() else None,
            "module_id": _text(g, "platformInfo/module_id"),
            "fabric": {
                "state": _text(g, "fabric/state", "N/A"),
                "status": _text(g, "fabric/status", "N/A"),
                "clique_id": _text(g, "fabric/cliqueId"),
                "cluster_uuid": _text(g, "fabric/clusterUuid"),
            },
        })
    return {
        "driver_version": driver,
        "cuda_version": _text(root, "cuda_version"),
        "attached_gpus": attached,
        "gpus": gpus,
    }


def parse_nvlink_status(text):
    """``nvidia-smi nvlink -s`` -> {gpu index: {links, active, inactive, gbps}}.

    A link reads ``Link 3: 26.562 GB/s`` when up and ``Link 3: <inactive>`` when down; a GPU without
    NVLink lists no links (links 0).
    """
    out = {}
    current = None
    for line in (text or "").splitlines():
        m = _NVLINK_GPU.match(line)
        if m:
            current = {"links": 0, "active": 0, "inactive": 0, "gbps": 0.0}
            out[int(m.group(1))] = current
            continue
        m = _NVLINK_LINK.match(line)
        if m and current is not None:
            current["links"] += 1
            speed = re.match(r"^([\d.]+)\s*GB/s$", m.group(2))
            if speed:
                current["active"] += 1
                current["gbps"] = round(current["gbps"] + float(speed.group(1)), 3)
            else:
                current["inactive"] += 1
    return out


def parse_driver_proc_version(text):
    """/proc/driver/nvidia/version -> the loaded kernel module's version, or None.

    ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...``
    """
    for line in (text or "").splitlines():
        if line.startswith("NVRM version"):
            m = _VERSION.search(line.split(":", 1)[-1])
            return m.group(1) if m else None
    return None


def parse_fabricmanager_version(text):
    """``nv-fabricmanager --version`` (``Fabric Manager version is : 580.159.04``) -> '580.159.04' or None."""
    for line in (text or "").splitlines():
        if "version" in line.lower():
            m = _VERSION.search(line.split(":", 1)[-1] if ":" in line else line)
            if m:
                return m.group(1)
    return None


def parse_fabricmanager_package(text):
    """``dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' 'nvidia-fabricmanager*'`` lines ->
    (package, upstream version) of the installed fabric manager package, or (None, None).

    Debian revisions and epochs are dropped: ``580.159.04-1`` -> ``580.159.04``. Packages that are only
    known to dpkg (not installed, status other than ``ii``/``hi``) are ignored.
    """
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[0].startswith("nvidia-fabricmanager"):
            continue
        if "-dev" in parts[0]:
            continue
        if len(parts) >= 3 and parts[2][:2] not in ("ii", "hi"):
            continue
        version = parts[1].split(":", 1)[-1].split("-", 1)[0]
        if _VERSION.fullmatch(version):
            return parts[0], version
    return None, None


def parse_unit_show(text):
    """``systemctl show UNIT -p LoadState -p ActiveState -p SubState -p UnitFileState`` -> the unit as
    service_facts names it, ``{state: running|stopped, status: enabled|disabled|static|...|failed}``, or None when
    systemd knows no such unit."""
    props = dict(line.split("=", 1) for line in (text or "").splitlines() if "=" in line)
    if props.get("LoadState", "not-found") == "not-found":
        return None
    return {"state": "running" if props.get("SubState") == "running" else "stopped",
            "status": "failed" if props.get("ActiveState") == "failed"
            else props.get("UnitFileState") or props.get("ActiveState") or "unknown"}


def nvswitch_devices(entries):
    """Entries of /proc/driver/nvidia-nvswitch/devices (a directory of PCI addresses on HGX/DGX nodes, or
    the lines of a listing) -> sorted list of NVSwitch PCI addresses."""
    out = []
    for entry in entries or []:
        entry = entry.strip().rstrip("/")
        if not entry:
            continue
        try:
            out.append(normalize_pci(entry.split()[-1]))
        except NvidiaSmiParseError:
            continue
    return sorted(set(out))


def fabric_applicable(gpus):
    """True when any GPU reports a fabric state (NVSwitch / NVLink-fabric systems); PCIe GPUs report N/A."""
    return any((g.get("fabric") or {}).get("state") not in FABRIC_NOT_APPLICABLE for g in gpus or [])


def fabric_ok(gpu):
    fabric = gpu.get("fabric") or {}
    return fabric.get("state") == FABRIC_OK_STATE and fabric.get("status") == FABRIC_OK_STATUS


def classify_failure(rc, output, missing=False):
    """Why nvidia-smi failed -> a short likely cause and what to do (one line each)."""
    text = (output or "").strip()
    low = text.lower()
    if missing:
        return ("nvidia-smi is not installed (not on PATH)",
                "install the driver (nvidia_driver_install: true) or add its bin directory to PATH")
    if rc in (124, 137) or "timed out" in low:
        return ("nvidia-smi did not answer in time: a GPU may be hung (look for Xid errors in dmesg)",
                "reset the GPU (nvidia-smi -r) or reboot the node; if it persists, replace the node")
    if "couldn't communicate with the nvidia driver" in low or rc == 9:
        return ("the NVIDIA kernel module is not loaded or does not match the user-space driver "
                "(driver/library version mismatch after an upgrade, or DKMS did not build for this kernel)",
                "reboot the node after a driver upgrade; check dkms status and lsmod | grep nvidia")
    if "driver/library version mismatch" in low:
        return ("the loaded kernel module and the user-space driver differ (upgrade without reboot)",
                "reboot the node (or unload and reload the nvidia modules)")
    if "no devices were found" in low or rc == 6:
        return ("the driver sees no GPU (GPUs fell off the bus, or the node has none)",
                "check dmesg for Xid/'fallen off the bus'; reboot or replace the node")
    if "insufficient permissions" in low or "permission denied" in low or rc == 4:
        return ("permission denied on /dev/nvidia* (the user running Ansible may not open the GPUs)",
                "run with become: true, or fix the device permissions (nvidia-persistenced, udev rules)")
    if "fabric" in low:
        return ("the GPU fabric (NVSwitch) is not ready", "restart nvidia-fabricmanager")
    return ("nvidia-smi failed (exit %s)" % rc,
            "run nvidia-smi on the node by hand and read its message; check dmesg for Xid errors")


def gpu_map(gpus, visible_devices=None):
    """The local-rank -> GPU map that torchrun uses with CUDA_DEVICE_ORDER=PCI_BUS_ID.

    CUDA numbers GPUs in PCI bus order; with CUDA_VISIBLE_DEVICES (indexes in that order or GPU UUIDs)
    only the listed GPUs remain, in the listed order, and local rank i takes the i-th of them.
    Returns [{local_rank, index, pci_bus_id, uuid}]. Raises ValueError for an entry that names no GPU.
    """
    ordered = sorted(gpus or [], key=lambda g: pci_sort_key(g["pci_bus_id"]))
    if visible_devices in (None, "") or (isinstance(visible_devices, (list, tuple)) and not visible_devices):
        chosen = ordered
    else:
        entries = visible_devices
        if not isinstance(entries, (list, tuple)):
            entries = str(entries).split(",")
        chosen = []
        for entry in entries:
            entry = str(entry).strip()
            if entry.isdigit():
                pos = int(entry)
                if pos >= len(ordered):
                    raise ValueError("CUDA_VISIBLE_DEVICES entry %s: only %d GPUs (0..%d)"
                                     % (entry, len(ordered), len(ordered) - 1))
                chosen.append(ordered[pos])
            else:
                match = [g for g in ordered if g["uuid"] == entry or g["uuid"].startswith(entry)]
                if len(match) != 1:
                    raise ValueError("CUDA_VISIBLE_DEVICES entry %r names %s GPU" % (entry, len(match) or "no"))
                chosen.append(match[0])
    return [{"local_rank": rank, "index": g["index"], "pci_bus_id": g["pci_bus_id"], "uuid": g["uuid"]}
            for rank, g in enumerate(chosen)]


def duplicates(values):
    """Values that occur more than once, in first-seen order."""
    seen, dup = set(), []
    for v in values:
        if v in seen and v not in dup:
            dup.append(v)
        seen.add(v)
    return dup


def version_drift(versions):
    """{host: version} -> {majority, odd: {host: version}, missing: [hosts]}.

    The majority is the most common version (ties: the one seen first in host order); hosts without a
    version are listed in ``missing``, not in ``odd``.
    """
    counts = {}
    order = []
    missing = []
    for host, version in versions.items():
        if version in (None, ""):
            missing.append(host)
            continue
        if version not in counts:
            order.append(version)
        counts[version] = counts.get(version, 0) + 1
    majority = None
    for version in order:
        if majority is None or counts[version] > counts[majority]:
            majority = version
    odd = dict((h, v) for h, v in versions.items() if v not in (None, "") and v != majority)
    return {"majority": majority, "odd": odd, "missing": missing}


def used_gpus(gpus, visible=None):
    """The GPUs a node's ranks use: those its visible devices name (by index or UUID), else all of them.
    A visible list that names no GPU leaves the list whole (the gpu_map check reports that)."""
    gpus = gpus or []
    if not visible:
        return gpus
    try:
        keep = set(m["uuid"] for m in gpu_map(gpus, visible))
    except ValueError:
        return gpus
    return [g for g in gpus if g.get("uuid") in keep]


def cross_node_uuid_duplicates(gpus_by_host):
    """{host: [gpu, ...]} -> [{uuid, hosts: [..]}] for UUIDs seen on more than one node (cloned images,
    a node that reports another node's GPUs)."""
    where = {}
    for host, gpus in gpus_by_host.items():
        for g in gpus or []:
            hosts = where.setdefault(g.get("uuid"), [])
            if host not in hosts:
                hosts.append(host)
    return [{"uuid": u, "hosts": h} for u, h in where.items() if u and len(h) > 1]


# ----------------------------------------------------------------------------------------- checks
# The roles record these with preflight_check (records: [...]); each is {check, status, detail, fix, data}.

def _rec(check, status, detail, fix="", data=None):
    return {"check": check, "status": status, "detail": detail, "fix": fix if status != "pass" else "",
            "data": data or {}}


def _gpu_name(g):
    return "GPU %s (%s)" % (g.get("index"), g.get("pci_bus_id"))


def driver_records(host, facts, all_facts, opts):
    """Every nvidia_driver check of one node as preflight records.

    host: this node's inventory name; facts: its nvidia_gpu_facts, or None when nvidia-smi failed;
    all_facts: {host: nvidia_gpu_facts or None} for every node of the play (drift, UUIDs across nodes);
    opts: error (the module's message when it failed), version (the pin, '' for none), branch,
    gpus_per_node (None: not checked), nproc_per_node, visible_devices, device_order (the value of
    CUDA_DEVICE_ORDER configured on the node, None when absent), device_order_file.
    """
    recs = []
    order_file = opts.get("device_order_file") or "/etc/environment"
    order = opts.get("device_order")
    recs_order = _rec(
        "nvidia_driver.device_order", "pass" if order == "PCI_BUS_ID" else "fail",
        "CUDA_DEVICE_ORDER=%s in %s" % (order, order_file) if order is not None
        else "CUDA_DEVICE_ORDER is not set in %s" % order_file,
        "Set CUDA_DEVICE_ORDER=PCI_BUS_ID in %s (the nvidia_driver role does it; run site.yml): without it CUDA "
        "numbers GPUs fastest-first and local ranks may not match the PCI order torchrun assumes" % order_file)
    if facts is None and str(opts.get("gpus_per_node")) == "0":
        return [_rec("nvidia_driver." + name, "skip", "CPU-only cluster (cluster_gpus_per_node: 0): no GPU checks")
                for name in ("smi", "version", "drift", "gpu_count", "pci_unique", "uuid_unique", "gpu_map", "mig",
                             "device_order")]
    if facts is None:
        error = opts.get("error") or "nvidia-smi did not answer"
        recs.append(_rec("nvidia_driver.smi", "fail", error,
                         "Fix the driver on %s (see the cause above), then rerun preflight" % host))
        skip = "not checked: nvidia-smi failed on this node (see nvidia_driver.smi)"
        for name in ("version", "drift", "gpu_count", "pci_unique", "uuid_unique", "gpu_map", "mig"):
            recs.append(_rec("nvidia_driver." + name, "skip", skip))
        recs.append(recs_order)
        return recs

    driver = facts.get("driver_version")
    gpus = facts.get("gpus") or []
    kmod = facts.get("kernel_module_version")
    recs.append(_rec("nvidia_driver.smi", "pass",
                     "driver %s, CUDA %s, %d GPU(s) %s" % (driver, facts.get("cuda_version"), len(gpus),
                                                          ", ".join(sorted(set(g.get("name") or "?" for g in gpus)))),
                     data={"drift": {"driver": driver, "cuda": facts.get("cuda_version")}}))

    # The pin (exact version, else the branch) and the loaded kernel module.
    pin, branch = (opts.get("version") or ""), str(opts.get("branch") or "")
    problems = []
    if pin and driver != pin:
        problems.append("driver %s, pinned %s (nvidia_driver_version)" % (driver, pin))
    elif not pin and branch and not str(driver).startswith(branch + "."):
        problems.append("driver %s is not from branch %s (nvidia_driver_branch)" % (driver, branch))
    if kmod and kmod != driver:
        problems.append("loaded kernel module %s differs from the user-space driver %s (upgraded without reboot)"
                        % (kmod, driver))
    recs.append(_rec(
        "nvidia_driver.version", "fail" if problems else "pass",
        "; ".join(problems) if problems else "driver %s%s" % (driver, " = pin" if pin else " (branch %s, no exact pin)"
                                                               % branch if branch else ""),
        "Install driver %s on %s (nvidia_driver_install: true, or re-image the node) and reboot it; or change "
        "nvidia_driver_version" % (pin or branch, host) if not (kmod and kmod != driver)
        else "Reboot %s so the installed driver's kernel module is loaded" % host))

    # Drift across the cluster.
    versions = dict((h, (f or {}).get("driver_version")) for h, f in all_facts.items())
    drift = version_drift(versions)
    majority, odd = drift["majority"], drift["odd"]
    others = [h for h, v in versions.items() if v == majority and h != host]
    if host in odd:
        detail = "driver %s on %s; %d other node(s) run %s (%s)" % (
            driver, host, len(others), majority, ", ".join(others[:8]) + (" ..." if len(others) > 8 else ""))
        recs.append(_rec("nvidia_driver.drift", "fail", detail,
                         "Make every node run the same driver: install %s on %s (nvidia_driver_version pins it) "
                         "and reboot it, or replace the node" % (majority, host),
                         data={"majority": majority, "odd": odd}))
    else:
        detail = "driver %s on all %d node(s)" % (driver, len(versions) - len(drift["missing"]))
        if odd:
            detail = "driver %s here; differs on %s" % (driver, ", ".join("%s (%s)" % kv for kv in sorted(odd.items())))
        recs.append(_rec("nvidia_driver.drift", "pass", detail, data={"majority": majority, "odd": odd}))

    # GPU count.
    want = opts.get("gpus_per_node")
    if want in (None, ""):
        recs.append(_rec("nvidia_driver.gpu_count", "skip", "%d GPU(s); cluster_gpus_per_node is not set" % len(gpus)))
    else:
        want = int(want)
        recs.append(_rec(
            "nvidia_driver.gpu_count", "pass" if len(gpus) == want else "fail",
            "%d GPU(s), cluster_gpus_per_node %d%s" % (
                len(gpus), want, "" if facts.get("attached_gpus") in (None, len(gpus))
                else " (nvidia-smi counts %s attached)" % facts.get("attached_gpus")),
            "A GPU is missing on %s: look for Xid 79 ('fallen off the bus') in dmesg, reset or reboot the node, "
            "replace it if the GPU stays missing; or set cluster_gpus_per_node to %d" % (host, len(gpus))
            if len(gpus) < want else
            "%s has more GPUs than cluster_gpus_per_node: set it to %d, or hide GPUs with "
            "nvidia_driver_visible_devices" % (host, len(gpus))))

    # PCI bus ids unique within the node.
    dup_pci = duplicates([g.get("pci_bus_id_normalized") or g.get("pci_bus_id") for g in gpus])
    recs.append(_rec(
        "nvidia_driver.pci_unique", "fail" if dup_pci else "pass",
        "PCI bus id %s reported for %s" % (
            ", ".join(dup_pci), "; ".join(
                "GPUs " + ", ".join(str(g["index"]) for g in gpus
                                    if (g.get("pci_bus_id_normalized") or g.get("pci_bus_id")) == p)
                for p in dup_pci)) if dup_pci else "%d distinct PCI bus ids" % len(gpus),
        "Two GPUs of %s claim one PCI address: the GPU order (and the local-rank map) cannot be trusted. "
        "Reboot the node; if it persists, the node is sick: replace it" % host))

    # UUIDs unique across the cluster (and within the node): what must never happen is two nodes' ranks on one
    # GPU, so each node counts the GPUs it uses (its visible devices when it sets them, else all of them).
    visible_by_host = opts.get("visible_by_host") or {}
    cross = [d for d in cross_node_uuid_duplicates(dict((h, used_gpus((f or {}).get("gpus"), visible_by_host.get(h)))
                                                        for h, f in all_facts.items()))
             if host in d["hosts"]]
    local = duplicates([g.get("uuid") for g in gpus])
    if cross and not local and str(opts.get("shared_gpus_ok")).lower() in ("true", "1"):
        recs.append(_rec("nvidia_driver.uuid_unique", "warn", "GPU shared by inventory nodes (allowed by "
                         "nvidia_driver_allow_shared_gpus): " + "; ".join(
                             "%s on %s" % (d["uuid"], ", ".join(d["hosts"])) for d in cross),
                         "Set nvidia_driver_allow_shared_gpus: false on a real cluster"))
    elif cross or local:
        parts = ["%s on %s" % (d["uuid"], ", ".join(d["hosts"])) for d in cross]
        parts += ["%s twice on %s" % (u, host) for u in local]
        recs.append(_rec("nvidia_driver.uuid_unique", "fail", "GPU UUID seen more than once: " + "; ".join(parts),
                         "Each GPU has its own UUID: two inventory entries may point at the same machine "
                         "(check ansible_host of %s), or the node reports another node's GPUs; fix the inventory "
                         "or replace the node" % ", ".join(sorted(set(h for d in cross for h in d["hosts"])) or [host])))
    else:
        mine = used_gpus(gpus, visible_by_host.get(host))
        recs.append(_rec("nvidia_driver.uuid_unique", "pass",
                         "%d GPU UUIDs, none seen on another node" % len(gpus) if len(mine) == len(gpus) else
                         "%d GPU UUIDs, the %d in use (visible devices %s) used by no other node"
                         % (len(gpus), len(mine), visible_by_host.get(host))))

    # The local-rank -> GPU map torchrun will use.
    visible = opts.get("visible_devices")
    nproc = opts.get("nproc_per_node")
    try:
        gmap = gpu_map(gpus, visible)
        err = None
    except ValueError as exc:
        gmap, err = [], str(exc)
    if err:
        recs.append(_rec("nvidia_driver.gpu_map", "fail", "nvidia_driver_visible_devices %r: %s" % (visible, err),
                         "Fix nvidia_driver_visible_devices of %s: GPU indexes in PCI order or GPU UUIDs" % host))
    else:
        gpu_ranks = opts.get("gpu_ranks", True)
        short = gpu_ranks and nproc not in (None, "") and int(nproc) > len(gmap) and len(gmap) > 0
        mapped = set(m["index"] for m in gmap)
        in_mig = [(g, words) for g, words in mig_problems(gpus) if g.get("index") in mapped]
        if short:
            detail = "%s local ranks but %d visible GPU(s): two ranks would share a GPU" % (nproc, len(gmap))
            fix = "Lower cluster_nproc_per_node to %d or make more GPUs visible on %s" % (len(gmap), host)
        elif in_mig:
            detail = "the map assigns whole GPUs, but %s %s in MIG mode: CUDA would see MIG devices, not these GPUs" % (
                ", ".join(_gpu_name(g) for g, _ in in_mig), "is" if len(in_mig) == 1 else "are")
            fix = "Turn MIG off on %s (see nvidia_driver.mig)" % host
        else:
            detail = ", ".join("rank %d -> GPU %s (%s)" % (m["local_rank"], m["index"], m["pci_bus_id"])
                               for m in gmap) or "no GPUs"
            fix = ""
        recs.append(_rec("nvidia_driver.gpu_map", "fail" if short or in_mig else "pass", detail, fix,
                         data={"gpu_map": gmap, "visible_devices": visible or None}))

    # MIG: trainyard maps local ranks to whole GPUs only; a GPU in MIG mode would silently break that map.
    mig = mig_problems(gpus)
    if mig:
        recs.append(_rec(
            "nvidia_driver.mig", "fail", "; ".join("%s: %s" % (_gpu_name(g), words) for g, words in mig),
            "Turn MIG off on %s: %s (as root; then reset the GPU or reboot). trainyard maps ranks to whole GPUs "
            "and does not place ranks on MIG devices" % (
                host, "; ".join("nvidia-smi -i %s -mig 0" % g.get("index") for g, _ in mig)),
            data={"gpus": [g.get("index") for g, _ in mig]}))
    else:
        supported = [g for g in gpus if g.get("mig_mode") not in (None, "N/A")]
        recs.append(_rec("nvidia_driver.mig", "pass",
                         "MIG disabled on all %d GPU(s)" % len(gpus) if supported else
                         "MIG not supported by these GPUs" if gpus else "no GPUs"))
    recs.append(recs_order)
    return recs


def fabric_problems(gpus):
    """GPUs whose fabric is not Completed/Success -> ['GPU 2 (00000000:00:08.0): state Completed, status Failure']."""
    return ["%s: state %s, status %s" % (_gpu_name(g), (g.get("fabric") or {}).get("state"),
                                          (g.get("fabric") or {}).get("status"))
            for g in gpus or [] if not fabric_ok(g)]


def fabricmanager_records(host, facts, opts):
    """Every fabricmanager check of one node as preflight records.

    facts: nvidia_gpu_facts or None; opts: service_manager (e.g. systemd, None), service (the systemd unit's
    {state, status} or None when the unit does not exist), service_name, required ('auto' | 'always' | 'never').
    """
    service_name = opts.get("service_name") or "nvidia-fabricmanager"
    restart = ("systemctl restart %s on %s and wait until every GPU shows fabric state Completed; if it will not "
               "start (journalctl -u %s), the node is sick: replace it" % (service_name, host, service_name))
    names = ("nvswitch", "version", "service", "fabric", "nvlink")
    if facts is None:
        return [_rec("fabricmanager." + n, "skip", "not checked: nvidia-smi failed on this node (see nvidia_driver.smi)")
                for n in names]
    nvs = facts.get("nvswitch") or {}
    required = opts.get("required") or "auto"
    gpus = facts.get("gpus") or []
    if required == "never" or (required == "auto" and not nvs.get("present")):
        why = ("fabricmanager_required is never" if required == "never"
               else "no NVSwitch on this node (no /proc/driver/nvidia-nvswitch devices, fabric state N/A): "
                    "fabric manager not needed")
        return [_rec("fabricmanager." + n, "skip", why) for n in names]

    recs = []
    local = bool(nvs.get("local"))
    devices = nvs.get("devices") or []
    recs.append(_rec("fabricmanager.nvswitch", "pass",
                     "%d NVSwitch(es) on this node" % len(devices) if local else
                     "NVSwitch fabric seen in the GPUs' fabric state, no NVSwitch device on this node "
                     "(a VM whose NVSwitches the host manages)" if nvs.get("present") else
                     "no NVSwitch seen; fabric manager required by fabricmanager_required: always"))

    driver = facts.get("driver_version")
    fm = facts.get("fabricmanager_version")
    managed_here = local or fm is not None or required == "always"
    if fm is None and managed_here:
        recs.append(_rec("fabricmanager.version", "fail",
                         "nvidia-fabricmanager is not installed; driver %s" % driver,
                         "Install nvidia-fabricmanager-%s=%s on %s and hold it (fabricmanager_install: true)"
                         % (str(driver).split(".")[0], driver, host)))
    elif fm is None:
        recs.append(_rec("fabricmanager.version", "skip",
                         "no fabric manager on this node: the fabric is managed outside it (VM/host-managed NVSwitch)"))
    else:
        recs.append(_rec("fabricmanager.version", "pass" if fm == driver else "fail",
                         "fabric manager %s, driver %s%s" % (fm, driver, "" if fm == driver else
                                                             ": they must be the same version"),
                         "Install nvidia-fabricmanager at exactly the driver's version %s on %s, hold it, restart "
                         "it (fabricmanager_install: true does it); a mismatch hangs NCCL init or fails with CUDA "
                         "error 802" % (driver, host),
                         data={"drift": {"fabricmanager": fm}}))

    manager = opts.get("service_manager")
    service = opts.get("service")
    if not managed_here or fm is None and not local:
        recs.append(_rec("fabricmanager.service", "skip", "no fabric manager service on this node"))
    elif manager != "systemd":
        recs.append(_rec("fabricmanager.service", "skip",
                         "not verifiable: the node's service manager is %s, not systemd" % (manager or "unknown")))
    elif not service:
        recs.append(_rec("fabricmanager.service", "fail", "%s.service does not exist" % service_name,
                         "Install nvidia-fabricmanager (fabricmanager_install: true), then " + restart))
    else:
        running = service.get("state") == "running"
        enabled = service.get("status") in ("enabled", "static", "alias")
        recs.append(_rec("fabricmanager.service", "pass" if running and enabled else "fail",
                         "%s: %s, %s" % (service_name, service.get("state"), service.get("status")),
                         ("systemctl enable %s; " % service_name if not enabled else "") + restart))

    bad = fabric_problems(gpus)
    recs.append(_rec("fabricmanager.fabric", "fail" if bad else "pass",
                     "; ".join(bad) if bad else "%d GPU(s): fabric Completed/Success" % len(gpus),
                     restart if managed_here else
                     "The fabric is managed outside this node (VM): ask the provider to restart the fabric "
                     "manager of the host; if it stays, the node is sick: replace it",
                     data={"fabric": dict((str(g.get("index")), "%s/%s" % ((g.get("fabric") or {}).get("state"),
                                                                             (g.get("fabric") or {}).get("status")))
                                          for g in gpus)}))

    with_links = [g for g in gpus if (g.get("nvlink") or {}).get("links")]
    if not with_links:
        recs.append(_rec("fabricmanager.nvlink", "skip", "no NVLink status (nvidia-smi nvlink -s listed no links)"))
    else:
        down = [g for g in with_links if g["nvlink"].get("inactive")]
        recs.append(_rec(
            "fabricmanager.nvlink", "fail" if down else "pass",
            "; ".join("%s: %d of %d NVLinks inactive" % (_gpu_name(g), g["nvlink"]["inactive"], g["nvlink"]["links"])
                      for g in down) if down else
            "%d GPU(s), all %d NVLinks active" % (len(with_links), sum(g["nvlink"]["links"] for g in with_links)),
            "Inactive NVLinks on %s: reset the GPUs or reboot the node, then %s" % (host, restart)))
    return recs
