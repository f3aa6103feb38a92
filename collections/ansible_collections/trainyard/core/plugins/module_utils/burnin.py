# -*- coding: utf-8 -*-
"""Burn-in tiers (docs/burn-in.md): what each tier runs, how long it takes, and the verdict of DCGM's diagnostics.

Tiers: ``quick`` (the preflight with the quick checks: seconds), ``standard`` (DCGM diagnostics level 2 where
``dcgmi`` is installed: about two minutes; elsewhere the built-in stress of the nccl_check role, 20 s per GPU),
``long`` (DCGM level 3: about 15 minutes; elsewhere the built-in stress, 300 s per GPU). Durations per node, nodes in
parallel up to Ansible's forks. Pure (standard library only); unit tests: tests/unit/module_utils/test_burnin.py.
"""

from __future__ import annotations

import json

TIERS = ("quick", "standard", "long")
DCGM_LEVEL = {"standard": 2, "long": 3}

# Seconds per node and where each number comes from.
ESTIMATES = {
    "quick": (10, "the nvidia_driver role's one nvidia-smi round trip took 5.4 s per node on the simulated cluster "
                  "(tests/integration/test_burnin.py, 2026-11-27) and the other prepare roles' preflight a few "
                  "seconds more; docs/benchmarks.md has the whole preflight"),
    "standard": (120, "NVIDIA, dcgmi diag reference: level 2 'normally lasting approximately two minutes' "
                      "(https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/"
                      "dcgmi-diag.html)"),
    "long": (900, "the same reference: level 3 'normally lasting approximately 15 minutes'"),
}


# The built-in stress (roles/nccl_check/files/gpu_stress.py) per node: its seconds per GPU for every GPU plus what
# the measured run spent beyond them, and torch's start in the container.
STRESS_PER_GPU_OVERHEAD_S = 0.5
STRESS_START_S = 10
STRESS_SOURCE = ("measured: the stress at 20 s per GPU took wall_s 81.1 s on 4 x H100 (20.3 s per GPU, "
                 "docs/gpu-acceptance/stress-h100x4/stress.json); 10 s for torch's import and CUDA's start in the "
                 "container, an estimate")


def estimate(tier, nodes, forks=5, gpus=0, stress_s=0):
    """{tier, seconds, per_node_s, rounds, text, sources} for `nodes` nodes at `forks` at a time; the quick tier is
    part of every tier. With `gpus` per node and the built-in stress's `stress_s` per GPU (nccl_check_stress_*_s; 0:
    the stress is off), a node runs DCGM or the stress (where dcgmi is absent), and the longer of the two counts."""
    if tier not in TIERS:
        raise ValueError("cluster_burnin_tier is %r. Fix: set it to quick, standard or long" % (tier,))
    nodes, forks = max(int(nodes or 0), 0), max(int(forks or 1), 1)
    gpus, stress_s = max(int(gpus or 0), 0), max(float(stress_s or 0), 0.0)
    rounds = -(-nodes // forks) if nodes else 0
    parts = ["quick %d s" % ESTIMATES["quick"][0]]
    sources = {"quick": ESTIMATES["quick"][1]}
    extra = 0
    if tier != "quick":
        extra = ESTIMATES[tier][0]
        sources[tier] = ESTIMATES[tier][1]
        dcgm = "DCGM level %d %d s" % (DCGM_LEVEL[tier], ESTIMATES[tier][0])
        if gpus and stress_s:
            stress = int(round(gpus * (stress_s + STRESS_PER_GPU_OVERHEAD_S) + STRESS_START_S))
            extra = max(extra, stress)
            sources["stress"] = STRESS_SOURCE
            dcgm += (" or, where dcgmi is absent, the built-in stress %d GPU(s) x %g s = %d s (the longer counts)"
                     % (gpus, stress_s, stress))
        parts.append(dcgm)
    per_node = ESTIMATES["quick"][0] + extra
    seconds = rounds * per_node
    text = ("burn-in tier %s: about %s on this cluster (%d node(s), %d at a time: %d round(s) of %d s per node = %s)"
            % (tier, _human(seconds), nodes, forks, rounds, per_node, " + ".join(parts)))
    return {"tier": tier, "seconds": seconds, "per_node_s": per_node, "rounds": rounds, "text": text,
            "sources": sources}


def _human(seconds):
    return "%d s" % seconds if seconds < 120 else "%d min" % round(seconds / 60.0)


def dcgm_argv(dcgmi, tier):
    return [dcgmi, "diag", "-r", str(DCGM_LEVEL[tier]), "-j"]


def dcgm_document(stdout):
    """The JSON document of ``dcgmi diag -j`` output; None when there is none. Text before it (DCGM prints warnings
    there: NVIDIA/DCGM nvvs/src/tests/JsonResultTests.cpp reads its "real output" from the first '{') and after it is
    skipped."""
    text = stdout or ""
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text, start)[0]
    except ValueError:
        return None


