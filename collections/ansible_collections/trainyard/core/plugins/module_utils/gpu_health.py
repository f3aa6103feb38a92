# -*- coding: utf-8 -*-
"""GPU health from the kernel log and `nvidia-smi -q -x`: Xid events, ECC / row-remap state, clock slowdowns.

Pure functions (standard library only), shared by the module `nvidia_gpu_facts` (with health) on the nodes, the
nvidia_driver role's filters (preflight) and the collect playbook's analysis on the controller. Unit tests:
tests/unit/module_utils/test_gpu_health.py (real kernel log lines and the real H200 capture, tests/data/kernel-log/).

Every record names the node, the GPU, the ranks on it and the fix.

Sources of the Xid table (meaning and the action NVIDIA recommends):
  * NVIDIA, "Xid Errors" and its catalog (Resolution Bucket columns):
    https://docs.nvidia.com/deploy/xid-errors/index.html,
    https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
  * NVIDIA, "GPU Debug Guidelines" (Xid messages, what to do per code):
    https://docs.nvidia.com/deploy/gpu-debug-guidelines/index.html
  * NVIDIA, "GPU Memory Error Management" (row remapping: pending remaps need a GPU reset, a remapping failure
    means the GPU should be replaced): https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html
  * The message formats: NVIDIA/open-gpu-kernel-modules (the driver prints `NVRM: Xid (PCI:DDDD:BB:DD): N, ...`,
    e.g. its error-containment code for Xid 94/95), and real logs quoted in its issues (#1151: Xid 79).
"""

from __future__ import annotations

import datetime
import re
import xml.etree.ElementTree as ET

from ansible_collections.trainyard.core.plugins.module_utils.nvidia_smi import _text
from ansible_collections.trainyard.core.plugins.module_utils.torchrun import capped_lines

# ----------------------------------------------------------------------------------------- the Xid table
# code -> (what it means, severity, fix). Severity: "fail" (the GPU or node needs action before the job runs
# there again), "warn" (usually the application's own fault; a hardware fault only when it repeats on one GPU).

_RESET = "drain the node, reset the GPU (nvidia-smi -r -i <gpu> with no process on it) or reboot the node"
_RMA = "replace the GPU (RMA): contact the provider with the node's nvidia-bug-report.sh output"
_APP = ("usually the application's fault (an illegal address or an out-of-range access): rerun with "
        "CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer; if it repeats on this GPU only, across jobs, treat it as "
        "hardware and " + _RESET)

