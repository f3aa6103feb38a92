#!/usr/bin/env python3
"""Per-GPU stress of the burn-in tiers without DCGM: dense matmul TFLOP/s and HBM copy bandwidth, one process.

    python3 gpu_stress.py --seconds 20 [--env CUDA_VISIBLE_DEVICES=0,1] [--env-file nccl.env] [--matmul-n 8192] \
        [--copy-mib 2048] [--dtype bf16] [--json OUT]

For every GPU of the node's job in turn (CUDA_VISIBLE_DEVICES decides which: from --env, the lines nccl.env gives the
job for its GPUs, which the role passes since the stress runs before nccl.env is rendered; or --env-file, a rendered
nccl.env; else the environment): a square matmul of n x n in the given dtype
repeated for half the seconds (TFLOP/s = 2 n^3 per matmul), then a device-to-device copy of copy-mib MiB for the other
half (bandwidth = 2 x bytes per copy: one read and one write of HBM, as STREAM's copy counts it). Each figure is the
median of its timed windows (each window one CUDA-event-timed batch), with the minimum and maximum beside it, so a GPU
that throttles during the run shows a falling minimum. The GPU's name, UUID, PCI bus id, SM clock and temperature at
the end (torch.cuda and, where it is on the PATH, nvidia-smi) are kept with it. One JSON line prefixed
"trainyard-gpu-stress:" is printed and written to --json when given. Without a GPU it writes
{"skip": "<reason>"} and exits 0: the verdict (module_utils/burnin.py) records skip.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

PREFIX = "trainyard-gpu-stress:"
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32"}


def _windows(torch, run_batch, seconds: float, min_windows: int = 5) -> list[float]:
    """Seconds of each timed batch, batches repeated for `seconds` of wall time (at least min_windows)."""
    times: list[float] = []
    start = time.monotonic()
    while time.monotonic() - start < seconds or len(times) < min_windows:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run_batch()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1000.0)
    return times


def _smi() -> dict:
    """The GPU's clocks and temperature now, from nvidia-smi where it is installed ({} otherwise)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    fields = ["uuid", "pci.bus_id", "clocks.sm", "clocks.max.sm", "temperature.gpu", "power.draw",
              "clocks_throttle_reasons.active"]
    try:
        out = subprocess.run([smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [[c.strip() for c in ln.split(",")] for ln in out.splitlines() if ln.strip()]
    return {row[0]: dict(zip(fields, row)) for row in rows if len(row) == len(fields)}


def _matmul(torch, dev, seconds: float, n: int, dtype_name: str, per_batch: int = 10) -> tuple[list[float], bool]:
    if dtype_name == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    dtype = getattr(torch, DTYPES[dtype_name])
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    c = torch.empty(n, n, device=dev, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize(dev)

    def batch():
        for _ in range(per_batch):
            torch.matmul(a, b, out=c)

    tflops = [2.0 * n ** 3 * per_batch / t / 1e12 for t in _windows(torch, batch, seconds)]
    return tflops, bool(torch.isfinite(c).all().item())


def _copy(torch, dev, seconds: float, mib: int, per_batch: int = 10) -> tuple[list[float], bool]:
    elems = mib * 1024 * 1024 // 4
    src = torch.empty(elems, device=dev, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize(dev)

    def batch():
        for _ in range(per_batch):
            dst.copy_(src)

    gbps = [2.0 * elems * 4 * per_batch / t / 1e9 for t in _windows(torch, batch, seconds)]
    return gbps, bool(torch.equal(src, dst))


def stress_one(torch, index: int, seconds: float, n: int, copy_mib: int, dtype_name: str) -> dict:
    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    props = torch.cuda.get_device_properties(dev)
    mm, finite = _matmul(torch, dev, seconds / 2, n, dtype_name)
    torch.cuda.empty_cache()
    bw, same = _copy(torch, dev, seconds / 2, copy_mib)
    torch.cuda.empty_cache()
    uuid = str(getattr(props, "uuid", "") or "")
    return {"index": index, "name": props.name, "uuid": ("GPU-" + uuid) if uuid and not uuid.startswith("GPU-") else uuid,
            "pci_bus_id": "%04x:%02x:%02x.0" % (getattr(props, "pci_domain_id", 0), getattr(props, "pci_bus_id", 0),
                                                getattr(props, "pci_device_id", 0)),
            "memory_gib": round(props.total_memory / 2 ** 30, 1), "sm_count": props.multi_processor_count,
            "matmul": {"dtype": dtype_name, "n": n, "tflops": round(statistics.median(mm), 1),
                       "min": round(min(mm), 1), "max": round(max(mm), 1), "windows": len(mm), "finite": finite},
            "hbm_copy": {"mib": copy_mib, "gbps": round(statistics.median(bw), 1), "min": round(min(bw), 1),
                         "max": round(max(bw), 1), "windows": len(bw), "equal": same}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="per GPU: half matmul, half HBM copy")
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--copy-mib", type=int, default=2048)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--json", default="")
    ap.add_argument("--env-file", action="append", default=[],
                    help="KEY=VALUE lines applied before torch starts (the node's nccl.env: CUDA_VISIBLE_DEVICES)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="applied before torch starts, after --env-file (the node's job GPUs: CUDA_VISIBLE_DEVICES)")
    args = ap.parse_args(argv)
    bad = [e for e in args.env if "=" not in e or not e.split("=", 1)[0]]
    if bad:
        ap.error("--env %s: give KEY=VALUE (e.g. --env CUDA_VISIBLE_DEVICES=0,1)" % bad[0])
    if args.env_file:
        # The sweep's reader (allreduce_bench.py sits beside this script in the job's read-only directory).
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from allreduce_bench import load_env_file
        for path in args.env_file:
            os.environ.update(load_env_file(path))
    os.environ.update(dict(e.split("=", 1) for e in args.env))
    result: dict = {"seconds": args.seconds}
    try:
        import torch
    except ImportError as exc:
        result["skip"] = "torch is not importable here (%s)" % exc
        torch = None
    if torch is not None and not torch.cuda.is_available():
        result["skip"] = "no CUDA device visible to torch %s" % torch.__version__
    if "skip" not in result:
        result["torch"] = torch.__version__
        started = time.monotonic()
        result["gpus"] = [stress_one(torch, i, args.seconds, args.matmul_n, args.copy_mib, args.dtype)
                          for i in range(torch.cuda.device_count())]
        smi = _smi()
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        for gpu in result["gpus"]:
            gpu["smi_after"] = smi.get(gpu["uuid"], {})
            # The index nvidia-smi gives this GPU (PCI order), where CUDA_VISIBLE_DEVICES lists indexes.
            gpu["cuda_index"] = gpu["index"]
            if gpu["index"] < len(visible) and visible[gpu["index"]].isdigit():
                gpu["index"] = int(visible[gpu["index"]])
        result["wall_s"] = round(time.monotonic() - started, 1)
    line = json.dumps(result, sort_keys=True)
    print(PREFIX + " " + line, flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