def dcgm_results(data):
    """Every test result of `dcgmi diag -j` output: [(test name, gpu ids, status, text)]. Walks the JSON for
    objects with a name and a list of results (DCGM's layout changed between versions; the names stay)."""
    out = []

    def walk(obj):
        if isinstance(obj, dict):
            name = obj.get("name") or obj.get("test_name")
            if name and isinstance(obj.get("results"), list):
                for r in obj["results"]:
                    if isinstance(r, dict):
                        text = r.get("warnings") or r.get("info") or r.get("error") or ""
                        if isinstance(text, list):
                            text = "; ".join(str(t.get("warning") or t.get("message") or t) if isinstance(t, dict)
                                             else str(t) for t in text)
                        out.append((str(name), str(r.get("gpu_id", r.get("gpu_ids", r.get("entity_id", "")))),
                                    str(r.get("status", "")), str(text)[:300]))
                return
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)
    walk(data)
    return out


def burnin_record(host, tier, has_gpu, dcgmi=None, rc=None, stdout=""):
    """nvidia_driver.burnin of one node: quick needs nothing more (skip naming the quick checks); standard/long: the
    DCGM diagnostics' verdict where dcgmi ran, else skip with the reason (no GPU device, or dcgmi missing: the
    nccl_check role's built-in stress, nccl_check.gpu_stress, runs there)."""
    def rec(status, detail, fix="", data=None):
        return {"check": "nvidia_driver.burnin", "status": status, "detail": detail,
                "fix": fix if status != "pass" else "", "data": data or {}}
    if tier == "quick":
        return rec("skip", "burn-in tier quick: the preflight's quick checks only (cluster_burnin_tier standard or "
                   "long adds DCGM's diagnostics)")
    level = DCGM_LEVEL[tier]
    if not has_gpu:
        return rec("skip", "burn-in tier %s: no GPU device on %s (/dev/nvidia0 absent): DCGM diagnostics level %d "
                   "not run" % (tier, host, level))
    if not dcgmi:
        return rec("skip", "burn-in tier %s: dcgmi is not installed on %s: DCGM diagnostics level %d not run; the "
                   "built-in matmul/HBM stress runs instead in the training container (nccl_check.gpu_stress)"
                   % (tier, host, level),
                   "install DCGM (datacenter-gpu-manager) on %s for DCGM's diagnostics; the built-in stress needs the "
                   "nccl_check role on (nccl_check_enabled)" % host)
    results = dcgm_results(dcgm_document(stdout))
    if not results:
        return rec("fail", "dcgmi diag -r %d on %s gave no test results (exit %s): %s" % (
            level, host, rc, (stdout or "").strip()[:300] or "no output"),
            "run dcgmi diag -r %d on %s by hand and read its message (nv-hostengine must run)" % (level, host))
    failed = [r for r in results if r[2].lower() == "fail"]
    warned = [r for r in results if r[2].lower() == "warn"]
    data = {"level": level, "results": [dict(zip(("test", "gpu", "status", "text"), r)) for r in results]}
    if failed or warned:
        bad = failed or warned
        return rec("fail" if failed else "warn", "DCGM level %d on %s: %s" % (level, host, "; ".join(
            "%s GPU %s %s%s" % (t, g, s, ": " + x if x else "") for t, g, s, x in bad[:8])),
            "%s: follow DCGM's message per test (a GPU failing memory, PCIe or targeted stress: drain the node, reset "
            "the GPU, rerun; if it fails again, replace the node)" % host, data)
    return rec("pass", "DCGM level %d on %s: %d test result(s), none failed" % (level, host, len(results)), data=data)


def run_tier(module, tier, timeout=3600):
    """The nvidia_driver.burnin record of this node for tier, DCGM's diagnostics run where the tier asks for them:
    the one node-side step of library/gpu_burnin.py and of nvidia_gpu_facts' I(burnin) (module: an AnsibleModule,
    whose run_command, get_bin_path and check_mode it uses; nothing else here touches the node)."""
    import os
    import socket

    host = socket.gethostname()
    has_gpu = os.path.exists("/dev/nvidia0")
    dcgmi = module.get_bin_path("dcgmi", opt_dirs=["/usr/bin", "/usr/local/bin"])
    if tier != "quick" and module.check_mode:
        return {"check": "nvidia_driver.burnin", "status": "skip", "fix": "",
                "detail": "burn-in tier %s: not run in check mode" % tier, "data": {}}
    rc, out = None, ""
    if tier != "quick" and has_gpu and dcgmi:
        argv = dcgm_argv(dcgmi, tier)
        timeout_bin = module.get_bin_path("timeout") if timeout > 0 else None
        if timeout_bin:
            argv = [timeout_bin, "-k", "10", str(timeout)] + argv
        rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
        out = out or err
    return burnin_record(host, tier, has_gpu, dcgmi, rc, out)