XID_TABLE = {
    8: ("GPU stopped processing (channel idle timeout)", "warn", "restart the job; if it repeats, " + _RESET),
    13: ("Graphics engine exception (an SM fault, e.g. an illegal instruction or out-of-range access)", "warn",
         _APP),
    31: ("GPU memory page fault (MMU fault: the application touched an invalid address)", "warn", _APP),
    32: ("Invalid or corrupted push buffer stream (a PCIe or driver fault)", "fail",
         "check the PCIe link (dmesg | grep -i AER), reseat the GPU; " + _RESET),
    38: ("Driver firmware error", "fail", _RESET + "; update the driver if it repeats"),
    43: ("GPU stopped processing: a user channel was reset after an application fault", "warn", _APP),
    45: ("Preemptive cleanup after an earlier error (the process was killed or another Xid came first)", "warn",
         "look for the Xid logged before it on the same GPU; alone it only says a process was stopped"),
    46: ("GPU stopped processing (the GPU did not respond)", "fail", _RESET),
    48: ("Double-bit (uncorrectable) ECC error in GPU memory", "fail",
         _RESET + " (the reset remaps the row); if nvidia-smi -q shows a remapping failure, " + _RMA),
    56: ("Display engine error", "warn", "ignore on compute nodes unless it repeats"),
    61: ("Internal micro-controller breakpoint or warning (GSP/PMU)", "fail", _RESET),
    62: ("Internal micro-controller halted (GSP/PMU)", "fail", _RESET),
    63: ("Row remapping / page retirement recorded: a memory row is marked and a GPU reset activates the remap",
         "warn", "at the next stop: " + _RESET + " to activate the remap; nvidia-smi -q shows Pending: Yes until then"),
    64: ("Row remapping / page retirement failed to record", "fail", _RMA),
    68: ("Video decoder exception", "warn", "ignore unless the job decodes video on the GPU"),
    69: ("Graphics engine class error", "warn", _APP),
    73: ("NVLink or NVSwitch error (recoverable)", "fail",
         _RESET + "; nvidia-smi nvlink -e shows the link's error counters"),
    74: ("NVLink error (a link between GPUs or to an NVSwitch failed)", "fail",
         _RESET + "; check nvidia-smi nvlink -s / -e and the fabric manager journal; if it repeats on the same "
         "link, " + _RMA),
    79: ("GPU has fallen off the bus (PCIe link lost; the GPU no longer answers)", "fail",
         "drain the node and power-cycle it (a reboot may not bring the GPU back); check PCIe seating, power and "
         "temperature; if it repeats, " + _RMA),
    92: ("High single-bit ECC error rate", "warn", "watch the ECC counters; plan a GPU reset or replacement"),
    94: ("Contained ECC error: the affected process was stopped, other processes may continue", "fail",
         "restart the job (the rank on this GPU died); " + _RESET + " at the next stop to remap the row"),
    95: ("Uncontained ECC error: every process on the GPU is affected", "fail",
         _RESET + " before any job uses it; if it repeats, " + _RMA),
    109: ("Context switch timeout", "warn", "restart the job; if it repeats on this GPU, " + _RESET),
    119: ("GSP RPC timeout: the GPU's system processor stopped answering the driver", "fail",
          _RESET + "; if it repeats, update the driver (a GSP firmware issue) or " + _RMA),
    120: ("GSP error (the GPU's system processor reported a fault)", "fail",
          _RESET + "; if it repeats, update the driver or " + _RMA),
    121: ("C2C link error (Grace Hopper chip-to-chip link)", "fail", _RESET),
    123: ("SPI PMU RPC write failure", "fail", _RESET),
    136: ("Fatal error reset: the GPU was reset by the driver after a fatal error", "fail", _RESET),
    140: ("Unrecovered ECC error in GPU memory", "fail", _RESET + "; if it repeats, " + _RMA),
    143: ("GPU initialization failure", "fail", _RESET + "; if it persists, " + _RMA),
    149: ("NVLink fabric error (NETIR)", "fail", _RESET + "; check the fabric manager journal"),
    154: ("GPU recovery action changed (the message says which: GPU Reset Required, Node Reboot Required, "
          "Drain and Reset)", "fail", "do what the message says: reset the GPU, or reboot the node"),
}
def xid_info(code):
    """(meaning, severity, fix) of an Xid code; unknown codes are failures that point to NVIDIA's catalog."""
    return XID_TABLE.get(int(code), (
        "Xid %s (not in trainyard's table)" % code, "fail",
        "look it up in NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)"
        "; until then " + _RESET))


# ----------------------------------------------------------------------------------------- the kernel log

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?"
                  r"(?: [^)]*)?\): (?P<code>\d+)(?P<rest>.*)$")
_PID = re.compile(r"\bpid=['\"]?(?P<pid>\d+)")
_NAME = re.compile(r"\bname=['\"]?(?P<name>[^,'\"\s]+)")
_OOM = re.compile(r"Out of memory: Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)|"
                  r"Memory cgroup out of memory: Killed process (?P<cpid>\d+) \((?P<cname>[^)]*)\)")
# "<comm>[<pid>]: segfault at": the "[pid]: segfault at" part by regex (it starts at a '['), the name before it
# by a backward scan (_segfault): a regex starting with [^\s\[]+ is retried from every character of a long word.
_SEGV = re.compile(r"\[(?P<pid>\d+)\]: segfault at")
_FALLEN = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?):? "
                     r"(?:GPU )?has fallen off the bus")
_ISO = re.compile(r"^(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:[,.](?P<frac>\d+))?(?P<tz>[+-]\d{2}:?\d{2}|Z)?\s")
_MONO = re.compile(r"^\[\s*(?P<mono>\d+\.\d+)\]\s")


def line_time(line, boot_epoch=None):
    """Epoch seconds of a kernel log line: ISO (dmesg --time-format iso, journalctl -o short-iso) or the
    monotonic `[secs]` prefix plus the boot time; None when the line says neither."""
    m = _ISO.match(line)
    if m:
        tz = m.group("tz") or "+00:00"
        if tz == "Z":
            tz = "+00:00"
        elif ":" not in tz:
            tz = tz[:3] + ":" + tz[3:]
        try:
            t = datetime.datetime.fromisoformat(m.group("ts") + tz)
        except ValueError:
            return None
        frac = float("0." + m.group("frac")) if m.group("frac") else 0.0
        return t.timestamp() + frac
    m = _MONO.match(line)
    if m and boot_epoch is not None:
        return float(boot_epoch) + float(m.group("mono"))
    return None


