# -*- coding: utf-8 -*-
"""What an all-reduce's bus bandwidth should reach on this hardware (docs/bandwidth.md), on the controller.

Two tables: inside a node per GPU model and link (NVLink generation through NVSwitch, or PCIe), and between nodes per
NIC rate and transport (InfiniBand, RoCE, EFA, TCP sockets). Every row cites where its number comes from. The figures
are nccl-tests' bus bandwidth (busbw = algbw x 2 (n - 1) / n for all-reduce) at large messages, the low end of the
published range: the verdict compares the measured busbw of the sweep's largest size with them.

Pure: facts in (the GPU facts of module nvidia_gpu_facts, the data NIC the benchmark read from sysfs), an expectation
out: ``{"gbps": float | None, "hardware": str, "source": str, "reason": str}``; ``gbps`` None means no expectation
(unknown hardware), and the verdict falls back to the user's floor, saying "no expectation for <hardware>".
Unit-tested in tests/unit/test_bandwidth_expect.py.
"""

from __future__ import annotations

import re

# ------------------------------------------------------------------------------------------------ inside a node
# (family, NVLink links per GPU at full width, link name, expected busbw GB/s, source). Matched on the GPU's product
# name (nvidia-smi -q) and the NVLink count of nvidia_gpu_facts (nvidia-smi nvlink -s).
NVLINK_ROWS = (
    # H100/H200 SXM: 18 NVLink4 links x 26.56 GB/s = 478 GB/s per direction (NVIDIA H100 datasheet: "NVLink 900GB/s"
    # bidirectional per GPU; nvidia-smi nvlink -s on our H200s: 18 x 26.562 GB/s). Published nccl-tests busbw on
    # 8 x H100 SXM5: 460-480 GB/s with NVLink SHARP (NVLS), about 360-380 GB/s with rings alone
    # (https://docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests, "Reference numbers"); measured here on two
    # H200s: 326-353 GB/s (docs/gpu-acceptance.md). Expected: 320 GB/s, the low end of the ring figures.
    ("H100", 18, "NVLink4 (18 links) through NVSwitch", 320.0,
     "nccl-tests busbw 8xH100 SXM5 360-480 GB/s (alayanew nccl-tests reference table); 326-353 GB/s on 2xH200 "
     "(docs/gpu-acceptance.md)"),
    ("H200", 18, "NVLink4 (18 links) through NVSwitch", 320.0,
     "nccl-tests busbw 8xH100 SXM5 360-480 GB/s (alayanew nccl-tests reference table); 326-353 GB/s on 2xH200 "
     "(docs/gpu-acceptance.md)"),
    ("H800", 8, "NVLink4 (8 links) through NVSwitch", 140.0,
     "NVIDIA H800 SXM: NVLink 400 GB/s bidirectional (datasheet), 8 of H100's 18 links; scaled from the H100 row"),
    # A100 SXM4: 12 NVLink3 links, 600 GB/s bidirectional per GPU (NVIDIA A100 datasheet). nccl-tests busbw on
    # 8 x A100 SXM4: 230-250 GB/s (same reference table).
    ("A100", 12, "NVLink3 (12 links) through NVSwitch", 230.0,
     "nccl-tests busbw 8xA100 SXM4 230-250 GB/s (alayanew nccl-tests reference table); NVLink3 600 GB/s "
     "bidirectional per GPU (NVIDIA A100 datasheet)"),
    ("A800", 8, "NVLink3 (8 links) through NVSwitch", 150.0,
     "NVIDIA A800 SXM: NVLink 400 GB/s bidirectional (datasheet), 8 of A100's 12 links; scaled from the A100 row"),
)
# PCIe without NVLink: (generation, expected busbw GB/s, source). x16 raw rate per direction: Gen4 16 GT/s x 16
# lanes x 128/130 = 31.5 GB/s, Gen5 63 GB/s (PCI-SIG base specifications 4.0 and 5.0).
PCIE_ROWS = {
    5: (35.0, "nccl-tests busbw 8xH100 PCIe (no NVSwitch) 35-45 GB/s (alayanew nccl-tests reference table); "
              "PCIe 5.0 x16 63 GB/s per direction (PCI-SIG)"),
    4: (17.5, "half the Gen5 figure, as the link rate halves: PCIe 4.0 x16 31.5 GB/s per direction (PCI-SIG); an "
              "estimate, no published nccl-tests table"),
}
# PCIe generation of a PCIe card by family (its PCI Express interface in the vendor's datasheet).
PCIE_GEN = {"H100": 5, "H200": 5, "L40S": 4, "L40": 4, "L4": 4, "A100": 4, "A800": 4, "A40": 4, "A30": 4, "A10": 4}
# Longest first: "H200" before "H20", "L40S" before "L40" and "L4".
_FAMILIES = sorted({r[0] for r in NVLINK_ROWS} | set(PCIE_GEN), key=len, reverse=True)

