#!/usr/bin/env python3
"""GPU proof of the hang diagnosis: two "nodes" on ONE GPU (each torchrun agent claims its own NCCL host id, P2P and
SHM off, sockets over lo), a real NCCL job in which rank 1 skips one all_reduce and stays away (tests/gpu/hang_job.py).
NCCL's watchdog times out and dumps every rank's flight recorder where nccl.env puts it (TORCH_FR_BUFFER_SIZE,
TORCH_NCCL_DUMP_ON_TIMEOUT=1, TORCH_NCCL_ENABLE_MONITORING=1, TORCH_FR_DUMP_TEMP_FILE=
<state>/<job>/job-rw/flight_recorder/rank_, module_utils/torchrun.py JOB_RW_DIR); as soon as both dumps are on disk,
playbooks/collect.yml (local connection, inventory written here, PyTorch's own analyzer on the controller) must name
rank 1 on gpu-node1, the collective (nccl:all_reduce), its sequence number and its sizes.

Run on the GPU machine (nvidia-h100-x1 or nvidia-h200; one GPU is enough), from the checkout's root, with the
machine's Python (torch with CUDA) and ansible-core from wheels as for tests/gpu/acceptance.py
(docs/gpu-acceptance.md; PYTHONPATH=/tmp/site holds them):

    export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    python3 tests/gpu/hang_collect.py $OUT/hang [--root /tmp/trainyard-hang] [--timeout-s 20]

and on a CPU machine, the same steps over gloo (dumps written by hand: gloo never dumps on a timeout):

    .venv/bin/python tests/gpu/hang_collect.py OUTDIR --cpu-rehearsal

Raw results in OUTDIR: hang_collect.json (every figure and the named line), figures.md, collect.log (collect.yml's
whole output), collect.md, collect.json, flight_recorder.txt (the analyzer's output) and each node's torchrun log.
Figures: seconds from the injected hang (the time rank 1 printed) to both dumps on disk, the collect.yml run, and
from the hang to the line that names the rank. Exits 1 (and says why) when the rank, the collective or its sizes are
not named, 2 when the machine lacks what the proof needs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ansible.plugins.loader import init_plugin_loader

REPO = Path(__file__).resolve().parents[2]
init_plugin_loader([str(REPO / "collections")])  # the project's shared code, found as ansible-playbook finds it
from ansible_collections.trainyard.core.plugins.module_utils.torchrun import JOB_RW_DIR  # noqa: E402
JOB = "hang"
PORT = 39519
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def inventory(root: Path, run_dir: Path) -> Path:
    inv = root / "inventory"
    (inv / "group_vars").mkdir(parents=True, exist_ok=True)
    hosts = {"all": {"children": {"trainers": {"hosts": {
        f"gpu-node{i}": {"data_address": f"127.0.0.{i + 1}", "cluster_state_dir": str(root / f"node{i}/state"),
                         "cluster_output_root": str(root / f"node{i}/outputs")} for i in (0, 1)}}},
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}
    (inv / "hosts.yml").write_text(json.dumps(hosts, indent=1))
    (inv / "group_vars/all.yml").write_text(json.dumps({
        "cluster_gpus_per_node": 1, "cluster_nproc_per_node": 1, "cluster_rendezvous_port": PORT,
        "cluster_job_name": JOB, "cluster_shared_root": str(root / "shared"), "cluster_code_dir": str(REPO / "tests/gpu"),
        "network_enabled": False, "container_enabled": False, "launch_runtime": "host",
        "cluster_run_dir": str(run_dir)}, indent=1))
    return inv


def missing_prerequisites(cpu: bool) -> list[str]:
    why = []
    for mod in ("torch", "ansible"):
        if importlib.util.find_spec(mod) is None:
            why.append(f"Python module {mod} is missing for {sys.executable} (ansible: install ansible-core's wheels, "
                       "e.g. with pip --target /tmp/site, and put that on PYTHONPATH)")
    if not cpu and not why:
        import torch
        if not torch.cuda.is_available():
            why.append("torch.cuda.is_available() is False: no GPU here (use --cpu-rehearsal on a CPU machine)")
    return why


def stable(paths: list[Path]) -> bool:
    """Every file exists, is not empty and did not grow over half a second (the watchdog finished writing)."""
    if not all(p.exists() and p.stat().st_size for p in paths):
        return False
    sizes = [p.stat().st_size for p in paths]
    time.sleep(0.5)
    return sizes == [p.stat().st_size for p in paths]


def stop(agents: list[subprocess.Popen]) -> None:
    """SIGTERM each torchrun agent (it passes it on to its worker), SIGKILL after 30 s."""
    for p in agents:
        if p.poll() is None:
            p.terminate()
    for p in agents:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--root", type=Path, default=Path("/tmp/trainyard-hang"))
    ap.add_argument("--timeout-s", type=int, default=20, help="the collective timeout of the job")
    ap.add_argument("--skip-at", type=int, default=20, help="the step whose all_reduce rank 1 skips")
    ap.add_argument("--numel", type=int, default=1 << 20, help="elements of the all_reduce")
    ap.add_argument("--cpu-rehearsal", action="store_true", help="gloo on the CPU, dumps written by hand")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"ok": False, "mode": "cpu-rehearsal (gloo)" if a.cpu_rehearsal else "gpu (nccl)",
                     "timeout_s": a.timeout_s, "skip_at": a.skip_at, "numel": a.numel, "python": sys.executable}

    def finish(code: int, why: str = "") -> int:
        if why:
            results["why"] = why
            print("hang_collect: FAILED: " + why, file=sys.stderr)
        (a.out / "hang_collect.json").write_text(json.dumps(results, indent=1))
        print(json.dumps(results, indent=1))
        return code

    why = missing_prerequisites(a.cpu_rehearsal)
    if why:
        return finish(2, "; ".join(why))
    shutil.rmtree(a.root, ignore_errors=True)
    run_dir = a.root / "runs" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    inv = inventory(a.root, run_dir)
    agents, logs = [], []
    for i in (0, 1):
        state = a.root / f"node{i}/state/{JOB}/{JOB_RW_DIR}"  # what the job writes: its job-writable directory
        (state / "flight_recorder").mkdir(parents=True)
        env = dict(os.environ, **GPU_ENV, TORCH_FR_BUFFER_SIZE="2000", TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
                   TORCH_NCCL_DUMP_ON_TIMEOUT="1", TORCH_NCCL_ENABLE_MONITORING="1",
                   TORCH_NCCL_ASYNC_ERROR_HANDLING="1",
                   TORCH_FR_DUMP_TEMP_FILE=str(state / "flight_recorder/rank_"),
                   TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(state / "flight_recorder/rank_"),
                   TRAINYARD_COLLECTIVE_TIMEOUT_S=str(a.timeout_s), OMP_NUM_THREADS="1")
        if a.cpu_rehearsal:
            env.update(GLOO_SOCKET_IFNAME="lo")
        else:
            env.update(CUDA_VISIBLE_DEVICES="0", NCCL_HOSTID=f"trainyard-gpu-node{i}", NCCL_P2P_DISABLE="1",
                       NCCL_SHM_DISABLE="1", NCCL_IB_DISABLE="1", NCCL_SOCKET_IFNAME="lo")
        log = state / "torchrun.log"
        logs.append(log)
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={i}", "--nproc_per_node=1",
             "--master_addr=127.0.0.1", f"--master_port={PORT}", "--max_restarts=0",
             str(REPO / "tests/gpu/hang_job.py"), "--skip-at", str(a.skip_at), "--numel", str(a.numel),
             "--backend", "gloo" if a.cpu_rehearsal else "nccl"],
            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT))
    dumps = [a.root / f"node{i}/state/{JOB}/{JOB_RW_DIR}/flight_recorder/rank_{i}" for i in (0, 1)]
    try:
        deadline = time.time() + 4 * a.timeout_s + 300
        hang_at = None
        while time.time() < deadline:
            if hang_at is None:
                m = re.search(r"hang injected: .* at ([0-9.]+)", logs[1].read_text(errors="replace"))
                hang_at = float(m.group(1)) if m else None
            if hang_at is not None and stable(dumps):
                break
            if all(p.poll() is not None for p in agents) and not all(d.exists() for d in dumps):
                break  # both agents gone and a dump missing: it will not come
            time.sleep(0.5)
        dumped_at = time.time()
        results.update(hang_at=hang_at, dumps={str(d): d.stat().st_size for d in dumps if d.exists()})
        if hang_at is None:
            return finish(1, "rank 1 never printed 'hang injected' (see torchrun-node1.log)")
        results["hang_to_dumps_s"] = round(dumped_at - hang_at, 1)
        if len(results["dumps"]) < 2:
            results["note"] = "not every rank dumped: collect.yml runs the analyzer with --allow-incomplete-ranks"
        # collect.yml right away, while the job is still hung (what the on-call engineer does)
        t0 = time.time()
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                   PYTHONUNBUFFERED="1")
        cp = subprocess.Popen([sys.executable, "-m", "ansible.cli.playbook", "-i", str(inv), "playbooks/collect.yml"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, named_at = [], None
        for line in cp.stdout:
            out.append(line)
            if named_at is None and "never joined collective" in line:
                named_at = time.time()
        cp.wait()
    finally:
        stop(agents)
        for i, log in enumerate(logs):
            if log.exists():
                shutil.copy(log, a.out / f"torchrun-node{i}.log")
    text = "".join(out)
    (a.out / "collect.log").write_text(text)
    for name in ("collect.md", "collect.json", "flight_recorder.txt"):
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, a.out / name)
    m = re.search(r"hang: rank 1 on gpu-node1 \(node rank 1, local rank 0\) never joined collective (\S+) "
                  r"\(sequence number (\d+), input sizes (\[\[.*?\]\])", text)
    results.update(collect_s=round(time.time() - t0, 1), collect_rc=cp.returncode,
                   hang_to_named_s=round(named_at - hang_at, 1) if named_at else None,
                   line=m.group(0) if m else None)
    if m:
        results.update(op=m.group(1), seq=int(m.group(2)), input_sizes=m.group(3))
    (a.out / "figures.md").write_text(
        "| figure (%s) | seconds |\n|---|---|\n| hang injected -> every rank's dump on disk (collective timeout %s s) "
        "| %s |\n| collect.yml (2 nodes, local connection) | %s |\n| hang injected -> rank and collective named | %s |\n"
        % (results["mode"], a.timeout_s, results["hang_to_dumps_s"], results["collect_s"], results["hang_to_named_s"]))
    if cp.returncode != 0:
        return finish(1, "collect.yml failed (exit %s): see collect.log" % cp.returncode)
    if not m:
        return finish(1, "collect.yml did not name rank 1 on gpu-node1 as the rank that never joined (collect.log, "
                         "flight_recorder.txt)")
    if "all_reduce" not in m.group(1) or m.group(3) != "[[%d]]" % a.numel:
        return finish(1, "collect.yml named rank 1 but not the skipped all_reduce of %d elements: %s"
                      % (a.numel, m.group(0)))
    results["ok"] = True
    return finish(0)


if __name__ == "__main__":
    sys.exit(main())