def pci_key(bus_id):
    """'0000:18:00' / '00000000:18:00.0' / '0000:18:00.0' -> '0000:18:00' (domain, bus, device; lower case)."""
    parts = (bus_id or "").strip().lower().split(":")
    if len(parts) < 3:
        return (bus_id or "").strip().lower()
    dev = parts[2].split(".")[0]
    try:
        return "%04x:%02x:%02x" % (int(parts[0], 16), int(parts[1], 16), int(dev, 16))
    except ValueError:
        return (bus_id or "").strip().lower()


def _at_literal(rx, line, literal):
    """rx matched at the first occurrence of the literal it starts with (one attempt: linear in the line)."""
    i = line.find(literal)
    return rx.match(line, i) if i >= 0 else None


def _segfault(line):
    """(name, pid) of the first '<name>[<pid>]: segfault at' in a line, or None."""
    for m in _SEGV.finditer(line):
        k = m.start()
        while k > 0 and not line[k - 1].isspace() and line[k - 1] != "[":
            k -= 1
        if k < m.start():
            return line[k:m.start()], int(m.group("pid"))
    return None


def parse_kernel_log(text, since=None, boot_epoch=None):
    """Kernel log text -> events, oldest first: {kind: xid|fallen|oom|segfault, time, line, ...}.

    kind xid: code, pci (DDDD:BB:DD), pid, name, message, meaning, severity, fix. Lines older than `since`
    (epoch) are dropped when their time is known; lines without a time are kept.
    """
    events = []
    for raw in capped_lines(text):
        line = raw.rstrip("\r")
        t = line_time(line, boot_epoch)
        if since is not None and t is not None and t < float(since):
            continue
        ev = None
        m = _at_literal(_XID, line, "NVRM: Xid (")
        if m:
            code = int(m.group("code"))
            rest = m.group("rest").lstrip(", ")
            meaning, severity, fix = xid_info(code)
            pid = _PID.search(rest)
            name = _NAME.search(rest)
            ev = {"kind": "xid", "code": code, "pci": pci_key(m.group("pci")),
                  "pid": int(pid.group("pid")) if pid else None, "name": name.group("name") if name else None,
                  "message": rest, "meaning": meaning, "severity": severity, "fix": fix}
        elif _at_literal(_OOM, line, "Out of memory: Killed process ") or \
                _at_literal(_OOM, line, "Memory cgroup out of memory: Killed process "):
            m = _at_literal(_OOM, line, "Out of memory: Killed process ") or \
                _at_literal(_OOM, line, "Memory cgroup out of memory: Killed process ")
            ev = {"kind": "oom", "pid": int(m.group("pid") or m.group("cpid")),
                  "name": m.group("name") or m.group("cname"), "severity": "fail",
                  "meaning": "the kernel's OOM killer killed a process (host memory exhausted)",
                  "fix": "lower the per-node memory use (data loader workers, pinned memory, CPU offload) or use "
                         "nodes with more RAM; the rank on this process died first"}
        elif "segfault at" in line and _segfault(line):
            name, pid = _segfault(line)
            ev = {"kind": "segfault", "pid": pid, "name": name, "severity": "fail",
                  "meaning": "a process crashed with a segmentation fault",
                  "fix": "read the rank's log tail for the native stack; a crash in a CUDA/NCCL library after an "
                         "Xid is the GPU's fault, otherwise check the image's library versions"}
        elif _at_literal(_FALLEN, line, "NVRM: GPU "):
            m = _at_literal(_FALLEN, line, "NVRM: GPU ")
            meaning, severity, fix = xid_info(79)
            ev = {"kind": "fallen", "code": 79, "pci": pci_key(m.group("pci")), "meaning": meaning,
                  "severity": severity, "fix": fix}
        if ev is not None:
            ev["time"] = t
            ev["line"] = line[:400]
            events.append(ev)
    return events


# ----------------------------------------------------------------------------------------- the XML