# ------------------------------------------------------------------------------------------------ between nodes
# Fraction of the NIC's line rate an all-reduce's busbw reaches (see docs/bandwidth.md for the busbw to NIC relation).
NIC_EFFICIENCY = {
    # "about 24 GB/s per 200G NIC" (NVIDIA/nccl-tests#119): 24 / 25 = 0.96; 0.9 leaves room for the switch.
    "ib": (0.9, "about 24 GB/s busbw per 200G InfiniBand NIC (NVIDIA/nccl-tests#119)"),
    "roce": (0.85, "InfiniBand's 0.9 less RoCE's Ethernet framing and congestion control; an estimate"),
    # p3dn 2 nodes, 100G EFA, all_reduce_perf to 1 GiB (gist jacobkahn/a92f4425abf831ac0799fabe9079263d); EFA's
    # libfabric path reaches less of its line rate than verbs.
    "efa": (0.8, "nccl-tests over EFA on p3dn.24xlarge (gist jacobkahn/a92f4425abf831ac0799fabe9079263d); an estimate"),
    # NCCL sockets with NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS = 16: 8.7-10.1 GB/s on the GPU machine's
    # 100 Gb/s class network (docs/gpu-acceptance.md); 0.6 of line rate is where a tuned socket transport lands.
    "tcp": (0.6, "NCCL socket transport, tuned (docs/gpu-acceptance.md: 8.7-10.1 GB/s); an estimate of 0.6 of line "
                 "rate"),
}
_RDMA_LINK_LAYER = {"ib": "InfiniBand", "roce": "Ethernet"}


def _none(hardware: str, reason: str) -> dict:
    return {"gbps": None, "hardware": hardware, "source": "", "reason": reason}


def gpu_family(name: str) -> str | None:
    """The table's family of a GPU product name ("NVIDIA H100 80GB HBM3" -> "H100"); None when not in the table."""
    upper = (name or "").upper()
    for fam in _FAMILIES:
        if re.search(r"(?<![A-Z0-9])" + fam + r"(?![0-9])", upper):
            return fam
    return None


def intra_expectation(gpu_facts: dict | None, nproc: int) -> dict:
    """The expected intra-node busbw of ``nproc`` ranks on this node's GPUs (``nvidia_gpu_facts``, None when the run
    did not read them)."""
    gpus = list((gpu_facts or {}).get("gpus") or [])
    if not gpus:
        return _none("this node's GPUs", "no GPU facts in this run (site.yml reads them in the nvidia_driver role)")
    names = sorted({str(g.get("name") or "?") for g in gpus})
    if len(names) > 1:
        return _none(" + ".join(names), "mixed GPU models on one node")
    name = names[0]
    hardware = f"{nproc}x {name}"
    fam = gpu_family(name)
    if fam is None:
        return _none(hardware, f"{name} is not in the table (docs/bandwidth.md)")
    links = [int((g.get("nvlink") or {}).get("links") or 0) for g in gpus]
    if all(n > 0 for n in links):
        row = next((r for r in NVLINK_ROWS if r[0] == fam and min(links) >= r[1]), None)
        if row is None:
            return _none(f"{hardware}, {min(links)} NVLinks per GPU",
                         "NVLink without a full NVSwitch fabric (bridged pairs) is not in the table")
        return {"gbps": row[3], "hardware": f"{hardware}, {row[2]}", "source": row[4], "reason": ""}
    if any(n > 0 for n in links):
        return _none(hardware, "some GPUs with NVLink and some without")
    if "PCIE" not in name.upper() and fam in {r[0] for r in NVLINK_ROWS}:
        return _none(hardware, "an SXM GPU with no NVLink listed (nvidia-smi nvlink -s read nothing)")
    gen = PCIE_GEN.get(fam)
    if gen is None:
        return _none(hardware, f"no PCIe generation known for {name}")
    gbps, source = PCIE_ROWS[gen]
    return {"gbps": gbps, "hardware": f"{hardware}, PCIe Gen{gen} x16", "source": source, "reason": ""}


