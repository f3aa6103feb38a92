# -*- coding: utf-8 -*-
"""The built-in GPU stress's verdict (docs/burn-in.md): per GPU, the bf16 matmul TFLOP/s and the HBM copy GB/s of
roles/nccl_check/files/gpu_stress.py against (a) what this GPU model should reach and (b) the fleet median of the
same model over every node's GPUs; check ``nccl_check.gpu_stress``, one record per node.

Pure, on the controller: every node's stress result in ({host: parsed result}), records out. The table below cites
the vendor's datasheet peak (dense bf16 Tensor Core TFLOP/s, HBM bandwidth) and what a torch matmul and a torch
device-to-device copy reach of it; unit tests feed the real capture of docs/gpu-acceptance/stress-h100x4/
(tests/unit/plugin_utils/test_gpu_stress_checks.py).
"""

from __future__ import annotations

import json
import re
import statistics

from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars

CHECK = "nccl_check.gpu_stress"
PREFIX = "trainyard-gpu-stress:"

# What torch reaches of the datasheet peak, measured: 4 x H100 80GB HBM3 (SXM), torch 2.11.0+cu130, bf16 8192^3
# matmul 675.7-679.1 TFLOP/s = 69% of 989.4; 2 GiB copy 3011-3017 GB/s = 90% of 3350 GB/s
# (docs/gpu-acceptance/stress-h100x4/stress.json). The other models are scaled by these two fractions: an estimate
# until each has its own capture.
MATMUL_OF_PEAK = 678.0 / 989.4
COPY_OF_PEAK = 3015.0 / 3350.0
_MEASURED_H100 = "measured: 678 TFLOP/s and 3015 GB/s on 4 x H100 80GB HBM3 (docs/gpu-acceptance/stress-h100x4/stress.json)"
_SCALED = "expected = the datasheet peak x the fractions torch reached on H100 SXM (69% matmul, 90% copy): an estimate"

# (name pattern on nvidia-smi's/torch's product name, model, dense bf16 TFLOP/s, HBM GB/s, datasheet, how the expected
# figure is got). First match wins: the specific names (PCIe, NVL) before the bare family. Datasheet figures "with
# sparsity" are halved to the dense figure.
GPU_ROWS = (
    (r"H100.*(PCIE)", "H100 PCIe", 756.0, 2000.0,
     "NVIDIA H100 datasheet, H100 PCIe: BF16 Tensor Core 1,513 TFLOPS with sparsity (756 dense), GPU memory bandwidth "
     "2 TB/s", _SCALED),
    (r"H100.*NVL", "H100 NVL", 835.0, 3900.0,
     "NVIDIA H100 datasheet, H100 NVL: BF16 Tensor Core 1,671 TFLOPS with sparsity (835 dense), 3.9 TB/s", _SCALED),
    (r"H100", "H100 SXM", 989.4, 3350.0,
     "NVIDIA H100 datasheet, H100 SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity (989.4 dense), GPU memory "
     "bandwidth 3.35 TB/s", _MEASURED_H100),
    (r"H200.*NVL", "H200 NVL", 835.0, 4800.0,
     "NVIDIA H200 datasheet, H200 NVL: BF16 Tensor Core 1,671 TFLOPS with sparsity (835 dense), 4.8 TB/s", _SCALED),
    (r"H200", "H200 SXM", 989.4, 4800.0,
     "NVIDIA H200 datasheet, H200 SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity (989.4 dense), GPU memory "
     "bandwidth 4.8 TB/s", _SCALED + "; checked on one H200: 662.0 TFLOP/s, 4271.5 GB/s "
     "(docs/gpu-acceptance/stress-h200x1/stress.json)"),
    (r"A100.*80GB.*PCIE|A100.*PCIE.*80GB", "A100 80GB PCIe", 312.0, 1935.0,
     "NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (dense), A100 80GB PCIe 1,935 GB/s", _SCALED),
    (r"A100.*80GB", "A100 80GB SXM", 312.0, 2039.0,
     "NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (dense), A100 80GB SXM 2,039 GB/s", _SCALED),
    (r"A100", "A100 40GB", 312.0, 1555.0,
     "NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (dense), A100 40GB 1,555 GB/s", _SCALED),
    (r"L40S", "L40S", 362.05, 864.0,
     "NVIDIA L40S datasheet: BF16 Tensor Core 733 TFLOPS with sparsity (362 dense), 864 GB/s", _SCALED),
)