_NUM = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


def _t(elem, path):
    v = _text(elem, path)
    return v if v not in ("N/A", "[N/A]", "Not Supported") else None


def _n(elem, path):
    v = _t(elem, path)
    m = _NUM.match(v or "")
    return float(m.group(1)) if m else None


def _int(elem, path):
    v = _n(elem, path)
    return int(v) if v is not None else None


_THROTTLE_WARN = {  # XML tag suffix -> what it means (NVML clocks event reasons, nvidia-smi -q "Clocks Event Reasons")
    "hw_slowdown": "HW slowdown (the hardware halved the clocks: too hot, or the power supply asserted a brake)",
    "hw_thermal_slowdown": "HW thermal slowdown (the GPU is too hot)",
    "hw_power_brake_slowdown": "HW power brake (an external power brake, e.g. the PSU or the chassis)",
    "sw_thermal_slowdown": "SW thermal slowdown (the driver lowered the clocks to stay under its thermal target)",
}
_THROTTLE_FIX = ("check the node's cooling (fans, inlet temperature, airflow) and power supplies; nvidia-smi -q -d "
                 "PERFORMANCE,TEMPERATURE,POWER shows the reason and its counters; the BMC's event log names a PSU "
                 "or thermal event")


def _uncorrectable(scope):
    """Sum of the uncorrectable ECC counters of one scope (<volatile>/<aggregate>): DRAM and SRAM, new and old
    tag names (Hopper: dram_uncorrectable, sram_uncorrectable_parity/_secded; Ampere: sram_uncorrectable;
    older: double_bit/total)."""
    if scope is None:
        return None
    total, seen = 0, False
    for tag in ("dram_uncorrectable", "sram_uncorrectable", "sram_uncorrectable_parity",
                "sram_uncorrectable_secded", "double_bit/total"):
        v = _int(scope, tag)
        if v is not None:
            total += v
            seen = True
    return total if seen else None


def parse_health_xml(text):
    """`nvidia-smi -q -x` text -> list of per-GPU health dicts (index in document order = nvidia-smi index).

    Raises ValueError when the text is not nvidia-smi's XML.
    """
    try:
        root = ET.fromstring((text or "").strip())
    except ET.ParseError as e:
        raise ValueError("nvidia-smi -q -x output is not XML: %s" % e) from None
    if root.tag != "nvidia_smi_log":
        raise ValueError("nvidia-smi -q -x output has no <nvidia_smi_log> root (found <%s>)" % root.tag)
    out = []
    for i, g in enumerate(root.findall("gpu")):
        reasons = g.find("clocks_event_reasons")
        prefix = "clocks_event_reason_"
        if reasons is None:  # drivers before 535 call them throttle reasons
            reasons, prefix = g.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
        active = []
        if reasons is not None:
            for child in reasons:
                if (child.text or "").strip() == "Active" and child.tag.startswith(prefix):
                    active.append(child.tag[len(prefix):])
        retired = 0
        retired_seen = False
        for tag in ("retired_pages/multiple_single_bit_retirement/retired_count",
                    "retired_pages/double_bit_retirement/retired_count"):
            v = _int(g, tag)
            if v is not None:
                retired += v
                retired_seen = True
        out.append({
            "index": i,
            "pci": pci_key(g.get("id") or _t(g, "pci/pci_bus_id") or ""),
            "uuid": _t(g, "uuid"),
            "name": _t(g, "product_name"),
            "ecc_mode": _t(g, "ecc_mode/current_ecc"),
            "volatile_uncorrectable": _uncorrectable(g.find("ecc_errors/volatile")),
            "aggregate_uncorrectable": _uncorrectable(g.find("ecc_errors/aggregate")),
            "volatile_correctable": _int(g, "ecc_errors/volatile/dram_correctable"),
            "retired_pages": retired if retired_seen else None,
            "retirement_pending": _t(g, "retired_pages/pending_retirement"),
            "remap_uncorrectable": _int(g, "remapped_rows/remapped_row_unc"),
            "remap_pending": _t(g, "remapped_rows/remapped_row_pending"),
            "remap_failure": _t(g, "remapped_rows/remapped_row_failure"),
            "recovery_action": _t(g, "gpu_recovery_action"),
            "throttle": active,
            "temp_c": _n(g, "temperature/gpu_temp"),
            "util_pct": _n(g, "utilization/gpu_util"),
            "mem_used_mib": _n(g, "fb_memory_usage/used"),
            "mem_total_mib": _n(g, "fb_memory_usage/total"),
            "power_w": _n(g, "gpu_power_readings/power_draw") or _n(g, "power_readings/power_draw"),
            "pcie": {"gen_max": _int(g, "pci/pci_gpu_link_info/pcie_gen/max_link_gen"),
                     "gen_current": _int(g, "pci/pci_gpu_link_info/pcie_gen/current_link_gen"),
                     "width_max": _int(g, "pci/pci_gpu_link_info/link_widths/max_link_width"),
                     "width_current": _int(g, "pci/pci_gpu_link_info/link_widths/current_link_width")},
            "idle": "gpu_idle" in active,
        })
    return out