def nic_expectation(nic: dict | None, profile: str, nproc: int = 1) -> dict:
    """The expected inter-node busbw of one node: ``nic`` as the benchmark reads it from sysfs ({iface, speed_mbps,
    virtual, rdma: [{device, port, rate_gbps, link_layer, state}]}), ``profile`` the nccl_env profile, ``nproc`` the
    ranks per node (NCCL drives at most one NIC per rank)."""
    nic = nic or {}
    iface = nic.get("iface") or "?"
    profile = (profile or "tcp").lower()
    if profile not in NIC_EFFICIENCY:
        return _none(f"the {profile} profile", f"no table row for the {profile} profile")
    eff, source = NIC_EFFICIENCY[profile]
    if profile == "tcp":
        if not nic:
            return _none("this node's NIC", "the benchmark reported no NIC here (it did not run on this node)")
        if not nic.get("iface"):
            return _none("the data interface", "no data interface was named to the benchmark (the network role "
                                               "chooses it: network_enabled false leaves it unknown), so no line rate")
        if nic.get("virtual"):
            return _none(f"{iface} (virtual)", f"{iface} is a virtual interface: no line rate")
        speed = nic.get("speed_mbps")
        if not isinstance(speed, (int, float)) or isinstance(speed, bool) or speed <= 0:
            return _none(iface, f"{iface} reports no link speed")
        line = speed / 1000.0
        return {"gbps": round(line / 8 * eff, 3), "hardware": f"TCP over {iface} at {line:g} Gb/s",
                "source": source, "reason": "", "nics": 1}
    ports = [p for p in nic.get("rdma") or [] if str(p.get("state", "")).upper().endswith("ACTIVE")]
    want = _RDMA_LINK_LAYER.get(profile)
    if want:
        ports = [p for p in ports if p.get("link_layer") == want]
    else:  # efa: its devices are efa_* / rdmap*
        ports = [p for p in ports if str(p.get("device", "")).startswith(("efa", "rdmap"))]
    rates = sorted((float(p.get("rate_gbps") or 0) for p in ports if p.get("rate_gbps")), reverse=True)
    if not rates:
        return _none(f"{profile} NICs", f"no active {profile} port with a rate in /sys/class/infiniband")
    used = rates[:max(1, int(nproc))]
    line = sum(used)
    return {"gbps": round(line / 8 * eff, 3),
            "hardware": f"{len(used)}x {profile.upper()} {used[0]:g} Gb/s" if len(set(used)) == 1
            else f"{profile.upper()} {'+'.join(f'{r:g}' for r in used)} Gb/s",
            "source": source, "reason": "", "nics": len(used)}


def group_expectation(per_host: dict) -> dict:
    """A group of nodes all-reduces at its slowest node's rate: the lowest expectation; none when any node has none
    (named with its reason)."""
    if not per_host:
        return _none("no node", "no node reported its NIC")
    missing = {h: e for h, e in per_host.items() if not (e or {}).get("gbps")}
    if missing:
        host, e = sorted(missing.items())[0]
        return _none(f"{(e or {}).get('hardware') or '?'} on {host}", (e or {}).get("reason") or "unknown")
    host, low = min(per_host.items(), key=lambda kv: (kv[1]["gbps"], kv[0]))
    same = len({e["hardware"] for e in per_host.values()}) == 1
    return dict(low, hardware=low["hardware"] if same else f"{low['hardware']} on {host}")


# ------------------------------------------------------------------------------------- busbw and the per-NIC rate
# NCCL_ALGO values of a hierarchical all-reduce (reduce inside the node, all-reduce between the nodes, broadcast inside
# the node): only 2 (k - 1) / k x S leaves each of the k nodes instead of a ring's 2 (n - 1) / n x S.
HIERARCHICAL_ALGOS = ("tree", "nvlstree", "nvls", "collnetdirect", "collnetchain", "collnet", "pat")


