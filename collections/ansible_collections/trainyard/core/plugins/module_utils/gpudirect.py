# -*- coding: utf-8 -*-
"""The quick burn-in tier's GPUDirect checks (docs/burn-in.md): NVLink error counters, InfiniBand/RoCE ports, the
GPUDirect RDMA module, and the IOMMU/ACS settings that break GPUDirect peer-to-peer and RDMA.

Pure parsing and verdicts (standard library only), used by the module nvidia_gpu_facts (with gpudirect) on the node;
unit tests on the formats these sources document or print (tests/unit/test_gpudirect.py):
  * ``nvidia-smi nvlink -e``: ``GPU 0: <name> (UUID: ...)`` then ``Link 0: Replay Errors: 0`` lines (the capture in
    stas00/ml-engineering, network/README.md, "How to check NVLink link error counters", an H100 80GB HBM3 node).
  * /sys/class/infiniband/<dev>/ports/<n>/{state, rate, link_layer, gids/0}: the kernel's
    Documentation/ABI/stable/sysfs-class-infiniband (``4: ACTIVE``, ``200 Gb/sec (4X HDR)``, ``InfiniBand`` or
    ``Ethernet``, a GID of all zeros where none is set); ibstat (rdma-core) prints the same values.
  * /proc/modules (``nvidia_peermem``: NVIDIA's GPUDirect RDMA module, docs.nvidia.com/cuda/gpudirect-rdma).
  * /proc/cmdline (``iommu=pt``, ``intel_iommu=on``, ``amd_iommu=``) and the count of /sys/kernel/iommu_groups; the
    ``ACSCtl:`` lines of ``lspci -vvv`` (NCCL's troubleshooting guide, "PCI Access Control Services (ACS)": ACS on a
    PCIe switch redirects peer-to-peer traffic through the root complex: hangs or low bandwidth; disable it on bare
    metal; an IOMMU in translation mode does the same to GPUDirect: iommu=pt).
"""

from __future__ import annotations

import re

_NVLINK_GPU = re.compile(r"^GPU (\d+):")
_NVLINK_ERR = re.compile(r"^\s*Link (\d+): ([A-Za-z ]+? Errors): (\d+)")
_ACS = re.compile(r"ACSCtl:\s*(.*)$")


def _rec(check, status, detail, fix="", data=None):
    return {"check": check, "status": status, "detail": detail, "fix": fix if status != "pass" else "",
            "data": data or {}}


# ----------------------------------------------------------------------------------------- NVLink error counters

def parse_nvlink_errors(text):
    """``nvidia-smi nvlink -e`` -> {gpu index: {link: {counter name: n}}}."""
    out, gpu = {}, None
    for line in (text or "").splitlines():
        m = _NVLINK_GPU.match(line)
        if m:
            gpu = out.setdefault(int(m.group(1)), {})
            continue
        m = _NVLINK_ERR.match(line)
        if m and gpu is not None:
            gpu.setdefault(int(m.group(1)), {})[m.group(2)] = int(m.group(3))
    return out


def nvlink_errors_record(host, errors, why_none=""):
    """nvidia_driver.nvlink_errors: a recovery error (the link retrained) fails; replay and CRC errors warn (the
    link resends; counters count since the driver loaded); skip without NVLink counters."""
    if not errors or not any(errors.values()):
        return _rec("nvidia_driver.nvlink_errors", "skip", why_none or "no NVLink error counters on %s (nvidia-smi "
                    "nvlink -e lists no link: PCIe GPUs, or no NVLink)" % host)
    fails, warns = [], []
    for gpu, links in sorted(errors.items()):
        for link, counters in sorted(links.items()):
            bad = {k: v for k, v in counters.items() if v}
            if not bad:
                continue
            line = "%s GPU %s link %s: %s" % (host, gpu, link, ", ".join("%s %d" % kv for kv in sorted(bad.items())))
            (fails if bad.get("Recovery Errors") else warns).append(line)
    nlinks = sum(len(v) for v in errors.values())
    fix = ("%s: reset the counters (nvidia-smi nvlink -ec), run the NCCL check, and read them again: counters that "
           "grow mean a bad link; reset the GPU or reboot, and if they keep growing on the same link, replace the "
           "node (RMA)" % host)
    if fails:
        return _rec("nvidia_driver.nvlink_errors", "fail", "; ".join(fails + warns), fix)
    if warns:
        return _rec("nvidia_driver.nvlink_errors", "warn", "; ".join(warns), fix)
    return _rec("nvidia_driver.nvlink_errors", "pass", "%d GPU(s), %d NVLinks: no replay, recovery or CRC error"
                % (len(errors), nlinks))


# ----------------------------------------------------------------------------------------- InfiniBand / RoCE