# ----------------------------------------------------------------------------------------- ranks on a GPU

def ranks_on_gpu(gpu_index, node_rank=None, nproc_per_node=None, visible=None):
    """(global rank, local rank) of the rank that uses nvidia-smi GPU `gpu_index` on this node, or (None, None).

    Local rank i uses the i-th visible GPU in PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID, which nccl.env sets);
    `visible`: the node's visible device indices (empty: all).
    """
    if gpu_index is None:
        return None, None
    order = [int(v) for v in (visible or [])] or None
    local = order.index(int(gpu_index)) if order and int(gpu_index) in order else (
        None if order else int(gpu_index))
    if local is None or (nproc_per_node is not None and local >= int(nproc_per_node)):
        return None, None
    if node_rank is None or nproc_per_node is None:
        return None, local
    return int(node_rank) * int(nproc_per_node) + local, local


def _where(host, node_rank, gpu, rank, local):
    node = "%s (node rank %s)" % (host, node_rank) if node_rank is not None else host
    g = "GPU %s (%s)" % (gpu["index"], gpu["pci"]) if gpu else "a GPU"
    if rank is not None:
        return "%s %s, rank %s (local rank %s)" % (node, g, rank, local)
    if local is not None:
        return "%s %s, local rank %s" % (node, g, local)
    return "%s %s (no rank of this job on it)" % (node, g)


def _ctx(opts):
    """(node rank, ranks per node, visible GPU indexes) from opts; a visible list of UUIDs maps nothing."""
    opts = opts or {}
    visible = opts.get("visible") or []
    if isinstance(visible, str):
        visible = [v.strip() for v in visible.split(",") if v.strip()]
    visible = [int(v) for v in visible] if all(str(v).isdigit() for v in visible) else []
    nr, npn = opts.get("node_rank"), opts.get("nproc_per_node")
    return (int(nr) if nr not in (None, "") else None), (int(npn) if npn not in (None, "") else None), visible


def _rec(check, status, detail, fix="", data=None):
    return {"check": check, "status": status, "detail": detail, "fix": fix if status != "pass" else "",
            "data": data or {}}


def _fmt_time(t):
    if t is None:
        return "time unknown"
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def xid_record(host, kernel, gpus, opts=None):
    """The nvidia_driver.xid record of one node.

    kernel: {"events": [...] from parse_kernel_log, "source": "dmesg"|"journalctl -k"|..., "skipped": reason or
    ""}; gpus: parse_health_xml (for the PCI id -> GPU index map; may be empty when nvidia-smi failed);
    opts: node_rank, nproc_per_node, visible, since (epoch, for the detail).
    """
    node_rank, nproc, visible = _ctx(opts)
    kernel = kernel or {}
    if kernel.get("skipped"):
        return _rec("nvidia_driver.xid", "skip", "kernel log not readable on %s: %s" % (host, kernel["skipped"]))
    by_pci = {g["pci"]: g for g in gpus or []}
    xids = [e for e in kernel.get("events") or [] if e.get("kind") in ("xid", "fallen")]
    since = (opts or {}).get("since")
    span = "since %s" % _fmt_time(since) if since else "in the kernel log"
    if not xids:
        return _rec("nvidia_driver.xid", "pass", "no Xid %s (%s)" % (span, kernel.get("source") or "kernel log"))
    rows, lines, fixes = [], [], []
    worst = "warn"
    seen = set()
    for e in xids:
        gpu = by_pci.get(e.get("pci"))
        rank, local = ranks_on_gpu(gpu["index"] if gpu else None, node_rank, nproc, visible)
        if e["severity"] == "fail":
            worst = "fail"
        row = {"code": e["code"], "pci": e.get("pci"), "gpu": gpu["index"] if gpu else None, "rank": rank,
               "local_rank": local, "time": e.get("time"), "severity": e["severity"], "meaning": e["meaning"],
               "fix": e["fix"], "line": e.get("line", "")}
        rows.append(row)
        key = (e["code"], e.get("pci"))
        if key in seen:
            continue
        seen.add(key)
        where = _where(host, node_rank, gpu or {"index": "?", "pci": e.get("pci")}, rank, local)
        lines.append("Xid %s on %s at %s: %s" % (e["code"], where, _fmt_time(e.get("time")), e["meaning"]))
        fixes.append("Xid %s on %s: %s" % (e["code"], host, e["fix"]))
    more = " (%d events)" % len(xids) if len(xids) > len(lines) else ""
    return _rec("nvidia_driver.xid", worst, "; ".join(lines) + more, "; ".join(dict.fromkeys(fixes)),
                {"xid": rows})