# nvidia-smi clocks_throttle_reasons.active bits (NVML nvmlClocksThrottleReason*).
THROTTLE_BITS = ((0x1, "GPU idle"), (0x2, "applications clocks setting"), (0x4, "SW power cap"),
                 (0x8, "HW slowdown"), (0x10, "sync boost"), (0x20, "SW thermal slowdown"),
                 (0x40, "HW thermal slowdown"), (0x80, "HW power brake slowdown"), (0x100, "display clock setting"))
STATUS_RANK = {"pass": 0, "skip": 0, "warn": 1, "fail": 2}


def expectation(name: str) -> dict | None:
    """{model, tflops, gbps, peak_tflops, peak_gbps, source} of a GPU product name; None when not in the table."""
    upper = (name or "").upper()
    for pattern, model, peak_tf, peak_bw, datasheet, how in GPU_ROWS:
        if re.search(pattern, upper):
            return {"model": model, "tflops": round(peak_tf * MATMUL_OF_PEAK, 1),
                    "gbps": round(peak_bw * COPY_OF_PEAK, 1), "peak_tflops": peak_tf, "peak_gbps": peak_bw,
                    "source": f"{datasheet}; {how}"}
    return None


def parse_output(registered: dict | None) -> dict:
    """The stress's JSON line from a registered command result: the result dict, {"skip": reason} when the task
    was skipped, or {"error": text} when the run printed no result line (with the exit code and its last lines)."""
    registered = registered or {}
    if registered.get("skipped"):
        return {"skip": "not run (%s)" % (registered.get("skip_reason") or "skipped")}
    stdout = registered.get("stdout") or ""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PREFIX):
            try:
                return json.loads(line[len(PREFIX):])
            except ValueError:
                break
    rc = registered.get("rc")
    tail = (registered.get("stderr") or stdout or "").strip().splitlines()[-4:]
    reason = "timed out" if rc in (124, 137) else "exit code %s" % rc
    return {"error": reason + (": " + " | ".join(tail) if tail else "")}


def throttle_text(smi: dict | None) -> str:
    """'SM clock 1410/1980 MHz, throttle reasons 0x4 (SW power cap)' from the stress's nvidia-smi reading."""
    smi = smi or {}
    parts = []
    if smi.get("clocks.sm"):
        parts.append("SM clock %s/%s MHz" % (smi["clocks.sm"], smi.get("clocks.max.sm") or "?"))
    raw = str(smi.get("clocks_throttle_reasons.active") or "")
    try:
        bits = int(raw, 16) if raw else None
    except ValueError:
        bits = None
    if bits:
        parts.append("throttle reasons %#x (%s)" % (bits, ", ".join(t for b, t in THROTTLE_BITS if bits & b) or "?"))
    elif bits == 0:
        parts.append("no throttle reason")
    return ", ".join(parts)


def _grade(fraction: float, pass_fraction: float, warn_fraction: float) -> str:
    return "pass" if fraction >= pass_fraction else "warn" if fraction >= warn_fraction else "fail"


def fleet_medians(results: dict) -> dict:
    """{GPU name: {tflops, gbps, gpus}}: the median of every node's GPUs of that name."""
    by_name: dict[str, list] = {}
    for res in (results or {}).values():
        for gpu in (res or {}).get("gpus") or []:
            by_name.setdefault(str(gpu.get("name") or "?"), []).append(gpu)
    out = {}
    for name, gpus in by_name.items():
        tf = [float(g["matmul"]["tflops"]) for g in gpus if (g.get("matmul") or {}).get("tflops") is not None]
        bw = [float(g["hbm_copy"]["gbps"]) for g in gpus if (g.get("hbm_copy") or {}).get("gbps") is not None]
        out[name] = {"tflops": statistics.median(tf) if tf else None, "gbps": statistics.median(bw) if bw else None,
                     "gpus": len(gpus)}
    return out