def parse_rate_gbps(text):
    """'200 Gb/sec (4X HDR)' -> 200.0; None when not a rate."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec", text or "")
    return float(m.group(1)) if m else None


def port_facts(dev, port, files):
    """One port from its sysfs files ({state, rate, link_layer, gid0}: the files' text or None)."""
    state = (files.get("state") or "").strip()
    gid = (files.get("gid0") or "").strip()
    return {"device": dev, "port": port, "state": state.split(":", 1)[-1].strip() if state else None,
            "rate_gbps": parse_rate_gbps(files.get("rate")), "rate": (files.get("rate") or "").strip() or None,
            "link_layer": (files.get("link_layer") or "").strip() or None,
            "gid": bool(gid) and set(gid.replace(":", "")) != {"0"}}


def ib_ports_record(host, ports):
    """nvidia_driver.ib_ports: every RDMA port Active with a GID, and the active ports at one rate; skip without
    an RDMA device (/sys/class/infiniband empty or absent)."""
    if not ports:
        return _rec("nvidia_driver.ib_ports", "skip", "no InfiniBand/RoCE device on %s (/sys/class/infiniband is "
                    "empty or absent): inter-node traffic goes over TCP sockets" % host)
    name = lambda p: "%s port %s (%s)" % (p["device"], p["port"], p.get("link_layer") or "?")  # noqa: E731
    active = [p for p in ports if p.get("state") == "ACTIVE"]
    down = [p for p in ports if p.get("state") != "ACTIVE"]
    nogid = [p for p in active if not p.get("gid")]
    rates = sorted({p["rate_gbps"] for p in active if p.get("rate_gbps")})
    data = {"ports": ports}
    fix = ("%s: check the cable and the switch port (ibstat, ibstatus; for RoCE ip link and the NIC's IP address, "
           "which sets its GID), then rerun; a port left out on purpose can be ignored" % host)
    if not active:
        return _rec("nvidia_driver.ib_ports", "fail", "no RDMA port Active: %s" % "; ".join(
            "%s %s" % (name(p), p.get("state") or "no state") for p in ports), fix, data)
    problems = ["%s is %s" % (name(p), p.get("state") or "without a state") for p in down]
    problems += ["%s has no GID (gids/0 all zeros: RoCE needs an IP address on the port's interface)" % name(p)
                 for p in nogid]
    if len(rates) > 1:
        problems.append("active ports at different rates: %s" % ", ".join(
            "%s %s" % (name(p), p.get("rate")) for p in active))
    if problems:
        return _rec("nvidia_driver.ib_ports", "fail" if nogid else "warn", "; ".join(problems), fix, data)
    return _rec("nvidia_driver.ib_ports", "pass", "%d RDMA port(s) Active at %s Gb/s, GID set (%s)" % (
        len(active), "/".join("%g" % r for r in rates) or "?", ", ".join(sorted({p.get("link_layer") or "?"
                                                                                 for p in active}))), data=data)


def peermem_record(host, modules_text, has_rdma, has_gpu):
    """nvidia_driver.peermem: nvidia_peermem loaded where the node has GPUs and an RDMA NIC (else NCCL moves GPU
    data through host memory: GPUDirect RDMA off); skip where either is missing."""
    if not has_gpu or not has_rdma:
        return _rec("nvidia_driver.peermem", "skip", "GPUDirect RDMA does not apply on %s: %s" % (
            host, "no GPU" if not has_gpu else "no InfiniBand/RoCE device"))
    if modules_text is None:
        return _rec("nvidia_driver.peermem", "skip", "/proc/modules not readable on %s" % host)
    loaded = any(line.split(" ", 1)[0] == "nvidia_peermem" for line in modules_text.splitlines())
    return _rec("nvidia_driver.peermem", "pass" if loaded else "warn",
                "nvidia_peermem loaded: GPUDirect RDMA available" if loaded else
                "nvidia_peermem is not loaded: NCCL sends GPU buffers through host memory unless the kernel and "
                "driver support DMA-BUF (NCCL_DMABUF_ENABLE)",
                "%s: modprobe nvidia_peermem (and list it in /etc/modules-load.d/ to keep it after a reboot)" % host)


# ----------------------------------------------------------------------------------------- IOMMU and ACS

def iommu_record(host, cmdline, iommu_groups, lspci_text):
    """nvidia_driver.iommu: ACS enabled on a PCIe bridge (ACSCtl SrcValid+) fails; an IOMMU in translation mode
    (IOMMU groups present, no iommu=pt on the kernel command line) warns; skip where neither can be read."""
    acs_on = []
    if lspci_text:
        device = None
        for line in lspci_text.splitlines():
            if line and not line[0].isspace():
                device = line.split(" ", 1)[0]
            m = _ACS.search(line)
            if m and "SrcValid+" in m.group(1):
                acs_on.append(device)
    args = (cmdline or "").split()
    passthrough = "iommu=pt" in args or "iommu=off" in args or "intel_iommu=off" in args or "amd_iommu=off" in args
    problems, data = [], {"acs_enabled": acs_on, "iommu_groups": iommu_groups, "iommu_pt": passthrough}
    if acs_on:
        problems.append("ACS enabled (ACSCtl SrcValid+) on %d PCIe device(s): %s" % (
            len(acs_on), ", ".join(acs_on[:6]) + (" ..." if len(acs_on) > 6 else "")))
    translating = bool(iommu_groups) and not passthrough
    if translating:
        problems.append("the IOMMU translates DMA (%d IOMMU groups, no iommu=pt on the kernel command line)"
                        % iommu_groups)
    fix = ("%s: on bare metal disable ACS on the PCIe switches (BIOS, or setpci per NCCL's troubleshooting guide) "
           "and boot with iommu=pt; in a VM the host decides: ask the provider" % host)
    if acs_on:
        return _rec("nvidia_driver.iommu", "fail", "; ".join(problems), fix, data)
    if translating:
        return _rec("nvidia_driver.iommu", "warn", "; ".join(problems), fix, data)
    iommu = ("IOMMU in passthrough (iommu=pt)" if passthrough and iommu_groups else
             "no IOMMU groups (IOMMU off)" if iommu_groups == 0 else "/sys/kernel/iommu_groups not readable")
    if lspci_text is None:  # the failing half (ACS) cannot be read: not a pass
        return _rec("nvidia_driver.iommu", "skip", "ACS not read on %s (lspci -vvv not installed or failed); %s"
                    % (host, iommu), data=data)
    return _rec("nvidia_driver.iommu", "pass", "no PCIe device with ACS enabled; %s" % iommu, data=data)


def records(host, read, has_gpu):
    """The four quick-tier GPUDirect records from nvidia_gpu_facts' gpudirect read ({nvlink_errors, nvlink_error,
    ib_ports, modules, cmdline, iommu_groups, lspci})."""
    read = read or {}
    ports = read.get("ib_ports") or []
    return [nvlink_errors_record(host, read.get("nvlink_errors") or {}, read.get("nvlink_error") or ""),
            ib_ports_record(host, ports),
            peermem_record(host, read.get("modules"), bool(ports), has_gpu),
            iommu_record(host, read.get("cmdline"), read.get("iommu_groups"), read.get("lspci"))]


# ----------------------------------------------------------------------------------------- reading on the node

def _read(path, limit=4096):
    try:
        with open(path) as f:
            return f.read(limit)
    except (IOError, OSError, UnicodeDecodeError):
        return None


def read_ib_ports(root="/"):
    """Every port of every device under <root>/sys/class/infiniband, as port_facts."""
    import os

    base = os.path.join(root, "sys/class/infiniband")
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for dev in devices:
        pdir = os.path.join(base, dev, "ports")
        try:
            ports = sorted(os.listdir(pdir), key=lambda p: int(p) if p.isdigit() else 0)
        except OSError:
            continue
        for port in ports:
            d = os.path.join(pdir, port)
            out.append(port_facts(dev, port, {"state": _read(os.path.join(d, "state")),
                                              "rate": _read(os.path.join(d, "rate")),
                                              "link_layer": _read(os.path.join(d, "link_layer")),
                                              "gid0": _read(os.path.join(d, "gids/0"))}))
    return out


def read_node(root="/", run=None, smi=None, lspci=None):
    """What records() reads, from the node: `run(argv) -> (rc, out, err)` runs nvidia-smi nvlink -e and lspci -vvv
    (each only when given)."""
    import os

    out = {"ib_ports": read_ib_ports(root), "modules": _read(os.path.join(root, "proc/modules"), 1 << 20),
           "cmdline": _read(os.path.join(root, "proc/cmdline")), "nvlink_errors": {}, "nvlink_error": "",
           "lspci": None}
    try:
        out["iommu_groups"] = len(os.listdir(os.path.join(root, "sys/kernel/iommu_groups")))
    except OSError:
        out["iommu_groups"] = None
    if smi and run:
        rc, text, err = run([smi, "nvlink", "-e"])
        if rc == 0:
            out["nvlink_errors"] = parse_nvlink_errors(text)
        else:
            out["nvlink_error"] = "nvidia-smi nvlink -e failed: %s" % ((err or text or "").strip().splitlines()
                                                                      or ["exit %s" % rc])[0][:200]
    if lspci and run:
        rc, text, err = run([lspci, "-vvv"])
        out["lspci"] = text if rc == 0 else None
    return out