def ecc_record(host, gpus, opts=None):
    """The nvidia_driver.ecc record: uncorrectable ECC errors, pending/failed row remaps, pending page
    retirement, a pending recovery action; skip without ECC data."""
    node_rank, nproc, visible = _ctx(opts)
    if not gpus:
        return _rec("nvidia_driver.ecc", "skip", "no GPU in nvidia-smi -q -x on %s" % host)
    problems, fixes, warns = [], [], []
    with_data = 0
    for g in gpus:
        rank, local = ranks_on_gpu(g["index"], node_rank, nproc, visible)
        where = _where(host, node_rank, g, rank, local)
        if g.get("ecc_mode") not in (None, "Enabled"):
            warns.append("%s: ECC is %s" % (where, g["ecc_mode"]))
            continue
        if any(g.get(k) is not None for k in ("volatile_uncorrectable", "remap_pending", "retired_pages")):
            with_data += 1
        if (g.get("remap_failure") or "").lower() == "yes":
            problems.append("%s: row remapping FAILED (no spare rows left)" % where)
            fixes.append("%s: %s" % (host, _RMA))
        if (g.get("remap_pending") or "").lower() == "yes":
            problems.append("%s: row remap pending (%s uncorrectable rows remapped)"
                            % (where, g.get("remap_uncorrectable") if g.get("remap_uncorrectable") is not None
                               else "?"))
            fixes.append("%s GPU %s: %s to activate the remap" % (host, g["index"], _RESET))
        if (g.get("retirement_pending") or "").lower() == "yes":
            problems.append("%s: page retirement pending" % where)
            fixes.append("%s GPU %s: %s to retire the page" % (host, g["index"], _RESET))
        if (g.get("volatile_uncorrectable") or 0) > 0:
            problems.append("%s: %d uncorrectable ECC errors since the last reset"
                            % (where, g["volatile_uncorrectable"]))
            fixes.append("%s GPU %s: %s; if they come back, %s" % (host, g["index"], _RESET, _RMA))
        if g.get("recovery_action") not in (None, "None"):
            problems.append("%s: the driver asks for recovery action %r" % (where, g["recovery_action"]))
            fixes.append("%s GPU %s: do the recovery action (%s)" % (host, g["index"], g["recovery_action"]))
        if (g.get("aggregate_uncorrectable") or 0) > 0 and not (g.get("volatile_uncorrectable") or 0):
            warns.append("%s: %d uncorrectable ECC errors over the GPU's life (none since the last reset)"
                         % (where, g["aggregate_uncorrectable"]))
    data = {"gpus": [{k: g.get(k) for k in ("index", "pci", "volatile_uncorrectable", "aggregate_uncorrectable",
                                            "retired_pages", "remap_uncorrectable", "remap_pending",
                                            "remap_failure", "recovery_action")} for g in gpus]}
    if problems:
        return _rec("nvidia_driver.ecc", "fail", "; ".join(problems + warns), "; ".join(dict.fromkeys(fixes)), data)
    if warns:
        return _rec("nvidia_driver.ecc", "warn", "; ".join(warns),
                    "watch the GPU's ECC counters (nvidia-smi -q -d ECC,ROW_REMAPPER); replace it if they grow",
                    data)
    if not with_data:
        return _rec("nvidia_driver.ecc", "skip", "nvidia-smi reports no ECC counters on %s" % host, data=data)
    return _rec("nvidia_driver.ecc", "pass", "%d GPUs: no uncorrectable ECC error, no pending remap" % len(gpus),
                data=data)


