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


def parse_query_xml(text):
    """``nvidia-smi -q -x`` -> {driver_version, cuda_version, attached_gpus, gpus: [...]}.

    Each GPU: index (its position, which is nvidia-smi's index), uuid, pci_bus_id (as printed),
    pci_bus_id_normalized, name, memory_total_mib, persistence_mode, mig_mode, minor_number, module_id,
    fabric {state, status, clique_id, cluster_uuid}. Raises NvidiaSmiParseError naming what is wrong.
    """
    if not text or not text.strip():
        raise NvidiaSmiParseError("nvidia-smi -q -x printed nothing")
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
            "memory_total_mib": _mib(_text(g, "fb_memory_usage/total")),
            "persistence_mode": _text(g, "persistence_mode"),
            "mig_mode": _text(g, "mig_mode/current_mig"),
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
        if parts[0].endswith("-dev"):
            continue
        if len(parts) >= 3 and parts[2][:2] not in ("ii", "hi"):
            continue
        version = parts[1].split(":", 1)[-1].split("-", 1)[0]
        if _VERSION.fullmatch(version):
            return parts[0], version
    return None, None


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
