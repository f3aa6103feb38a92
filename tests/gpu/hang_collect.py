#!/usr/bin/env python3
"""GPU proof of the hang diagnosis: two "nodes" on ONE GPU (each torchrun agent claims its own NCCL host id, P2P and
SHM off, sockets over lo), a real NCCL job in which rank 1 skips one all_reduce (tests/gpu/hang_job.py). NCCL's
watchdog times out and dumps every rank's flight recorder (the variables nccl.env sets: TORCH_FR_BUFFER_SIZE,
TORCH_NCCL_DUMP_ON_TIMEOUT=1, TORCH_NCCL_ENABLE_MONITORING=1, TORCH_FR_DUMP_TEMP_FILE=<state>/<job>/job-rw/
flight_recorder/rank_); then playbooks/collect.yml (local connection, inventory written here) must name rank 1 on
gpu-node1, the collective (nccl:all_reduce), its sequence number and sizes.

    python3 tests/gpu/hang_collect.py OUTDIR [--root /tmp/trainyard-hang] [--timeout-s 20]

Figures (OUTDIR/hang_collect.json, OUTDIR/figures.md): seconds from the injected hang to the dumps on disk, the
collect.yml run, and from the hang to the line that names the rank. OUTDIR also gets the run's collect.md,
flight_recorder.txt, collect.json and the torchrun logs. Exits 1 when the rank or the collective is not named.
"""

from __future__ import annotations

import argparse
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
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def inventory(root: Path) -> Path:
    inv = root / "inventory"
    (inv / "group_vars").mkdir(parents=True, exist_ok=True)
    hosts = {"all": {"children": {"trainers": {"hosts": {
        f"gpu-node{i}": {"data_address": f"127.0.0.{i + 1}", "cluster_state_dir": str(root / f"node{i}/state"),
                         "cluster_output_root": str(root / f"node{i}/outputs")} for i in (0, 1)}}},
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}
    (inv / "hosts.yml").write_text(json.dumps(hosts, indent=1))
    (inv / "group_vars/all.yml").write_text(json.dumps({
        "cluster_gpus_per_node": 1, "cluster_nproc_per_node": 1, "cluster_rendezvous_port": 39519,
        "cluster_job_name": JOB, "cluster_shared_root": str(root / "shared"), "cluster_code_dir": str(REPO / "tests/gpu"),
        "network_enabled": False, "container_enabled": False, "launch_runtime": "host",
        "cluster_run_dir": str(root / "runs" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))}, indent=1))
    return inv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--root", type=Path, default=Path("/tmp/trainyard-hang"))
    ap.add_argument("--timeout-s", type=int, default=20, help="the collective timeout of the job")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(a.root, ignore_errors=True)
    inv = inventory(a.root)
    agents, logs = [], []
    for i in (0, 1):
        state = a.root / f"node{i}/state/{JOB}/{JOB_RW_DIR}"  # what the job writes: its job-writable directory
        (state / "flight_recorder").mkdir(parents=True)
        (state / "progress").mkdir()
        env = dict(os.environ, **GPU_ENV, CUDA_VISIBLE_DEVICES="0", NCCL_HOSTID=f"trainyard-gpu-node{i}",
                   NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_IB_DISABLE="1", NCCL_SOCKET_IFNAME="lo",
                   TORCH_FR_BUFFER_SIZE="2000", TORCH_NCCL_TRACE_BUFFER_SIZE="2000", TORCH_NCCL_DUMP_ON_TIMEOUT="1",
                   TORCH_NCCL_ENABLE_MONITORING="1", TORCH_NCCL_ASYNC_ERROR_HANDLING="1",
                   TORCH_FR_DUMP_TEMP_FILE=str(state / "flight_recorder/rank_"),
                   TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(state / "flight_recorder/rank_"),
                   TRAINYARD_COLLECTIVE_TIMEOUT_S=str(a.timeout_s), TRAINYARD_PROGRESS_DIR=str(state / "progress"))
        log = state / "torchrun.log"
        logs.append(log)
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={i}", "--nproc_per_node=1",
             "--master_addr=127.0.0.1", "--master_port=39519", "--max_restarts=0",
             str(REPO / "tests/gpu/hang_job.py")], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT))
    dumps = [a.root / f"node{i}/state/{JOB}/{JOB_RW_DIR}/flight_recorder/rank_{i}" for i in (0, 1)]
    deadline = time.time() + 10 * a.timeout_s + 300
    hang_at = dumped_at = None
    while time.time() < deadline and not (hang_at and all(d.exists() and d.stat().st_size for d in dumps)):
        m = re.search(r"hang injected: .* at ([0-9.]+)", logs[1].read_text(errors="replace"))
        hang_at = float(m.group(1)) if m else None
        time.sleep(0.5)
    dumped_at = time.time()
    for p in agents:
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
    results = {"hang_at": hang_at, "dumps": [str(d) for d in dumps if d.exists()], "ok": False}
    t0 = time.time()
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    cp = subprocess.Popen([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv),
                           "playbooks/collect.yml"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    out, named_at = [], None
    for line in cp.stdout:
        out.append(line)
        if named_at is None and "never joined collective" in line:
            named_at = time.time()
    cp.wait()
    text = "".join(out)
    (a.out / "collect.log").write_text(text)
    m = re.search(r"hang: rank 1 on gpu-node1 \(node rank 1, local rank 0\) never joined collective (\S+) "
                  r"\(sequence number (\d+), input sizes (\[\[.*?\]\])", text)
    results.update(ok=bool(m and "all_reduce" in m.group(1)), line=m.group(0) if m else None,
                   collect_s=round(time.time() - t0, 1), collect_rc=cp.returncode,
                   hang_to_dumps_s=round(dumped_at - hang_at, 1) if hang_at else None,
                   hang_to_named_s=round(named_at - hang_at, 1) if (hang_at and named_at) else None)
    run = re.search(r"Summary: (\S+)/collect\.md", text)
    if run:
        for name in ("collect.md", "collect.json", "flight_recorder.txt"):
            src = Path(run.group(1)) / name
            if src.exists():
                shutil.copy(src, a.out / name)
    for i, log in enumerate(logs):
        shutil.copy(log, a.out / f"torchrun-node{i}.log")
    (a.out / "hang_collect.json").write_text(json.dumps(results, indent=1))
    (a.out / "figures.md").write_text(
        "| figure | seconds |\n|---|---|\n| hang injected -> every rank's dump on disk (collective timeout %ss) | %s |\n"
        "| collect.yml (2 nodes, local connection) | %s |\n| hang injected -> rank and collective named | %s |\n"
        % (a.timeout_s, results["hang_to_dumps_s"], results["collect_s"], results["hang_to_named_s"]))
    print(json.dumps(results, indent=1))
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