def throttle_record(host, gpus, opts=None):
    """The nvidia_driver.throttle record: hardware slowdown, thermal and power-brake clock reasons (warnings)."""
    node_rank, nproc, visible = _ctx(opts)
    if not gpus:
        return _rec("nvidia_driver.throttle", "skip", "no GPU in nvidia-smi -q -x on %s" % host)
    lines = []
    for g in gpus:
        bad = [r for r in g.get("throttle") or [] if r in _THROTTLE_WARN]
        if bad:
            rank, local = ranks_on_gpu(g["index"], node_rank, nproc, visible)
            temp = " at %d C" % g["temp_c"] if g.get("temp_c") is not None else ""
            lines.append("%s%s: %s" % (_where(host, node_rank, g, rank, local), temp,
                                       ", ".join(_THROTTLE_WARN[r] for r in bad)))
    data = {"gpus": [{"index": g["index"], "throttle": g.get("throttle") or [], "temp_c": g.get("temp_c")}
                     for g in gpus]}
    if lines:
        return _rec("nvidia_driver.throttle", "warn", "; ".join(lines), "%s: %s" % (host, _THROTTLE_FIX), data)
    return _rec("nvidia_driver.throttle", "pass", "%d GPUs: no hardware, thermal or power-brake slowdown"
                % len(gpus), data=data)


# nvidia-smi(1), "PCIe Generation ... Current: The current PCI-E link generation. These may be reduced when the GPU
# is not in use": an idle GPU lowers its link generation to save power (ASPM / dynamic link speed), never its width.
_PCIE_IDLE = ("the GPU is idle (clocks event reason gpu_idle) and lowers its PCIe link generation to save power "
              "(nvidia-smi(1): the current generation 'may be reduced when the GPU is not in use')")


def _pcie_fix(host):
    return ("%s: reseat the GPU or its riser, check the slot's BIOS setting (PCIe speed Auto/Gen5, no bifurcation "
            "below x16) and dmesg | grep -i AER for link errors; a link that trains below its width halves (or "
            "worse) the host-to-GPU and GPUDirect bandwidth: if it stays, replace the node" % host)


def pcie_link_record(host, gpus, opts=None):
    """The nvidia_driver.pcie_link record: each GPU's PCIe link generation and width against its maximum
    (nvidia-smi -q -x <pci><pci_gpu_link_info>).

    Width below the maximum: fail (a lane problem: seating, riser, bifurcation). Generation below the maximum: warn
    when the GPU is idle (it lowers the generation to save power; rerun under load to be sure), fail under load.
    skip where nvidia-smi reports no link information (no GPU, a virtual GPU)."""
    node_rank, nproc, visible = _ctx(opts)
    known = [g for g in gpus or [] if (g.get("pcie") or {}).get("gen_max") and (g.get("pcie") or {}).get("width_max")]
    if not known:
        return _rec("nvidia_driver.pcie_link", "skip", "nvidia-smi -q -x reports no PCIe link information on %s (%s)"
                    % (host, "no GPU" if not gpus else "N/A: a virtual GPU or a driver that does not report it"))
    fails, warns = [], []
    for g in known:
        p = g["pcie"]
        rank, local = ranks_on_gpu(g["index"], node_rank, nproc, visible)
        where = _where(host, node_rank, g, rank, local)
        link = "PCIe Gen%s x%s (max Gen%s x%s)" % (p.get("gen_current"), p.get("width_current"), p["gen_max"],
                                                   p["width_max"])
        narrow = p.get("width_current") is not None and p["width_current"] < p["width_max"]
        slow = p.get("gen_current") is not None and p["gen_current"] < p["gen_max"]
        if narrow:
            fails.append("%s: %s: link width below its maximum" % (where, link))
        elif slow and not g.get("idle"):
            fails.append("%s: %s: link generation below its maximum while the GPU is not idle" % (where, link))
        elif slow:
            warns.append("%s: %s: %s" % (where, link, _PCIE_IDLE))
    data = {"gpus": [dict(g["pcie"], index=g["index"], idle=bool(g.get("idle"))) for g in known]}
    if fails:
        return _rec("nvidia_driver.pcie_link", "fail", "; ".join(fails + warns), _pcie_fix(host), data)
    if warns:
        return _rec("nvidia_driver.pcie_link", "warn", "; ".join(warns),
                    "%s: rerun the check while the GPUs are busy (e.g. during the NCCL check); a generation still "
                    "below the maximum under load is a fault: %s" % (host, _pcie_fix(host)), data)
    gens = sorted(set("Gen%s x%s" % (g["pcie"]["gen_max"], g["pcie"]["width_max"]) for g in known))
    return _rec("nvidia_driver.pcie_link", "pass", "%d GPU(s): PCIe link at its maximum (%s)"
                % (len(known), ", ".join(gens)), data=data)