def gpu_verdict(host: str, gpu: dict, median: dict, pass_fraction: float = 0.8, warn_fraction: float = 0.5) -> dict:
    """One GPU: {index, uuid, name, status, text, tflops, gbps, of_median, of_expected}. Each figure is graded
    against the fleet median and the table's expectation (where the model is in it); the worst grade counts. A
    matmul with non-finite output or a copy that differs from its source fails whatever the speed."""
    name = str(gpu.get("name") or "?")
    mm, cp = gpu.get("matmul") or {}, gpu.get("hbm_copy") or {}
    expect = expectation(name)
    status, figures, of_median, of_expected = "pass", [], {}, {}
    for key, label, unit, fig in (("tflops", "bf16 matmul", "TFLOP/s", mm.get("tflops")),
                                  ("gbps", "HBM copy", "GB/s", cp.get("gbps"))):
        if fig is None:
            status = "fail"
            figures.append(f"{label}: no figure")
            continue
        fig = float(fig)
        bits = [f"{label} {fig:g} {unit}"]
        med = (median or {}).get(key)
        if med:
            of_median[key] = round(fig / med, 3)
            status = max(status, _grade(fig / med, pass_fraction, warn_fraction), key=STATUS_RANK.get)
            bits.append(f"{fig / med * 100:.0f}% of the fleet median {med:g} ({median.get('gpus')} x {name})")
        if expect:
            of_expected[key] = round(fig / expect[key], 3)
            status = max(status, _grade(fig / expect[key], pass_fraction, warn_fraction), key=STATUS_RANK.get)
            bits.append(f"{fig / expect[key] * 100:.0f}% of the {expect[key]:g} expected for {expect['model']}")
        figures.append(" = ".join(bits[:2]) + (", " + bits[2] if len(bits) > 2 else ""))
    broken = []
    if mm.get("finite") is False:
        broken.append("the matmul's result holds inf/NaN")
    if cp.get("equal") is False:
        broken.append("the HBM copy differs from its source")
    if broken:
        status = "fail"
    clock = throttle_text(gpu.get("smi_after"))
    text = "%s GPU %s (%s): %s%s%s" % (host, gpu.get("index"), gpu.get("uuid") or "no UUID", "; ".join(figures),
                                      "; " + "; ".join(broken) if broken else "", "; " + clock if clock else "")
    return {"index": gpu.get("index"), "uuid": gpu.get("uuid"), "name": name, "status": status, "text": text,
            "tflops": mm.get("tflops"), "gbps": cp.get("gbps"), "of_median": of_median, "of_expected": of_expected,
            "clock": clock, "broken": broken}


def short_line(host: str, bad: list) -> str:
    """The first line of a slow node's detail, which the exclusion, its report line and the record of bad machines
    keep (module_utils/recover.py failed_checks: the first line, 160 characters): every slow GPU by index with its
    figures as the lower of its fractions of the fleet median and of the expected figure, e.g. "slow GPU(s) on node3
    (% of the fleet median or expected, the lower): GPU 3 matmul 47% copy 49%"."""
    parts = []
    for g in bad:
        fig = []
        for key, label in (("tflops", "matmul"), ("gbps", "copy")):
            fractions = [f[key] for f in (g.get("of_median") or {}, g.get("of_expected") or {}) if key in f]
            fig.append("%s %s" % (label, "%d%%" % round(min(fractions) * 100) if fractions else "no figure"))
        if g.get("broken"):
            fig.append("broken result")
        parts.append("GPU %s %s" % (g.get("index"), " ".join(fig)))
    return "slow GPU(s) on %s (%% of the fleet median or expected, the lower): %s" % (host, "; ".join(parts))


def _record(status: str, detail: str, fix: str = "", data: dict | None = None) -> dict:
    return {"check": CHECK, "status": status, "detail": detail, "fix": fix if status != "pass" else "",
            "data": data or {}}