def nic_relation(nnodes, nranks, nccl_env: dict | None = None, nics: int | None = None) -> dict:
    """How the busbw of an all-reduce over ``nranks`` ranks on ``nnodes`` nodes relates to the NIC rate
    (docs/bandwidth.md): {algorithm, hierarchical, node_factor, per_nic_factor, text}.

    nccl-tests' busbw = algbw x 2 (n - 1) / n (doc/PERFORMANCE.md). A ring sends 2 (n - 1) / n x S through each node's
    NICs: busbw is the node's NIC bandwidth (node_factor 1). A hierarchical all-reduce (tree, NVLS tree, CollNet)
    sends 2 (k - 1) / k x S: the node's NIC bandwidth is busbw x (k - 1) n / ((n - 1) k), and with one NIC per GPU
    (n / k NICs per node) each NIC carries busbw x (k - 1) / (n - 1): the issue's per-NIC conversion. Which one ran:
    NCCL_ALGO when it names only ring or only hierarchical algorithms; else NCCL's own choice at large messages,
    a tree on 2 nodes and rings on 3 or more (NVIDIA/nccl-tests#196 and #160, the NCCL maintainer's answers)."""
    k, n = int(nnodes or 0), int(nranks or 0)
    nics = max(int(nics or 0), 1) if nics else max(n // k, 1) if k > 0 and n >= k else 1
    one = {"algorithm": "", "hierarchical": False, "node_factor": 1.0, "per_nic_factor": 1.0 / nics, "nics": nics,
           "text": ""}
    if k < 2 or n < k:
        return one
    named = [a.strip().lower() for a in str((nccl_env or {}).get("NCCL_ALGO") or "").split(",") if a.strip()]
    if named and not named[0].startswith("^") and all(a == "ring" for a in named):
        algo, hier, why = "ring", False, "NCCL_ALGO=Ring"
    elif named and not named[0].startswith("^") and all(a in HIERARCHICAL_ALGOS for a in named):
        algo, hier, why = named[0], True, "NCCL_ALGO=" + ",".join(named)
    elif k == 2:
        algo, hier, why = "tree", True, "NCCL picks a tree (or NVLS tree) on 2 nodes"
    else:
        algo, hier, why = "ring", False, "NCCL picks rings on 3 or more nodes at large messages"
    if not hier or n == k:
        return dict(one, algorithm=algo, text=f"{why}: busbw = the node's NIC bandwidth")
    node = (k - 1) * n / ((n - 1) * k)
    return {"algorithm": algo, "hierarchical": True, "node_factor": node, "per_nic_factor": node / nics, "nics": nics,
            "text": f"{why}: per NIC = busbw x (k - 1) / (n - 1) = busbw x {k - 1}/{n - 1}"
                    + ("" if nics * k == n else f" x {n // k}/{nics} ({nics} NIC(s) for {n // k} ranks per node)")}


def convert_for_nics(expect: dict | None, nnodes, nranks, nccl_env: dict | None = None) -> dict:
    """The inter-node expectation (in busbw) for the algorithm that ran: a hierarchical all-reduce's busbw is the
    NICs' rate / node_factor, so the expected busbw is raised by that much; the relation is kept as ``relation``."""
    expect = dict(expect or {})
    rel = nic_relation(nnodes, nranks, nccl_env, expect.get("nics"))
    expect["relation"] = rel
    if expect.get("gbps") and rel["hierarchical"]:
        expect["nic_gbps"] = expect["gbps"]
        expect["gbps"] = round(float(expect["gbps"]) / rel["node_factor"], 3)
        expect["hardware"] = f"{expect.get('hardware')} ({rel['text']})"
    return expect


def grade(measured, expect: dict | None, floor, pass_fraction: float = 0.8, warn_fraction: float = 0.5) -> tuple:
    """(status, text) of one measured busbw: "x GB/s = y% of the z GB/s expected for <hardware>" graded pass/warn/fail
    at the fractions; the floor (> 0) fails whatever the expectation; no expectation: the floor alone decides."""
    expect = expect or {}
    floor = float(floor or 0)
    value = float(measured)
    below_floor = floor > 0 and value < floor
    floor_text = f", floor {floor:g} GB/s" if floor > 0 else ""
    if expect.get("gbps"):
        z = float(expect["gbps"])
        frac = value / z
        status = "pass" if frac >= pass_fraction else "warn" if frac >= warn_fraction else "fail"
        if below_floor:
            status = "fail"
        text = f"{value:g} GB/s = {frac * 100:.0f}% of the {z:g} GB/s expected for {expect.get('hardware')}"
        return status, text + floor_text + (" (below the floor)" if below_floor else "")
    text = (f"{value:g} GB/s; no expectation for {expect.get('hardware') or 'this hardware'}"
            + (f" ({expect['reason']})" if expect.get("reason") else ""))
    return ("fail" if below_floor else "pass"), text + (floor_text or ", no floor")


def threshold(expect: dict | None, floor, pass_fraction: float = 0.8) -> float:
    """The busbw under which a measurement counts as slow (the bisection's test): the pass line, or the floor."""
    gbps = (expect or {}).get("gbps") or 0
    return max(float(floor or 0), float(gbps) * float(pass_fraction))