def health_records(host, result, opts=None):
    """The four records from the health of one node ({kernel, gpus, smi_error}: nvidia_gpu_facts with health)."""
    result = result or {}
    gpus = result.get("gpus") or []
    recs = [xid_record(host, result.get("kernel") or {}, gpus, opts)]
    if result.get("smi_error"):
        why = "nvidia-smi -q -x failed on %s: %s" % (host, result["smi_error"])
        recs.append(_rec("nvidia_driver.ecc", "skip", why))
        recs.append(_rec("nvidia_driver.throttle", "skip", why))
        recs.append(_rec("nvidia_driver.pcie_link", "skip", why))
    else:
        recs.append(ecc_record(host, gpus, opts))
        recs.append(throttle_record(host, gpus, opts))
        recs.append(pcie_link_record(host, gpus, opts))
    return recs


def other_kernel_events(host, events, opts=None):
    """OOM kills and segfaults of the kernel log as lines naming the node (the collect report)."""
    node_rank = (opts or {}).get("node_rank")
    node = "%s (node rank %s)" % (host, node_rank) if node_rank is not None else host
    out = []
    for e in events or []:
        if e.get("kind") in ("oom", "segfault"):
            out.append({"node": host, "kind": e["kind"], "pid": e.get("pid"), "name": e.get("name"),
                        "time": e.get("time"), "text": "%s: %s of %s (pid %s) at %s: %s" % (
                            node, "OOM kill" if e["kind"] == "oom" else "segfault", e.get("name"), e.get("pid"),
                            _fmt_time(e.get("time")), e["meaning"]), "fix": e["fix"]})
    return out


# ----------------------------------------------------------------------------------------- reading on the node

def kernel_log_commands(journalctl, dmesg, since=None):
    """The commands that read the kernel log, best first: [(source name, argv)]. journalctl -k keeps the log
    across reboots (a GPU that fell off the bus is often followed by one); dmesg reads the ring buffer."""
    out = []
    if journalctl:
        argv = [journalctl, "-k", "-o", "short-iso", "--no-pager", "-q"]
        argv += ["--since", "@%d" % int(float(since))] if since else ["-b"]
        out.append(("journalctl -k", argv))
    if dmesg:
        out.append(("dmesg", [dmesg, "--time-format", "iso"]))
    return out


def read_kernel_log(run, journalctl, dmesg, since=None, max_bytes=1 << 20):
    """Run the kernel log commands through `run(argv) -> (rc, out, err)` until one works.

    Returns {source, text (the last max_bytes), truncated, skipped: '' or why no command could read it}.
    """
    why = []
    for source, argv in kernel_log_commands(journalctl, dmesg, since):
        rc, out, err = run(argv)
        text = out or ""
        if rc == 0 and (text.strip() or source == "dmesg"):
            data = text.encode("utf-8", "replace")
            truncated = len(data) > max_bytes
            if truncated:
                text = data[-max_bytes:].decode("utf-8", "replace").split("\n", 1)[-1]
            return {"source": source, "text": text, "truncated": truncated, "skipped": ""}
        why.append("%s: %s" % (source, ((err or out or "").strip().splitlines() or ["exit %s" % rc])[0][:200]
                               if rc != 0 else "%s: empty" % source))
    if not why:
        why.append("neither journalctl nor dmesg is installed")
    return {"source": None, "text": "", "truncated": False,
            "skipped": "; ".join(why) + " (run as root, or allow reading the kernel log: sysctl "
                                        "kernel.dmesg_restrict=0 or the systemd-journal group)"}