def records(results: dict, tier: str = "standard", pass_fraction: float = 0.8, warn_fraction: float = 0.5) -> dict:
    """{host: nccl_check.gpu_stress record} from every node's parsed stress result ({host: parse_output(...)}).

    skip: the node's result says why nothing ran (no GPU visible to torch, torch missing, DCGM ran instead, the task
    was skipped). fail: the stress did not complete, or a GPU below warn_fraction of the fleet median or of its
    model's expectation, or a broken result. warn: a GPU between the fractions. pass: every GPU at or above
    pass_fraction of both."""
    pass_fraction, warn_fraction = float(pass_fraction), float(warn_fraction)
    medians = fleet_medians({h: r for h, r in (results or {}).items() if not (r or {}).get("skip")})
    out = {}
    for host, res in (results or {}).items():
        res = res or {}
        if res.get("skip"):
            out[host] = _record("skip", "built-in GPU stress (burn-in tier %s) not run on %s: %s"
                                % (tier, host, res["skip"]))
            continue
        if res.get("error") or not res.get("gpus"):
            out[host] = _record("fail", "built-in GPU stress (burn-in tier %s) on %s did not complete: %s"
                                % (tier, host, res.get("error") or "no GPU in its result"),
                                "run roles/nccl_check/files/gpu_stress.py --seconds 20 in the training container on "
                                "%s by hand and read its error (a GPU that hangs or faults: drain the node)" % host,
                                {"result": res})
            continue
        gpus = [gpu_verdict(host, g, medians.get(str(g.get("name") or "?")), pass_fraction, warn_fraction)
                for g in res["gpus"]]
        status = max((g["status"] for g in gpus), key=STATUS_RANK.get)
        data = {"tier": tier, "seconds": res.get("seconds"), "torch": res.get("torch"), "gpus": gpus,
                "medians": {g["name"]: medians.get(g["name"]) for g in gpus},
                "expected": {g["name"]: expectation(g["name"]) for g in gpus}}
        if status == "pass":
            names = sorted({g["name"] for g in gpus})
            tf = [float(g["tflops"]) for g in gpus]
            bw = [float(g["gbps"]) for g in gpus]
            exp = expectation(names[0]) if len(names) == 1 else None
            detail = ("%d x %s on %s: bf16 matmul %g-%g TFLOP/s, HBM copy %g-%g GB/s, every GPU at %d%% or more of "
                      "the fleet median%s" % (len(gpus), " + ".join(names), host, min(tf), max(tf), min(bw), max(bw),
                                                pass_fraction * 100,
                                                " and of the %g TFLOP/s and %g GB/s expected for %s"
                                                % (exp["tflops"], exp["gbps"], exp["model"]) if exp
                                                else " (no table row for this model: the median alone decides)"))
            out[host] = _record("pass", detail, data=data)
            continue
        bad = [g for g in gpus if g["status"] == status]
        out[host] = _record(status, short_line(host, bad) + "\nslow GPU(s): " + " | ".join(g["text"] for g in bad),
                            "%s: a GPU well below its peers is shared with another process (nvidia-smi lists it), "
                            "power- or thermally capped (the throttle reasons), or failing: free it, check cooling and "
                            "the power limit (nvidia-smi -q -d PERFORMANCE,POWER), rerun; if it stays slow, drain the "
                            "node or leave it out (cluster_node_failure_policy: exclude)" % host, data)
    return out


def skip_reason(preflight_results, mode: str = "auto", run_id: str = "") -> str:
    """Why this node does not run the built-in stress ('' when it does): mode never, or (auto) DCGM's diagnostics ran
    on it in this run (its nvidia_driver.burnin record carries the DCGM level)."""
    if mode == "never":
        return "nccl_check_gpu_stress is never"
    if mode != "auto":
        return ""
    for rec in preflight_results or []:
        if (isinstance(rec, dict) and rec.get("check") == "nvidia_driver.burnin" and (not run_id or rec.get("run") == run_id)
                and (rec.get("data") or {}).get("level")):
            return ("DCGM's diagnostics level %s ran on this node (nvidia_driver.burnin: %s); "
                    "nccl_check_gpu_stress: always runs both" % (rec["data"]["level"], rec.get("status")))
    return ""


def records_of(registered_by_host: dict, preflight_by_host: dict | None = None, mode: str = "auto", run_id: str = "",
               tier: str = "standard", pass_fraction: float = 0.8, warn_fraction: float = 0.5) -> dict:
    """records() from the role's registered command results ({host: registered}); a node skip_reason() names (from
    its preflight_results in ``preflight_by_host``) is a skip with that reason."""
    out = {}
    for host, reg in (registered_by_host or {}).items():
        why = skip_reason((preflight_by_host or {}).get(host), mode, run_id)
        out[host] = {"skip": why} if why else parse_output(reg)
    return records(out, tier, pass_fraction, warn_fraction)


def env_args(visible_devices) -> list:
    """gpu_stress.py's --env arguments: the node's job GPUs as nccl.env gives them (nccl_vars.job_devices, from
    nvidia_driver_visible_devices), for the stress of the prepare play, which runs before nccl.env is rendered."""
    out = []
    for name, value in nccl_vars.job_devices(visible_devices).items():
        if value is not None:
            out += ["--env", "%s=%s" % (name, value)]
    return out


def recorded(preflight_results, run_id: str = "") -> bool:
    """Whether this node already holds a record of the stress of this run (the prepare play's burn-in step ran it):
    the nccl_check role's own run does not stress the GPUs a second time then. Records of another run (a fact cache
    keeps them) do not count; without a run id any record counts."""
    return any(isinstance(rec, dict) and rec.get("check") == CHECK and (not run_id or rec.get("run") == run_id)
               for rec in preflight_results or [])
