#!/usr/bin/env python3
"""GPU acceptance: the product end to end on one GPU machine, two "nodes" on one host (tests/gpu/two-nodes).

    python3 tests/gpu/acceptance.py OUTDIR                  # a machine with >= 2 NVIDIA GPUs, as root
    python3 tests/gpu/acceptance.py OUTDIR --cpu-rehearsal  # the same steps on a CPU machine: the stand-in
                                                            # nvidia-smi, the CPU/gloo example, small sizes
    python3 tests/gpu/acceptance.py OUTDIR --mode container-llamafactory --engine DIR --site DIR [--stage S]
        # a machine with >= 1 NVIDIA GPU, as root: LLaMA-Factory in the training container, two nodes on one GPU,
        # through a docker engine and a local registry started from DIR (tests/gpu/container_mode.py says how)

Each step runs the product's own playbooks (ansible-playbook with a local connection) and is timed:
  1. site.yml: validation, preflight with the real nvidia_gpu_facts module, nccl env and ds_config.json
     rendered, the NCCL check across the two nodes (tcp profile), the report, the launch of a tiny random
     Llama + LoRA under DeepSpeed ZeRO-3 bf16 (examples/lora_zero3_train.py), waiting for its first step;
  2. once step 10 is saved on both nodes, kill -9 one rank of node 1; playbooks/status.yml until it names it;
  3. reset.yml; then nothing of the job is left;
  4. site.yml again: the job resumes from the last checkpoint, trains to the end, and its saved adapter holds
     every LoRA tensor, non-empty; the output roots' peak size is sampled throughout (the janitor prunes);
  5. playbooks/nccl_check.yml with NCCL's own socket defaults (the tuning variables left out), for the
     tcp profile's ratio;
  6. playbooks/nccl_check.yml on the whole machine as one node (tests/gpu/one-node: NVLink), and a plain
     torch.distributed all-reduce (tests/gpu/plain_allreduce.py) for comparison.
Writes OUTDIR/acceptance.json and OUTDIR/figures.md (logs and reports beside them); exits 1 when a step fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from helpers import wait_until  # noqa: E402  (the tests' one wait_until)
# The GPU machine's rule: NVLink multicast stays off in every program; DeepSpeed needs a plain arch list.
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
           "TORCH_CUDA_ARCH_LIST": "9.0"}


class Acceptance:
    def __init__(self, out: Path, rehearsal: bool, root: Path, mode: str = "two-nodes-host", nodes: int = 2,
                 gpus_per_node: int = 0):
        self.out, self.rehearsal, self.root = out, rehearsal, root
        self.inv = "tests/gpu/two-nodes-container" if mode == "container-llamafactory" else "tests/gpu/two-nodes"
        self.shape = None
        self.results: dict = {"steps": {}, "figures": {}, "ok": True}
        self.nodes = nodes if gpus_per_node else 2  # the fixed inventories have two nodes
        self.env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                        ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1", **GPU_ENV)
        if rehearsal:
            standin = out / "standin-bin"
            standin.mkdir(parents=True, exist_ok=True)
            link = standin / "nvidia-smi"
            if not link.exists():
                link.symlink_to(REPO / "tests/sim/standin/nvidia-smi")
            self.env.update(PATH=f"{standin}:{self.env['PATH']}",
                            TRAINYARD_STANDIN_DATA=str(REPO / "tests/data/nvidia-smi/h200x4"),
                            TRAINYARD_STANDIN_FAULT=str(out / "no-fault"))
        listing = subprocess.run(["nvidia-smi", "-L"], env=self.env, capture_output=True, text=True, check=True)
        self.ngpu = sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
        if gpus_per_node:  # an explicit shape: the inventory is written for it (tests/gpu/shape.py)
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import shape as shape_mod
            try:
                self.shape = shape_mod.inventory(out, "container" if mode == "container-llamafactory" else "host",
                                                 nodes, gpus_per_node, self.ngpu)
            except ValueError as e:
                sys.exit(str(e))
            self.inv = self.shape["path"]
            self.results["shape"] = self.shape
        if mode == "container-llamafactory":  # both nodes on GPU 0 unless a shape says otherwise
            if self.ngpu < 1:
                sys.exit("this machine shows no GPU; the container mode needs at least 1")
            self.extra = {"gpu_acceptance_root": str(root), "gpu_acceptance_repo": str(REPO),
                          "cluster_gpus_per_node": self.ngpu}
            if self.shape:
                self.extra["cluster_nproc_per_node"] = gpus_per_node
            return
        if self.ngpu < 2:
            sys.exit(f"this machine shows {self.ngpu} GPU(s); the acceptance needs at least 2")
        self.half = gpus_per_node or self.ngpu // 2
        self.extra = {"gpu_acceptance_root": str(root), "gpu_acceptance_repo": str(REPO),
                      "cluster_gpus_per_node": self.ngpu, "cluster_nproc_per_node": self.half}
        if rehearsal:  # no GPU: the CPU/gloo example and a small all-reduce
            self.extra.update(train_args_entrypoint=str(REPO / "examples/ddp_train.py"), nccl_check_size_mb=16,
                              train_args_options={"--steps": 40, "--save-every": 10, "--sleep": 0.5,
                                                  "--output-root": "{{ train_args_output_dir }}"},
                              nccl_check_min_intra_busbw_gbps=0,
                              nccl_check_min_inter_busbw_gbps=0)

    # ------------------------------------------------------------------------------------------ helpers
    def playbook(self, name: str, playbook: str, inventory: str | None = None, extra: dict | None = None,
                 args: tuple = ()) -> tuple[int, str, float]:
        """Run a playbook, log it as OUTDIR/<name>.log, record its wall time."""
        ev = dict(self.extra, cluster_run_dir=str(self.out / f"run-{name}"), **(extra or {}))
        argv = [sys.executable, "-m", "ansible.cli.playbook", "-i", inventory or self.inv, playbook, "-e",
                json.dumps(ev), *args]
        t0 = time.monotonic()
        r = subprocess.run(argv, cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        took = time.monotonic() - t0
        (self.out / f"{name}.log").write_text(r.stdout)
        self.results["steps"][name] = {"rc": r.returncode, "seconds": round(took, 1)}
        print(f"[acceptance] {name}: rc {r.returncode}, {took:.1f} s", flush=True)
        return r.returncode, r.stdout, took

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.results["steps"].setdefault(name, {})["check"] = {"ok": bool(ok), "detail": detail}
        print(f"[acceptance] {'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        self.results["ok"] &= bool(ok)
        return ok

    def node_dir(self, rank: int, what: str) -> Path:
        return self.root / f"node{rank}" / what

    def log_of(self, rank: int) -> str:
        path = self.node_dir(rank, "state") / "gpu-accept" / "job-rw" / "torchrun.log"  # the job-writable part
        if not path.exists():
            path = self.node_dir(rank, "state") / "gpu-accept" / "torchrun.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def complete_steps(self, rank: int) -> list[int]:
        base = self.node_dir(rank, "outputs")
        return sorted(int(p.parent.name.split("-")[1]) for p in base.glob("checkpoint-*/trainer_state.json")
                      if p.parent.name.split("-")[1].isdigit())

    def report(self, name: str) -> dict:
        path = self.out / f"run-{name}" / "report.json"
        return json.loads(path.read_text()) if path.exists() else {"records": []}

    def records(self, name: str, check: str) -> dict:
        return {r["host"]: r for r in self.report(name)["records"] if r["check"] == check}

    @staticmethod
    def task_seconds(log: str, task: str) -> float | None:
        """A task's duration from profile_tasks: printed on the timestamp line under the next task's header."""
        m = re.search(r"TASK \[" + re.escape(task) + r"\].*?\nTASK \[.*?\n[^\n]*\((\d+):(\d+):([\d.]+)\)", log, re.S)
        return round(int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)), 1) if m else None

    @staticmethod
    def wait(cond, timeout: float, step: float = 0.5):
        return wait_until(cond, timeout, step)

    @staticmethod
    def children(pid: int) -> list[int]:
        kids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry))
        return kids

    def ranks(self, pid: int) -> list[int]:
        """The rank processes under the job's launcher (pid): descendants running the entry point, not torchrun."""
        found, todo = [], [pid]
        while todo:
            for kid in self.children(todo.pop()):
                todo.append(kid)
                try:
                    argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                text = b" ".join(argv).decode(errors="replace")
                if re.search(r"(lora_zero3_train|ddp_train)\.py", text) and "torchrun" not in text \
                        and "torch.distributed.run" not in text and "launcher.py" not in text:
                    found.append(kid)
        return sorted(found)

    def peer_stop(self, rank: int, wait: float = 10) -> str:
        """Why node rank's job ended when the fail-fast watcher stopped it (its launch.exit.json), else ''. The
        launcher writes the record after its ranks ended: wait for it a little."""
        def read():
            for path in (self.node_dir(rank, "state") / "gpu-accept" / "job-rw" / "launch.exit.json",
                         self.node_dir(rank, "state") / "gpu-accept" / "launch.exit.json"):
                try:
                    return (json.loads(path.read_text()).get("peer_stop") or {}).get("reason", "")
                except (OSError, ValueError):
                    continue
            return ""
        return self.wait(read, wait, 0.2) or ""

    def sizes(self) -> int:
        total = 0
        for rank in (0, 1):
            for dirpath, _, files in os.walk(self.node_dir(rank, "outputs")):
                for f in files:
                    try:
                        total += os.lstat(os.path.join(dirpath, f)).st_size
                    except OSError:
                        pass
        return total

    # ------------------------------------------------------------------------------------------ steps
    def run(self) -> int:
        shutil.rmtree(self.root, ignore_errors=True)
        peak = {"bytes": 0}
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                peak["bytes"] = max(peak["bytes"], self.sizes())
                time.sleep(1)
        threading.Thread(target=sample, daemon=True).start()

        # 1. site.yml: preflight, render, NCCL check, launch (to the first step)
        rc, log, took = self.playbook("site", "site.yml")
        self.check("site", rc == 0, f"site.yml rc {rc} in {took:.1f} s")
        took_launch = self.task_seconds(log, "launch : Start torchrun")
        if took_launch is not None:
            self.results["figures"]["launch_to_first_step_s"] = took_launch
        smi = self.records("site", "nvidia_driver.smi")
        gmap = self.records("site", "nvidia_driver.gpu_map")
        fabric = self.records("site", "fabricmanager.fabric")
        inter = self.records("site", "nccl_check.inter_node")
        self.results["preflight"] = {h: {"smi": smi.get(h, {}).get("detail"), "gpu_map": gmap.get(h, {}).get("data"),
                                         "fabric": (fabric.get(h, {}).get("status"), fabric.get(h, {}).get("detail"))}
                                     for h in (f"gpu-node{i}" for i in range(self.nodes))}
        self.check("preflight", all(r.get("status") == "pass" for r in smi.values()) and len(smi) == self.nodes,
                   "; ".join(f"{h}: {r.get('detail')}" for h, r in sorted(smi.items())))
        busbw = (inter.get("gpu-node0") or {}).get("data", {}).get("busbw_gbps")
        self.results["figures"]["inter_busbw_tcp_profile_gbps"] = busbw
        if rc != 0:
            return self.finish(sampling)

        # 2. kill -9 one rank of node 1 after step 10 is saved on both nodes; status names it
        # The HF Trainer saves on every node (save_on_each_node); the CPU example only on rank 0's node.
        saved = self.wait(lambda: 10 in self.complete_steps(0) and (self.rehearsal or 10 in self.complete_steps(1)), 600)
        self.check("checkpoint", bool(saved), f"complete checkpoints: node0 {self.complete_steps(0)}, "
                   f"node1 {self.complete_steps(1)}")
        state = json.loads((self.node_dir(1, "state") / "gpu-accept" / "launch.json").read_text())
        ranks = self.ranks(int(state["pid"]))
        victim = ranks[0] if ranks else None
        self.check("kill", victim is not None, f"node 1 job {state['pid']} has rank processes {ranks}")
        if victim is None:
            return self.finish(sampling)
        survivors = self.ranks(int(json.loads((self.node_dir(0, "state") / "gpu-accept" / "launch.json")
                                              .read_text())["pid"]))
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        survivors_gone = self.wait(lambda: not any(Path(f"/proc/{p}").exists() for p in survivors), 300, 0.2)
        took = time.monotonic() - t_kill
        named = None
        while time.monotonic() - t_kill < 120:
            rc, log, _ = self.playbook("status", "playbooks/status.yml")
            named = re.search(r"first failure: node gpu-node1 \(node rank 1\), rank (\d+)[^\n]*", log)
            if named:
                break
        self.results["figures"]["kill_to_named_s"] = round(time.monotonic() - t_kill, 1)
        self.check("status", bool(named), named.group(0) if named else "status.yml never named gpu-node1")
        self.results["figures"]["kill_to_survivors_exit_s"] = round(took, 1)
        self.check("fail-fast", bool(survivors_gone) and took <= 15,
                   f"node 0's ranks ended {took:.1f} s after the kill (limit 15 s); node 0 ended: "
                   f"{self.peer_stop(0)}")
        last_saved = max(set(self.complete_steps(0)) & set(self.complete_steps(1 if not self.rehearsal else 0)),
                         default=0)

        # 3. reset.yml
        rc, log, took = self.playbook("reset", "reset.yml", extra={"reset_confirm": True})
        self.results["figures"]["reset_s"] = round(took, 1)
        self.check("reset", rc == 0, f"reset.yml rc {rc} in {took:.1f} s")

        # 4. relaunch: resumes from the last checkpoint saved on both nodes, trains to the end
        rc, log, took = self.playbook("relaunch", "site.yml")
        self.check("relaunch", rc == 0, f"site.yml rc {rc} in {took:.1f} s")
        resumed = re.search(r"trainyard: (resuming|resumed) from (\S+)", self.log_of(0))
        self.check("resume", bool(resumed) and resumed.group(2).rstrip(",").endswith(f"checkpoint-{last_saved}"),
                   f"{resumed.group(0) if resumed else 'no resume line'} (last checkpoint on both nodes: {last_saved})")
        done = self.wait(lambda: re.search(r"trainyard: adapter (\{.*\})", self.log_of(0)) or
                         ("exited" in self.log_of(0) and "Traceback" in self.log_of(0)), 900, 2)
        adapter = re.search(r"trainyard: adapter (\{.*\})", self.log_of(0))
        if self.rehearsal:
            self.check("adapter", bool(self.wait(lambda: 40 in self.complete_steps(0), 300)),
                       "CPU rehearsal: the example saved step 40 (no adapter to check)")
        else:
            info = json.loads(adapter.group(1)) if adapter else {}
            self.results["adapter"] = info
            self.check("adapter", bool(info) and info["lora_tensors"] == info["expected"] > 0 and not info["empty"],
                       f"saved adapter: {info or (str(done)[:300] if done else 'no result line')}")
        rc, log, _ = self.playbook("status-end", "playbooks/status.yml")
        sampling.set()
        self.results["figures"]["output_peak_bytes"] = peak["bytes"]
        self.results["figures"]["output_end_bytes"] = self.sizes()
        janitor_log = "\n".join(p.read_text(errors="replace") for p in self.root.glob("node*/state/gpu-accept/janitor*.log"))
        freed = [int(x) for x in re.findall(r"deleted (\d+) bytes", janitor_log)]
        self.results["figures"]["janitor_freed_bytes"] = sum(freed)

        # 5. NCCL's own socket defaults (no NSOCKS/NTHREADS lines) on the same two nodes, for the tcp profile's ratio
        env_path = "{{ cluster_state_dir }}/nccl-defaults.env"  # per node: both "nodes" share one filesystem
        rc, log, _ = self.playbook("nccl-defaults", "playbooks/nccl_check.yml",
                                   extra={"nccl_env_nsocks_perthread": 0, "nccl_env_socket_nthreads": 0,
                                          "nccl_env_path": env_path})
        inter_default = self.records("nccl-defaults", "nccl_check.inter_node").get("gpu-node0", {})
        self.results["figures"]["inter_busbw_nccl_defaults_gbps"] = inter_default.get("data", {}).get("busbw_gbps")
        self.check("nccl-defaults", rc == 0, inter_default.get("detail", "no record"))

        # 6. the whole machine as one node: intra-node all-reduce, and a plain torch.distributed one
        rc, log, _ = self.playbook("nccl-intra", "playbooks/nccl_check.yml", inventory="tests/gpu/one-node",
                                   extra={"cluster_nproc_per_node": self.ngpu})
        intra = self.records("nccl-intra", "nccl_check.intra_node").get("gpu-host", {})
        self.results["figures"]["intra_busbw_gbps"] = intra.get("data", {}).get("busbw_gbps")
        self.check("nccl-intra", rc == 0, intra.get("detail", "no record"))
        if not self.rehearsal:
            plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                    str(self.ngpu), str(REPO / "tests/gpu/plain_allreduce.py"), "1024"], cwd=REPO,
                                   env=self.env, capture_output=True, text=True)
            m = re.search(r"plain-allreduce:.*?busbw_gbps=([\d.]+)", plain.stdout + plain.stderr)
            self.results["figures"]["intra_plain_busbw_gbps"] = float(m.group(1)) if m else None
            (self.out / "plain-allreduce.log").write_text(plain.stdout + plain.stderr)
        return self.finish(sampling)

    def finish(self, sampling: threading.Event) -> int:
        sampling.set()
        f = self.results["figures"]
        tcp, dflt = f.get("inter_busbw_tcp_profile_gbps"), f.get("inter_busbw_nccl_defaults_gbps")
        if tcp and dflt:
            f["tcp_profile_ratio"] = round(float(tcp) / float(dflt), 2)
        intra, plain = f.get("intra_busbw_gbps"), f.get("intra_plain_busbw_gbps")
        if intra and plain:
            f["intra_vs_plain_pct"] = round(100.0 * (float(intra) - float(plain)) / float(plain), 1)
        (self.out / "acceptance.json").write_text(json.dumps(self.results, indent=2))
        lines = ["| step | rc | seconds | check |", "|---|---|---|---|"]
        for name, s in self.results["steps"].items():
            c = s.get("check") or {}
            lines.append(f"| {name} | {s.get('rc', '')} | {s.get('seconds', '')} | "
                         f"{'' if not c else ('PASS ' if c['ok'] else 'FAIL ') + c['detail'][:160]} |")
        lines += ["", "| figure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in f.items()]
        (self.out / "figures.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0 if self.results["ok"] else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="where logs, reports and figures go")
    p.add_argument("--cpu-rehearsal", action="store_true", help="stand-in nvidia-smi and the CPU example")
    p.add_argument("--root", type=Path, default=Path("/tmp/trainyard-gpu"), help="the nodes' files")
    p.add_argument("--mode", choices=["two-nodes-host", "container-llamafactory"], default="two-nodes-host",
                   help="two-nodes-host: the job on the host (>= 2 GPUs); container-llamafactory: LLaMA-Factory in "
                        "the training container (>= 1 GPU)")
    p.add_argument("--runtime", choices=["host", "container"],
                   help="host = --mode two-nodes-host, container = --mode container-llamafactory")
    p.add_argument("--nodes", type=int, default=2, help="inventory nodes on this machine (with --gpus-per-node)")
    p.add_argument("--gpus-per-node", type=int, default=0,
                   help="GPUs of each node: the inventory is written for NODES x G (tests/gpu/shape.py: own GPUs, "
                        "NCCL host id per node, P2P and SHM on); 0 keeps tests/gpu/two-nodes(-container)")
    p.add_argument("--stage", choices=["prepare", "run", "all"], default="all",
                   help="container mode: prepare (engine, registry, base image), run (image, playbooks), or both")
    p.add_argument("--engine", type=Path, help="container mode: the engine's binaries (bin/, lib/)")
    p.add_argument("--site", type=Path, help="container mode: LLaMA-Factory and its pinned packages (pip --target)")
    p.add_argument("--work", type=Path, default=Path("/tmp/trainyard-engine"),
                   help="container mode: the engine's and the registry's data")
    p.add_argument("--extra-vars", default="{}",
                   help="a JSON object of variables every playbook of the run gets (e.g. {\"cluster_burnin_tier\": "
                        "\"standard\"})")
    args = p.parse_args()
    try:
        extra_vars = json.loads(args.extra_vars)
        if not isinstance(extra_vars, dict):
            raise ValueError("not an object")
    except ValueError as e:
        p.error(f"--extra-vars must be a JSON object ({e})")
    if args.runtime:
        args.mode = "container-llamafactory" if args.runtime == "container" else "two-nodes-host"
    if args.nodes != 2 and not args.gpus_per_node:
        p.error("--nodes needs --gpus-per-node (the shape's inventory is written for both)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.mode == "container-llamafactory":
        return container_main(args)
    acc = Acceptance(args.out.resolve(), args.cpu_rehearsal, args.root, nodes=args.nodes,
                     gpus_per_node=args.gpus_per_node)
    acc.extra.update(extra_vars)
    return acc.run()


def container_main(args) -> int:
    """LLaMA-Factory in the training container (tests/gpu/container_mode.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import container_mode as cm

    if not args.engine:
        sys.exit("--mode container-llamafactory needs --engine DIR (dockerd, containerd, runc, docker, docker-registry)")
    out = args.out.resolve()
    engine = cm.Engine(args.engine.resolve(), args.work)
    facts_path = out / "prepare.json"
    facts = json.loads(facts_path.read_text()) if facts_path.exists() else {}
    t0 = time.monotonic()
    facts.update(engine.up())
    facts["engine_up_s"] = round(time.monotonic() - t0, 1)
    if args.stage in ("prepare", "all"):
        facts.update(cm.build_base(engine, args.work))
        facts_path.write_text(json.dumps(facts, indent=2))
        print(json.dumps(facts, indent=2), flush=True)
        if args.stage == "prepare":
            return 0
    if not args.site:
        sys.exit("--stage run needs --site DIR (LLaMA-Factory and its pinned packages installed with pip --target)")
    facts.update(cm.register_driver_dir())
    facts.update(cm.build_image(engine, args.work, args.site.resolve()))
    acc = Acceptance(out, False, args.root, mode="container-llamafactory", nodes=args.nodes,
                     gpus_per_node=args.gpus_per_node)
    acc.extra.update(json.loads(args.extra_vars))
    acc.results["engine"] = facts
    rc = cm.ContainerAcceptance(acc, engine, args.work).run()
    acc.finish(threading.Event())
    return rc or (0 if acc.results["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
