"""GPU acceptance, container mode: LLaMA-Factory in the training container, two nodes on one GPU machine.

Used by `tests/gpu/acceptance.py --mode container-llamafactory` (any machine with >= 1 NVIDIA GPU, as root):

  prepare  a docker engine from Debian's packages (ENGINE: dockerd, containerd, containerd-shim-runc-v2, runc,
           docker-init, docker, docker-registry and Debian's libdevmapper/libseccomp in ENGINE/lib), a local
           registry (Debian's docker-registry) on 127.0.0.1:5000, and the base image assembled from this machine's
           own Python environment (its venv and the system's Python, without the NVIDIA driver's libraries), pushed
           to that registry;
  run      the LLaMA-Factory image (the base plus SITE, LLaMA-Factory and its pinned dependencies installed with
           pip --target) pushed to the registry and removed from the engine, so the container role really pulls
           it; a tiny random Llama and a tiny alpaca dataset in LLaMA-Factory's dataset_info.json format under the
           shared root; then the product: site.yml (both training containers, gpu mode auto = devices where the
           engine has no NVIDIA runtime, the first LoRA + ZeRO-3 step), kill -9 of node 1's rank, status.yml naming
           it, reset.yml, site.yml resuming every node from its own copy of the last checkpoint, and the saved
           adapter holding every LoRA tensor, non-empty.

Each stage can run in its own call (a machine may carry only so many bytes per call); `all` runs both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REGISTRY = "127.0.0.1:5000"
BASE = f"{REGISTRY}/trainyard/torch-base:local"
IMAGE = f"{REGISTRY}/trainyard/llamafactory:0.9.5"
SOCK = "/var/run/docker.sock"
# Packages of the machine's environment the job does not import (kept out of the image to keep its push short).
VENV_EXCLUDES = ["jax", "jaxlib", "jax_cuda13_plugin", "jax_cuda13_pjrt", "jax_plugins", "cupy", "cupyx",
                 "cupy_backends", "torch_geometric", "onnx", "onnxruntime", "onnxscript", "onnx_ir", "cv2",
                 "opencv_python_headless.libs", "sklearn", "scikit_learn.libs", "skimage", "flax", "optax", "orbax",
                 "chex", "tensorstore", "equinox", "diffrax", "lineax", "optimistix", "e3nn", "botorch", "gpytorch",
                 "linear_operator", "numpyro", "xarray", "statsmodels", "seaborn", "lightning", "pytorch_lightning",
                 "sentence_transformers", "timm", "numba", "numba_cuda", "llvmlite", "mpi4py", "tensorboard_data_server"]
# The driver's user-space files never go into an image: the container role mounts the node's own.
DRIVER_GLOBS = ["libcuda.so*", "libcudadebugger.so*", "libnvidia-*.so*", "libnvcuvid.so*", "libnvoptix.so*",
                "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-*"]


def sh(argv, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("check", True)
    print("[container-mode] $", " ".join(str(a) for a in argv), flush=True)
    return subprocess.run([str(a) for a in argv], **kw)


class Engine:
    """dockerd and the registry from ENGINE, started in their own sessions (they outlive one call)."""

    def __init__(self, engine: Path, work: Path):
        self.engine, self.work = engine, work
        self.env = dict(os.environ, PATH=f"{engine}/bin:{os.environ['PATH']}",
                        LD_LIBRARY_PATH=":".join(p for p in (f"{engine}/lib", os.environ.get("LD_LIBRARY_PATH"))
                                                 if p))

    def docker(self, *args, **kw):
        kw["env"] = dict(self.env, **(kw.get("env") or {}))
        return sh([f"{self.engine}/bin/docker", *args], **kw)

    def up(self) -> dict:
        facts = {}
        if not Path(SOCK).exists() or self.docker("version", check=False, capture_output=True).returncode != 0:
            data = self.work / "docker"
            data.mkdir(parents=True, exist_ok=True)
            log = open(self.work / "dockerd.log", "ab")
            subprocess.Popen([f"{self.engine}/bin/dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none",
                              "--storage-driver=overlay2", f"--data-root={data}/data", f"--exec-root={data}/exec",
                              f"--pidfile={data}/dockerd.pid", "-H", f"unix://{SOCK}"],
                             env=self.env, stdout=log, stderr=log, start_new_session=True)
            t0 = time.monotonic()
            while self.docker("version", check=False, capture_output=True).returncode != 0:
                if time.monotonic() - t0 > 60:
                    sys.exit("dockerd did not answer in 60 s: " + (self.work / "dockerd.log").read_text()[-2000:])
                time.sleep(0.5)
            facts["dockerd_start_s"] = round(time.monotonic() - t0, 1)
        if not self.registry_up():
            conf = self.work / "registry.yml"
            conf.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {self.work}/registry\n"
                            f"http:\n  addr: {REGISTRY}\n")
            log = open(self.work / "registry.log", "ab")
            subprocess.Popen([f"{self.engine}/bin/docker-registry", "serve", str(conf)], env=self.env, stdout=log,
                             stderr=log, start_new_session=True)
            t0 = time.monotonic()
            while not self.registry_up():
                if time.monotonic() - t0 > 30:
                    sys.exit("the registry did not answer in 30 s: " + (self.work / "registry.log").read_text()[-2000:])
                time.sleep(0.3)
        info = json.loads(self.docker("info", "--format", "{{json .}}", capture_output=True, text=True).stdout)
        facts.update(server_version=info.get("ServerVersion"), runtimes=sorted(info.get("Runtimes") or {}),
                     storage_driver=info.get("Driver"))
        return facts

    @staticmethod
    def registry_up() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", 5000), timeout=1) as s:
                s.sendall(b"GET /v2/ HTTP/1.0\r\n\r\n")
                return b"200" in s.recv(64)
        except OSError:
            return False


def _tar(out: Path, paths: list[str], excludes: list[str], cwd: str = "/") -> None:
    argv = ["tar", "-C", cwd, "--numeric-owner", "-cf", str(out)]
    for e in excludes:
        argv.append(f"--exclude={e}")
    sh(argv + paths)


def build_base(engine: Engine, work: Path) -> dict:
    """The base image: this machine's system (usr-merged /usr, /etc) and its Python venv, in a few layers so that
    pushing and pulling them runs in parallel; nothing of the NVIDIA driver."""
    t0 = time.monotonic()
    ctx = work / "ctx-base"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    venv = Path(sys.prefix)  # the Python running this: the machine's own environment
    base_prefix = Path(sys.base_prefix)
    site = Path(next(p for p in sys.path if p.endswith("site-packages") and p.startswith(str(venv))))
    rel = lambda p: str(Path(p).relative_to("/"))  # noqa: E731
    drivers = [f"*/{g}" for g in DRIVER_GLOBS]
    system_ex = ["usr/local/cuda*", "usr/local/nvidia", "usr/share/doc", "usr/share/man", "usr/share/locale",
                 "usr/share/info", "usr/src", "usr/include", "usr/lib/debug", "usr/lib/firmware", "usr/lib/modules",
                 "opt/nvidia", *drivers]
    roots = [p for p in ("bin", "sbin", "lib", "lib64", "usr", "etc") if os.path.lexists(f"/{p}")]
    if not str(base_prefix).startswith("/usr"):
        roots.append(rel(base_prefix))
    jobs = []
    parts = {"system.tar": (roots, system_ex),
             "venv-nvidia.tar": ([rel(site / "nvidia")], drivers),
             "venv-torch.tar": ([rel(site / "torch")], drivers),
             "venv-rest.tar": ([rel(venv)], [rel(site / "nvidia"), rel(site / "torch"),
                                             *[rel(site / n) for n in VENV_EXCLUDES],
                                             *[rel(site / n) + "-*" for n in VENV_EXCLUDES], *drivers])}
    for name, (paths, ex) in parts.items():
        argv = ["tar", "-C", "/", "--numeric-owner", "-cf", str(ctx / name)] + [f"--exclude={e}" for e in ex] + paths
        jobs.append(subprocess.Popen(argv, stderr=subprocess.PIPE, text=True))
    for j in jobs:
        _, err = j.communicate()
        if j.returncode not in (0, 1):  # 1: a file changed while read
            sys.exit(f"tar failed: {err[-2000:]}")
    sizes = {n: (ctx / n).stat().st_size for n in parts}
    (ctx / "Dockerfile").write_text(
        "FROM scratch\n" + "".join(f"ADD {n} /\n" for n in parts)
        + f"ENV PATH={venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")
    engine.docker("build", "-q", "-t", BASE, str(ctx), env=dict(engine.env, DOCKER_BUILDKIT="0"))
    t_build = time.monotonic() - t0
    engine.docker("push", "-q", BASE)
    shutil.rmtree(ctx, ignore_errors=True)
    return {"base_layers_bytes": sizes, "base_build_s": round(t_build, 1),
            "base_push_s": round(time.monotonic() - t0 - t_build, 1), "venv": str(venv)}


def build_image(engine: Engine, work: Path, site_dir: Path) -> dict:
    """The training image: the base plus LLaMA-Factory and its pinned dependencies (one small layer), pushed, then
    removed from the engine so the container role pulls it from the registry."""
    t0 = time.monotonic()
    ctx = work / "ctx-lf"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    sh(["tar", "-C", str(site_dir), "--transform", "s,^\\.,opt/trainyard-site,", "-cf", str(ctx / "site.tar"), "."])
    # /tmp as every distribution image has it (1777): the base copies the machine's system without it, and the
    # hardened container's user (not root) makes its HOME there.
    (ctx / "tmp").mkdir()
    os.chmod(ctx / "tmp", 0o1777)
    sh(["tar", "-C", str(ctx), "--numeric-owner", "--owner=0", "--group=0", "-cf", str(ctx / "tmp.tar"), "tmp"])
    (ctx / "Dockerfile").write_text(f"FROM {BASE}\nADD site.tar /\nADD tmp.tar /\nENV PYTHONPATH=/opt/trainyard-site\n"
                                    "ENV HF_HUB_OFFLINE=1 DISABLE_VERSION_CHECK=1 TORCH_CUDA_ARCH_LIST=9.0\n")
    engine.docker("build", "-q", "-t", IMAGE, str(ctx), env=dict(engine.env, DOCKER_BUILDKIT="0"))
    engine.docker("push", "-q", IMAGE)
    digest = engine.docker("image", "inspect", "--format", "{{json .RepoDigests}}", IMAGE, capture_output=True,
                           text=True).stdout.strip()
    # The node's engine keeps the base (as a node that ran the job before would); the role pulls the new image and
    # with it the LLaMA-Factory layer from the registry.
    engine.docker("image", "rm", IMAGE, check=False)
    shutil.rmtree(ctx, ignore_errors=True)
    return {"image": IMAGE, "image_repo_digests": json.loads(digest or "[]"),
            "image_build_push_s": round(time.monotonic() - t0, 1)}


def register_driver_dir() -> dict:
    """The container role finds the driver's libraries in the ld cache, as nvidia-container-cli does. A machine
    whose driver directory is only on LD_LIBRARY_PATH gets it registered (/etc/ld.so.conf.d, ldconfig), as a driver
    installation does; the step is recorded."""
    cache = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    if "libcuda.so.1 " in cache:
        return {"driver_in_ld_cache": True}
    for d in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":")):
        if Path(d, "libcuda.so.1").exists():
            Path("/etc/ld.so.conf.d/trainyard-nvidia-driver.conf").write_text(d + "\n")
            sh(["/sbin/ldconfig"])
            return {"driver_in_ld_cache": False, "driver_dir_registered": d}
    return {"driver_in_ld_cache": False, "driver_dir_registered": None}


def make_model_and_data(shared: Path, layers: int = 4) -> dict:
    """A tiny random Llama with a locally trained BPE tokenizer, and a 64-row alpaca dataset described by
    LLaMA-Factory's dataset_info.json (no network)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    import torch

    data = shared / "data"
    data.mkdir(parents=True, exist_ok=True)
    words = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
             "upsilon phi chi psi omega").split()
    rows = [{"instruction": f"Name the letter after {words[i % 24]}.", "input": "",
             "output": f"The letter after {words[i % 24]} is {words[(i + 1) % 24]}."} for i in range(64)]
    (data / "trainyard_tiny.json").write_text(json.dumps(rows, indent=1))
    (data / "dataset_info.json").write_text(json.dumps({"trainyard_tiny": {"file_name": "trainyard_tiny.json"}}))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [r["instruction"] + " " + r["output"] for r in rows] * 4
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    model_dir = shared / "tiny-llama"
    fast.save_pretrained(model_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    # safetensors' save_file writes 0600: the job's user (not root in the hardened container) must read the weights,
    # as container.health.shared_readable checks. What a user does after that check names the file: chmod a+rX.
    for p in (shared, *shared.rglob("*")):
        p.chmod(p.stat().st_mode | (0o555 if p.is_dir() else 0o444))
    return {"model_layers": layers, "vocab": len(fast), "dataset_rows": len(rows)}


def safetensors_lora(path: Path) -> dict:
    """LoRA tensors of an adapter_model.safetensors, read from its header: {names, empty}."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    lora = {k: v for k, v in header.items() if k != "__metadata__" and "lora_" in k}
    empty = [k for k, v in lora.items() if not v.get("shape") or 0 in v["shape"]]
    return {"names": sorted(lora), "empty": empty}


class ContainerAcceptance:
    """The product's own playbooks against tests/gpu/two-nodes-container (steps as in the module docstring)."""

    def __init__(self, acc, engine: Engine, work: Path):
        self.a, self.engine, self.work = acc, engine, work
        self.inv = acc.inv
        self.hosts = (acc.shape or {}).get("hosts") or ["gpu-node0", "gpu-node1"]
        self.last = len(self.hosts) - 1  # the node whose rank is killed
        acc.env.update(PATH=engine.env["PATH"], LD_LIBRARY_PATH=engine.env["LD_LIBRARY_PATH"])

    # ---------------------------------------------------------------- several GPUs per node (a shape, shape.py)
    def own_gpus(self) -> bool:
        return bool(self.a.shape) and not self.a.shape["shared_gpus"] and len(self.a.shape["devices"][0]) > 1

    def plain_allreduce(self) -> None:
        """A plain torch.distributed all-reduce on node 0's GPUs, on the host, before anything else uses them: the
        reference for the NCCL check's intra-node figure; and the NVLink limit of one GPU (nvidia-smi nvlink -s)."""
        a, f = self.a, self.a.results["figures"]
        devs = ",".join(map(str, a.shape["devices"][0]))
        env = dict(a.env, CUDA_VISIBLE_DEVICES=devs)
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                            str(len(a.shape["devices"][0])), str(REPO / "tests/gpu/plain_allreduce.py"), "1024"],
                           cwd=REPO, env=env, capture_output=True, text=True)
        (a.out / "plain-allreduce.log").write_text(r.stdout + r.stderr)
        m = re.search(r"plain-allreduce:.*?busbw_gbps=([\d.]+)", r.stdout + r.stderr)
        f["intra_plain_busbw_gbps"] = float(m.group(1)) if m else None
        links = subprocess.run(["nvidia-smi", "nvlink", "-s", "-i", str(a.shape["devices"][0][0])],
                               capture_output=True, text=True).stdout
        (a.out / "nvlink-status.txt").write_text(links)
        speeds = [float(x) for x in re.findall(r"Link \d+: ([\d.]+) GB/s", links)]
        f["nvlink_links"] = len(speeds)
        f["nvlink_limit_gbps"] = round(sum(speeds), 1) if speeds else None

    def rank_pids(self) -> dict:
        """{(node, RANK, LOCAL_RANK): pid} of every rank process of the job (the containers share the host's PIDs)."""
        out = {}
        for i in range(len(self.hosts)):
            for pid in self.ranks(int(self.launch_state(i).get("pid", 0) or 0)):
                try:
                    env = dict(x.split(b"=", 1) for x in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                               if b"=" in x)
                except OSError:
                    continue
                out[(i, int(env.get(b"RANK", b"-1")), int(env.get(b"LOCAL_RANK", b"-1")))] = pid
        return out

    def launch_map_check(self) -> None:
        """Every rank on the GPU the launch map names (nvidia_driver.gpu_map: node, local rank -> GPU UUID): what
        nvidia-smi shows each rank's process using, read against the RANK/LOCAL_RANK in that process's environment."""
        a = self.a
        want_ranks = len(self.hosts) * len(a.shape["devices"][0])
        seen = {}

        def using():
            pids = self.rank_pids()
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                                  capture_output=True, text=True).stdout
            by_pid = {}
            for line in apps.splitlines():
                parts = [x.strip() for x in line.split(",")]
                if len(parts) == 2 and parts[0].isdigit():
                    by_pid.setdefault(int(parts[0]), set()).add(parts[1])
            seen.clear()
            seen.update({k: sorted(by_pid.get(pid, ())) for k, pid in pids.items()})
            return len(seen) == want_ranks and all(seen.values())
        a.wait(using, 120, 1)
        gmap = a.records("site", "nvidia_driver.gpu_map")
        rows, ok = [], len(seen) == want_ranks
        for (node, rank, local), uuids in sorted(seen.items()):
            planned = {m["local_rank"]: m["uuid"] for m in
                       ((gmap.get(self.hosts[node]) or {}).get("data") or {}).get("gpu_map") or []}
            match = uuids == [planned.get(local)]
            ok &= match
            rows.append({"node": self.hosts[node], "rank": rank, "local_rank": local, "planned": planned.get(local),
                         "used": uuids, "match": match})
        a.results["launch_map"] = rows
        a.check("launch_map", ok, f"{sum(r['match'] for r in rows)} of {want_ranks} ranks on the GPU the launch map "
                f"names: " + "; ".join(f"{r['node']} rank {r['rank']}/local {r['local_rank']} -> "
                                       f"{(r['used'] or ['none'])[0][:12]}" for r in rows))

    def socket_defaults(self) -> None:
        """The NCCL check again with NCCL's own socket defaults (no NSOCKS/NTHREADS lines), for the tcp profile's
        ratio; each node's env file in its own state directory."""
        a, f = self.a, self.a.results["figures"]
        rc, _, _ = a.playbook("nccl-defaults", "playbooks/nccl_check.yml", inventory=self.inv,
                              extra={"nccl_env_nsocks_perthread": 0, "nccl_env_socket_nthreads": 0,
                                     "nccl_env_path": "{{ cluster_state_dir }}/{{ cluster_job_name }}/job-ro/nccl-defaults.env"})
        rec = a.records("nccl-defaults", "nccl_check.inter_node").get(self.hosts[0]) or {}
        f["inter_busbw_nccl_defaults_gbps"] = (rec.get("data") or {}).get("busbw_gbps")
        a.check("nccl-defaults", rc == 0, rec.get("detail", "no record"))
        tcp, dflt = f.get("inter_busbw_tcp_profile_gbps"), f.get("inter_busbw_nccl_defaults_gbps")
        if tcp and dflt:
            a.check("tcp-profile", float(tcp) >= 2.5 * float(dflt),
                    f"tcp profile {tcp} GB/s against NCCL's socket defaults {dflt} GB/s: "
                    f"{float(tcp) / float(dflt):.2f}x (goal 2.5x)")

    def ranks(self, pid: int) -> list[int]:
        found, todo = [], [pid]
        while todo:
            for kid in self.a.children(todo.pop()):
                todo.append(kid)
                try:
                    text = Path(f"/proc/{kid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if "llamafactory.launcher" in text and "torchrun" not in text and "torch.distributed.run" not in text:
                    found.append(kid)
        return sorted(found)

    def launch_state(self, rank: int) -> dict:
        path = self.a.node_dir(rank, "state") / "gpu-accept" / "launch.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def run(self) -> int:
        a = self.a
        f = a.results["figures"]
        shutil.rmtree(a.root, ignore_errors=True)
        if self.own_gpus():
            self.plain_allreduce()
        a.results["data"] = make_model_and_data(a.root / "shared")
        expected = a.results["data"]["model_layers"] * 2 * 2  # q_proj, v_proj; lora_A and lora_B

        # 1. site.yml: preflight (gpu mode, gpu_visible), render, NCCL check, containers, launch to the first step
        rc, log, took = a.playbook("site", "site.yml", inventory=self.inv)
        a.check("site", rc == 0, f"site.yml rc {rc} in {took:.1f} s")
        f["launch_to_first_step_s"] = a.task_seconds(log, "launch : Start torchrun")
        gpus = a.records("site", "container.gpus")
        vis = a.records("site", "container.health.gpu_visible")
        pull = a.records("site", "container.image_pull")
        a.results["container"] = {h: {"gpus": (gpus.get(h) or {}).get("detail"),
                                      "gpu_mode": ((gpus.get(h) or {}).get("data") or {}).get("gpu_mode"),
                                      "gpu_visible": ((vis.get(h) or {}).get("status"), (vis.get(h) or {}).get("detail")),
                                      "pull": (pull.get(h) or {}).get("detail")}
                                  for h in self.hosts}
        a.check("gpu_visible", len(vis) == len(self.hosts) and all(r.get("status") == "pass" for r in vis.values()),
                "; ".join(f"{h}: {r.get('status')} {r.get('detail')}" for h, r in sorted(vis.items())))
        a.check("image_pull", any("pulled" in (r.get("detail") or "") for r in pull.values()),
                "; ".join(f"{h}: {r.get('detail')}" for h, r in sorted(pull.items())))
        inter = a.records("site", "nccl_check.inter_node").get("gpu-node0") or {}
        if self.a.shape and not self.a.shape["shared_gpus"]:
            f["inter_busbw_tcp_profile_gbps"] = (inter.get("data") or {}).get("busbw_gbps")
            a.results["nccl_check_inter_detail"] = inter.get("detail")
            intra = a.records("site", "nccl_check.intra_node")
            a.results["nccl_check_intra"] = {h: r.get("detail") for h, r in intra.items()}
            f["intra_busbw_gbps"] = ((intra.get("gpu-node0") or {}).get("data") or {}).get("busbw_gbps")
            plain = f.get("intra_plain_busbw_gbps")
            if f["intra_busbw_gbps"] and plain:
                a.check("intra-vs-plain", abs(float(f["intra_busbw_gbps"]) - plain) <= 0.05 * plain,
                        f"NCCL check intra-node {f['intra_busbw_gbps']} GB/s against a plain torch all-reduce "
                        f"{plain} GB/s on the same GPUs (within 5%); NVLink limit {f.get('nvlink_limit_gbps')} GB/s")
        else:
            f["inter_busbw_one_gpu_two_nodes_gbps"] = (inter.get("data") or {}).get("busbw_gbps")
        if rc != 0:
            return 1
        if self.own_gpus():
            self.launch_map_check()

        # 2. kill -9 node 1's rank once checkpoint-10 is complete on both nodes; status.yml names it
        k = self.last
        saved = a.wait(lambda: all(10 in a.complete_steps(i) for i in range(len(self.hosts))), 300, 0.2)
        a.check("checkpoint", bool(saved), "complete checkpoints: " + ", ".join(
            f"node{i} {a.complete_steps(i)}" for i in range(len(self.hosts))))
        ranks = self.ranks(int(self.launch_state(k).get("pid", 0) or 0))
        victim = ranks[-1] if ranks else None
        a.check("kill", victim is not None, f"node {k} job {self.launch_state(k).get('pid')} has rank processes {ranks}")
        if victim is None:
            return 1
        others = {i: self.ranks(int(self.launch_state(i).get("pid", 0) or 0)) for i in range(k)}
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        # fail-fast: every other node's ranks end within 15 s (the product stops them; NCCL alone took ~60 s)
        gone = a.wait(lambda: not any(Path(f"/proc/{p}").exists() for ps in others.values() for p in ps), 120, 0.2)
        took = time.monotonic() - t_kill
        f["kill_to_survivors_exit_s"] = round(took, 1)
        a.check("fail-fast", bool(gone) and took <= 15, f"the other nodes' ranks {others} ended {took:.1f} s after "
                f"the kill (limit 15 s); " + "; ".join(f"node {i}: {a.peer_stop(i) or 'no peer_stop record'}"
                                                      for i in others))
        named = None
        while time.monotonic() - t_kill < 120:
            rc, log, _ = a.playbook("status", "playbooks/status.yml", inventory=self.inv)
            named = re.search(r"first failure: node %s \(node rank %d\), rank (\d+)[^\n]*" % (self.hosts[k], k), log)
            if named:
                break
        f["kill_to_named_s"] = round(time.monotonic() - t_kill, 1)
        a.check("status", bool(named), named.group(0) if named else f"status.yml never named {self.hosts[k]}")
        last = max(set.intersection(*[set(a.complete_steps(i)) for i in range(len(self.hosts))]), default=0)

        # 3. reset.yml
        rc, log, took = a.playbook("reset", "reset.yml", inventory=self.inv, extra={"reset_confirm": True})
        f["reset_s"] = round(took, 1)
        a.check("reset", rc == 0, f"reset.yml rc {rc} in {took:.1f} s")

        # 4. site.yml again: every node resumes from its own copy of the last checkpoint and trains to the end
        rc, log, took = a.playbook("relaunch", "site.yml", inventory=self.inv)
        a.check("relaunch", rc == 0, f"site.yml rc {rc} in {took:.1f} s")
        f["relaunch_to_first_step_s"] = a.task_seconds(log, "launch : Start torchrun")
        own = {r: self.launch_state(r).get("resume_from", "") for r in range(len(self.hosts))}
        a.check("resume", all(own[r] == str(a.node_dir(r, "outputs") / f"checkpoint-{last}") for r in own),
                ", ".join(f"resume_from node{r} {own[r]}" for r in own) + f" (last checkpoint on every node: {last})")
        final = a.node_dir(0, "outputs") / "adapter_model.safetensors"
        done = a.wait(lambda: final.exists() and (a.node_dir(0, "outputs") / "train_results.json").exists(), 300, 2)
        log0 = a.log_of(0)
        cont = re.search(r"Continuing training from checkpoint[^\n]*|Resuming training from[^\n]*", log0)
        a.results["resume_log_line"] = cont.group(0) if cont else None
        state = {}
        if done:
            state = json.loads((a.node_dir(0, "outputs") / "trainer_state.json").read_text()) \
                if (a.node_dir(0, "outputs") / "trainer_state.json").exists() else {}
            info = safetensors_lora(final)
            a.results["adapter"] = {"path": str(final), "lora_tensors": len(info["names"]), "expected": expected,
                                    "empty": len(info["empty"]), "global_step": state.get("global_step")}
            a.check("adapter", len(info["names"]) == expected and not info["empty"],
                    f"saved adapter {final.name}: {len(info['names'])} of {expected} LoRA tensors, "
                    f"{len(info['empty'])} empty; trainer global_step {state.get('global_step')}")
        else:
            a.check("adapter", False, "training did not finish: " + log0[-1500:])
        a.playbook("status-end", "playbooks/status.yml", inventory=self.inv)
        if self.a.shape and not self.a.shape["shared_gpus"]:
            self.socket_defaults()
        return 0
