#!/usr/bin/env python3
"""The simulated cluster: GPU-node look-alikes as containers on one machine.

    simcluster.py images                         build (or reuse) the node and training images
    simcluster.py up   --name ty --nodes 3 --data-mtu 9000
    simcluster.py up   --name ty --nodes 2 --kind plain --data-mtu 1450
    simcluster.py up   --name ty --nodes 64 --kind light
    simcluster.py up   --name ty --nodes 3 --slurm   (the node kind with a real Slurm: slurmctld, slurmd, munge)
    simcluster.py down --name ty
    simcluster.py list

Each node has its own hostname, network namespace, filesystem, /tmp, /dev/shm and process table, runs
sshd (Ansible connects over SSH) and its own docker engine (so a training container started with
`--network host` shares that node's network, as on a real cluster). Two networks:

* management (eth0): Ansible/SSH and registry pulls. Never touched by the product.
* data (eth1): NCCL/gloo traffic; its MTU is chosen at bring-up and tasks may change it per node
  (the nodes hold NET_ADMIN).

The training image is pushed to the local registry (tests/sim/engine.py) and each node's engine pulls
it from there. A stand-in `nvidia-smi` (tests/sim/standin/) that replays real captured outputs is copied
into every node; the nodes have no GPUs.

`--kind plain` brings up nodes as a GPU marketplace rents them: each node is a plain container (sshd and
Python with CPU torch, no docker engine, no systemd), reached over SSH on a port mapped on 127.0.0.1, with
two networks: an internet-bridge-like network (eth0: default route, the mapped SSH port, MTU 1500) and a
private overlay (eth1: an internal network, MTU --data-mtu, e.g. 1450). The inventory it writes is built by
the inventory plugin `vast_instances` from the provider CLI's raw instance list (`vastai show instances
--raw`), generated for these nodes in that format (tests/data/vast/).

`--kind light` brings up many cheap nodes for scale measurements (tests/bench/run.py --only scale): each node
is a container of the Debian base tree only (sshd, Python, iproute2, ping: no engine, no torch, default
capabilities plus NET_ADMIN), on the same management and data networks as the default kind. Its inventory
switches off, through the product's own variables, what needs an engine or torch on the node
(container_enabled: false, launch_runtime: host, nccl_check_enabled: false); the launch play needs torch on the
node, so runs on light nodes leave it out (--skip-tags launch). 64 light nodes fit on a 2-core, 24 GiB machine.

`--slurm` (node kind only) runs the cluster on the slurm node image: the node image plus Debian's slurmctld, slurmd,
slurm-client and munge (Slurm 22.05), built from the node image's recipe-tagged ref only when a Slurm cluster is
asked for, so `make images` and the default clusters do not pay for it. The sim writes one munge key per cluster
and a slurm.conf naming the cluster's nodes (by their management addresses) into every node; the node's init starts
munged, slurmctld (head only) and slurmd once they are there (and again after a restart), as it starts the docker
engine. No accounting daemon (slurmdbd needs a database): `sacct` answers "accounting storage is disabled" and a
finished job stays in `scontrol show job` for MinJobAge (one hour). A second user (SLURM_OTHER_USER) exists on every
node, to submit a job that is not the product's.

Everything a cluster creates carries the label trainyard.sim=<name>; `down` removes exactly that.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine  # noqa: E402  (sibling module: registry port, cache dir)

CACHE = engine.CACHE_DIR
LABEL = "trainyard.sim"
NODE_IMAGE = "trainyard-sim-node"
TRAIN_REPO = "trainyard/train"
TRAIN_TAG = "sim"
SUITE = "bookworm"
BASE_PACKAGES = ["python3", "openssh-server", "iproute2", "iputils-ping", "procps", "ca-certificates"]
NODE_PACKAGES = ["docker.io", "iptables", "python3-docker", "python3-apt", "sudo", "kmod"]
TRAIN_PIP = ["torch==2.13.0", "tensorboard", "numpy"]
DEFAULT_NAME = "ty"
PLAIN_IMAGE = "trainyard-sim-plain"
LIGHT_IMAGE = "trainyard-sim-light"
KINDS = ("node", "plain", "light")
SLURM_IMAGE = "trainyard-sim-slurm"
SLURM_PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
SLURM_OTHER_USER = "tyother"
VAST_FIXTURES = REPO / "tests/data/vast"

NODE_INIT = """#!/bin/sh
# Node init of the simulated cluster: this node's own docker engine, then sshd in the foreground.
mkdir -p /run/sshd /var/log
dockerd --storage-driver=overlay2 \\
  --insecure-registry 172.16.0.0/12 --insecure-registry 198.51.100.0/24 \\
  >/var/log/dockerd.log 2>&1 &
exec /usr/sbin/sshd -D -e
"""

SLURM_INIT = """#!/bin/sh
# Node init of a simulated Slurm node: once the sim has written the cluster's munge key and slurm.conf (they stay
# across restarts), munged, slurmctld (on the node /etc/slurm/ctld-here marks) and slurmd start in the background;
# then the node's docker engine and sshd, as on every simulated node.
mkdir -p /run/sshd /var/log /var/log/slurm /var/spool/slurmd /var/spool/slurmctld /run/munge
chown munge:munge /run/munge
(
  while [ ! -s /etc/slurm/slurm.conf ] || [ ! -s /etc/munge/munge.key ]; do sleep 0.2; done
  runuser -u munge -- /usr/sbin/munged
  if [ -f /etc/slurm/ctld-here ]; then /usr/sbin/slurmctld; fi
  exec /usr/sbin/slurmd
) >/var/log/slurm/init.log 2>&1 &
dockerd --storage-driver=overlay2 \\
  --insecure-registry 172.16.0.0/12 --insecure-registry 198.51.100.0/24 \\
  >/var/log/dockerd.log 2>&1 &
exec /usr/sbin/sshd -D -e
"""

PLAIN_INIT = """#!/bin/sh
# Node init of a plain simulated node (a rented container): sshd in the foreground, nothing else.
mkdir -p /run/sshd /var/log
exec /usr/sbin/sshd -D -e
"""

SSHD_CONF = "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\nMaxSessions 100\nMaxStartups 200\n"


def log(msg: str) -> None:
    print(f"[sim] {msg}", flush=True)


def sh(argv: list[str], check: bool = True, capture: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=capture, text=True, **kw)
    if check and r.returncode != 0:
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(argv)}\n{r.stdout or ''}{r.stderr or ''}")
    return r


def docker(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return sh(["docker", *args], check=check, **kw)


# --------------------------------------------------------------------------- images

def recipe_hash(*parts: object) -> str:
    """A short tag that changes when an image's recipe (its package lists, init script) changes."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def apt_mirror() -> str:
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    return "http://deb.debian.org/debian"


def image_exists(ref: str) -> bool:
    return docker("image", "inspect", ref, check=False).returncode == 0


def base_rootfs() -> Path:
    tag = recipe_hash(SUITE, BASE_PACKAGES)
    root = CACHE / f"rootfs-base-{tag}"
    if (root / ".complete").exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    log(f"debootstrap {SUITE} (minbase) into {root}; about a minute, cached afterwards")
    sh(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(root),
        apt_mirror()], capture=True)
    (root / ".complete").write_text("ok\n")
    return root


def clone_tree(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    sh(["cp", "-a", str(src), str(dst)])
    (dst / ".complete").unlink(missing_ok=True)


def chroot_apt(root: Path, packages: list[str]) -> None:
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")
    sh(["chroot", str(root), "apt-get", "update", "-qq"], env=env)
    sh(["chroot", str(root), "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], env=env)
    sh(["chroot", str(root), "apt-get", "clean"], env=env)
    policy.unlink()
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)


def docker_import(root: Path, ref: str, changes: list[str]) -> None:
    argv = ["docker", "import"]
    for c in changes:
        argv += ["--change", c]
    argv += ["-", ref]
    tar = subprocess.Popen(["tar", "-C", str(root), "--exclude=./.complete", "-c", "."], stdout=subprocess.PIPE)
    r = subprocess.run(argv, stdin=tar.stdout, capture_output=True, text=True)
    tar.stdout.close()
    if tar.wait() != 0 or r.returncode != 0:
        raise SystemExit(f"docker import {ref} failed: {r.stderr}")


def build_node_image() -> str:
    ref = f"{NODE_IMAGE}:{recipe_hash(SUITE, BASE_PACKAGES, NODE_PACKAGES, NODE_INIT)}"
    if image_exists(ref):
        docker("tag", ref, f"{NODE_IMAGE}:latest")
        return ref
    base = base_rootfs()
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        root = Path(tmp) / "node"
        clone_tree(base, root)
        log(f"installing {' '.join(NODE_PACKAGES)} into the node image")
        chroot_apt(root, NODE_PACKAGES)
        import_node_tree(root, ref, NODE_INIT)
    docker("tag", ref, f"{NODE_IMAGE}:latest")
    return ref


def import_node_tree(root: Path, ref: str, init_script: str) -> None:
    """Finish a node's tree (init script, sshd configuration, fresh host keys) and import it as ref."""
    init = root / "usr/local/sbin/node-init"
    init.write_text(init_script)
    init.chmod(0o755)
    sshd_conf = root / "etc/ssh/sshd_config.d/trainyard-sim.conf"
    sshd_conf.write_text(SSHD_CONF)
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    sh(["chroot", str(root), "ssh-keygen", "-A"])
    log(f"importing {ref}")
    docker_import(root, ref, ['CMD ["/usr/local/sbin/node-init"]', "ENV LANG=C.UTF-8"])


def build_light_image() -> str:
    """The light node: the Debian base tree (sshd, Python, iproute2, ping) with sshd as its init, nothing else."""
    ref = f"{LIGHT_IMAGE}:{recipe_hash(SUITE, BASE_PACKAGES, PLAIN_INIT, SSHD_CONF, 'light-v1')}"
    if image_exists(ref):
        docker("tag", ref, f"{LIGHT_IMAGE}:latest")
        return ref
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        root = Path(tmp) / "light"
        clone_tree(base_rootfs(), root)
        import_node_tree(root, ref, PLAIN_INIT)
    docker("tag", ref, f"{LIGHT_IMAGE}:latest")
    return ref


def build_on(base: str, image: str, ref: str, init: str, steps: str, files: dict[str, str] | None = None,
             network: str = "default") -> str:
    """Build ref FROM base (a recipe-tagged ref): the node init, the given files in the context, steps (Dockerfile
    lines), then the init as CMD; tag it image:latest. An existing ref is reused."""
    if not image_exists(ref):
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            ctx = Path(tmp)
            (ctx / "node-init").write_text(init)
            (ctx / "node-init").chmod(0o755)
            for name, text in (files or {}).items():
                (ctx / name).write_text(text)
            (ctx / "Dockerfile").write_text(
                f"FROM {base}\nCOPY node-init /usr/local/sbin/node-init\n{steps}CMD [\"/usr/local/sbin/node-init\"]\n")
            log(f"building {ref} from {base}")
            docker("build", "-q", "--network", network, "-t", ref, str(ctx))
    docker("tag", ref, f"{image}:latest")
    return ref


def build_slurm_image() -> str:
    """The slurm node: the node image (by its recipe-tagged ref) plus Slurm and munge from Debian, its own init."""
    node = build_node_image()
    ref = f"{SLURM_IMAGE}:{recipe_hash(node, SLURM_PACKAGES, SLURM_INIT, SLURM_OTHER_USER, 'slurm-v1')}"
    # The package mirror is reached on the host's network (the build's default bridge may not route to it).
    return build_on(node, SLURM_IMAGE, ref, SLURM_INIT,
                    "RUN printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d"
                    " && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq"
                    f" --no-install-recommends {' '.join(SLURM_PACKAGES)}"
                    " && apt-get clean && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d /etc/munge/munge.key"
                    f" && useradd -m -u 2001 -s /bin/sh {SLURM_OTHER_USER}\n", network="host")


def slurm_conf(name: str, nodes: list[str], mgmt_ips: list[str], cpus: int) -> str:
    """The cluster's slurm.conf: the head runs slurmctld, every node slurmd; no cgroups, no accounting daemon."""
    node_lines = "\n".join(f"NodeName={n} NodeAddr={ip} CPUs={cpus} State=UNKNOWN" for n, ip in zip(nodes, mgmt_ips))
    return (
        f"# Generated by tests/sim/simcluster.py for the simulated cluster '{name}'.\n"
        f"ClusterName={name.lower().replace('-', '')[:30] or 'sim'}\n"
        f"SlurmctldHost={nodes[0]}({mgmt_ips[0]})\n"
        "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
        "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nSchedulerType=sched/backfill\n"
        "MpiDefault=none\nSwitchType=switch/none\nReturnToService=2\nMinJobAge=3600\nKillWait=30\n"
        "SlurmdTimeout=60\nInactiveLimit=0\n"
        "StateSaveLocation=/var/spool/slurmctld\nSlurmdSpoolDir=/var/spool/slurmd\n"
        "SlurmctldPidFile=/run/slurmctld.pid\nSlurmdPidFile=/run/slurmd.pid\n"
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log\nSlurmdLogFile=/var/log/slurm/slurmd.log\n"
        f"{node_lines}\n"
        "PartitionName=trainers Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")


def provision_slurm(name: str, nodes: list[str], mgmt_ips: list[str]) -> None:
    """One munge key for the cluster, the cluster's slurm.conf last (the node init waits for both)."""
    key_path = state_dir(name) / "munge.key"
    if not key_path.exists():
        key_path.write_bytes(os.urandom(1024))
        key_path.chmod(0o600)
    conf = slurm_conf(name, nodes, mgmt_ips, os.cpu_count() or 1)

    def one(node: str) -> None:
        docker("exec", "-i", node, "sh", "-c",
               "umask 077 && cat > /etc/munge/munge.key && chown munge:munge /etc/munge/munge.key "
               "&& chmod 400 /etc/munge/munge.key", input=key_path.read_bytes().hex())
        # munge reads the key as bytes: the hex text above is the key (2048 bytes), the same on every node.
        if node == nodes[0]:
            docker("exec", node, "touch", "/etc/slurm/ctld-here")
        docker("exec", "-i", node, "sh", "-c", "cat > /etc/slurm/slurm.conf.new && mv /etc/slurm/slurm.conf.new "
               "/etc/slurm/slurm.conf", input=conf)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, nodes))


def wait_slurm(name: str, head: str, n: int, timeout: float = 120) -> None:
    """Every node idle in sinfo on the head."""
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        r = docker("exec", head, "sinfo", "-h", "-N", "-o", "%N %t", check=False)
        out = r.stdout
        states = [ln.split()[1] for ln in out.splitlines() if len(ln.split()) == 2]
        if len(states) == n and all(s == "idle" for s in states):
            return
        time.sleep(0.5)
    raise SystemExit(f"cluster '{name}': Slurm nodes not all idle after {timeout:.0f} s: {out.strip() or r.stderr}"
                     f" (docker exec {head} cat /var/log/slurm/slurmctld.log)")


def torch_wheel() -> Path | None:
    for d in ("/opt/wheels", str(REPO / ".cache/wheels")):
        for w in sorted(Path(d).glob("torch-2.13.0*cp311*.whl")) if Path(d).is_dir() else []:
            return w
    return None


def build_train_image() -> str:
    ref = f"{TRAIN_REPO}:{recipe_hash(SUITE, BASE_PACKAGES, TRAIN_PIP, 'train-v2')}"
    if image_exists(ref):
        docker("tag", ref, f"{TRAIN_REPO}:{TRAIN_TAG}")
        return ref
    base = base_rootfs()
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        root = Path(tmp) / "train"
        clone_tree(base, root)
        site = root / "usr/local/lib/python3.11/dist-packages"
        site.mkdir(parents=True, exist_ok=True)
        wheel = torch_wheel()
        pkgs = [str(wheel) if (p.startswith("torch==") and wheel) else p for p in TRAIN_PIP]
        log(f"installing {' '.join(TRAIN_PIP)} into the training image (CPU torch)")
        sh([sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir", "--target", str(site), *pkgs])
        # Console scripts land in the target's bin/ with the builder's interpreter: write our own.
        shutil.rmtree(site / "bin", ignore_errors=True)
        # Headers, C++ test binaries and protoc are not needed to run jobs: a smaller image pulls faster.
        torch_dir = site / "torch"
        for sub in ("include", "test"):
            shutil.rmtree(torch_dir / sub, ignore_errors=True)
        for f in (torch_dir / "bin").glob("*"):
            if f.name != "torch_shm_manager" and f.is_file():
                f.unlink()
        for name, target in {"torchrun": "torch.distributed.run", "tensorboard": "tensorboard.main"}.items():
            script = root / "usr/local/bin" / name
            script.write_text(f"#!/usr/bin/python3\nimport sys\nfrom {target} import main\nsys.exit(main())\n")
            script.chmod(0o755)
        log(f"importing {ref}")
        docker_import(root, ref, ['CMD ["sleep", "infinity"]', "ENV LANG=C.UTF-8 PYTHONUNBUFFERED=1"])
    docker("tag", ref, f"{TRAIN_REPO}:{TRAIN_TAG}")
    return ref


def push_train_image() -> str:
    local = f"{TRAIN_REPO}:{TRAIN_TAG}"
    remote = f"127.0.0.1:{engine.REGISTRY_PORT}/{TRAIN_REPO}:{TRAIN_TAG}"
    docker("tag", local, remote)
    image_id = docker("image", "inspect", "-f", "{{.Id}}", local).stdout.strip()
    stamp = CACHE / "train-pushed"
    if stamp.exists() and stamp.read_text().strip() == image_id and registry_has(TRAIN_REPO, TRAIN_TAG):
        return remote
    log(f"pushing {remote}")
    docker("push", remote)
    stamp.write_text(image_id)
    return remote


def registry_has(repo: str, tag: str) -> bool:
    import urllib.request
    req = urllib.request.Request(f"http://127.0.0.1:{engine.REGISTRY_PORT}/v2/{repo}/manifests/{tag}",
                                 method="HEAD",
                                 headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def build_plain_image() -> str:
    """The plain node: the training image's tree (Debian base, Python, CPU torch) plus sshd as its init.

    Built on the training image's recipe-tagged ref (no second torch install); no docker engine, no systemd."""
    train = build_train_image()
    ref = f"{PLAIN_IMAGE}:{recipe_hash(train, PLAIN_INIT, SSHD_CONF, 'plain-v1')}"
    return build_on(train, PLAIN_IMAGE, ref, PLAIN_INIT,
                    "COPY trainyard-sim.conf /etc/ssh/sshd_config.d/trainyard-sim.conf\n"
                    "RUN rm -f /etc/ssh/ssh_host_* && ssh-keygen -A\n", {"trainyard-sim.conf": SSHD_CONF})


def cmd_images(_args: argparse.Namespace) -> None:
    t0 = time.monotonic()
    node = build_node_image()
    train = build_train_image()
    remote = push_train_image()
    log(f"images ready in {time.monotonic() - t0:.1f} s: {node}, {train} (registry: {remote})")


# --------------------------------------------------------------------------- cluster

def subnets(name: str) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """Management and data subnets for a cluster: 172.28.i.0/24 and 172.29.i.0/24, i from the name."""
    taken = set()
    for net in docker("network", "ls", "-q").stdout.split():
        info = json.loads(docker("network", "inspect", net).stdout)[0]
        if (info.get("Labels") or {}).get(LABEL) == name:
            continue
        for cfg in (info.get("IPAM") or {}).get("Config") or []:
            if cfg.get("Subnet"):
                taken.add(cfg["Subnet"])
    i = zlib.crc32(name.encode()) % 200 + 20
    for _ in range(220):
        mgmt, data = f"172.28.{i}.0/24", f"172.29.{i}.0/24"
        if mgmt not in taken and data not in taken:
            return ipaddress.ip_network(mgmt), ipaddress.ip_network(data)
        i = i % 250 + 1
    raise SystemExit("no free 172.28.x/172.29.x subnet pair for the simulated cluster")


def inventory_dir(name: str) -> Path:
    return REPO / "inventory" / ("sim" if name == DEFAULT_NAME else f"sim-{name}")


def state_dir(name: str) -> Path:
    return REPO / ".sim" / name


def node_names(name: str, n: int) -> list[str]:
    return [f"{name}-node{i}" for i in range(1, n + 1)]


def ssh_key(name: str) -> Path:
    d = state_dir(name)
    d.mkdir(parents=True, exist_ok=True)
    key = d / "id_ed25519"
    if not key.exists():
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"trainyard-sim-{name}", "-f", str(key)])
    return key


def start_node(name: str, node: str, mgmt_net: str, mgmt_ip: str, data_net: str, data_ip: str,
               image: str, kind: str = "node") -> None:
    if kind == "light":
        # Default capabilities plus NET_ADMIN (the network role may set the data MTU); no engine, no volume.
        docker("run", "-d", "--name", node, "--hostname", node, "--label", f"{LABEL}={name}",
               "--cap-add", "NET_ADMIN", "--tmpfs", "/run", "--tmpfs", "/tmp", "--shm-size", "64m",
               "--network", mgmt_net, "--ip", mgmt_ip, image)
        docker("network", "connect", "--ip", data_ip, data_net, node)
        return
    volume = f"{node}-docker"
    docker("volume", "create", "--label", f"{LABEL}={name}", volume)
    docker("run", "-d", "--name", node, "--hostname", node,
           "--label", f"{LABEL}={name}",
           "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
           "--security-opt", "seccomp=unconfined", "--security-opt", "systempaths=unconfined",
           "--tmpfs", "/run", "--tmpfs", "/tmp", "--shm-size", "512m",
           "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "-v", f"{volume}:/var/lib/docker",
           "--network", mgmt_net, "--ip", mgmt_ip, image)
    docker("network", "connect", "--ip", data_ip, data_net, node)


def provision_node(node: str, pubkey: str) -> None:
    """Authorise the cluster's SSH key and copy the stand-in nvidia-smi and its data in."""
    docker("exec", "-i", node, "sh", "-c",
           "mkdir -p -m 700 /root/.ssh && cat > /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys",
           input=pubkey)
    standin = REPO / "tests/sim/standin"
    if standin.is_dir():
        for f in sorted(standin.iterdir()):
            if f.is_file() and os.access(f, os.X_OK):
                docker("cp", str(f), f"{node}:/usr/local/bin/{f.name}")
    data = REPO / "tests/data/nvidia-smi/h200x4"
    if data.is_dir():
        docker("exec", node, "mkdir", "-p", "/usr/share/trainyard-standin")
        docker("cp", f"{data}/.", f"{node}:/usr/share/trainyard-standin/nvidia-smi")


def wait_ready(node: str, mgmt_ip: str, key: Path, timeout: float = 60, kind: str = "node") -> None:
    deadline = time.monotonic() + timeout
    probe = ["true"] if kind == "light" else ["docker", "info", "--format", "{{.ServerVersion}}"]
    ssh = ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
           "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=2", "-o", "BatchMode=yes", f"root@{mgmt_ip}", *probe]
    while time.monotonic() < deadline:
        if subprocess.run(ssh, capture_output=True).returncode == 0:
            return
        time.sleep(0.3)
    raise SystemExit(f"{node}: sshd/dockerd not ready after {timeout:.0f} s "
                     f"(docker exec {node} cat /var/log/dockerd.log)")


LIGHT_VARS = (
    "# Light nodes (simcluster.py up --kind light): sshd and Python only. What needs an engine or torch on the\n"
    "# node is off through the product's variables; the launch play needs torch (run with --skip-tags launch).\n"
    "container_enabled: false\n"
    "launch_runtime: host\n"
    "nccl_check_enabled: false\n"
    "cluster_preflight: {min_free_gb: 1, min_shm_mb: 32}\n"
    "# Dozens of nodes on two shared cores: the head's probe listener must outlive the tasks between its start and\n"
    "# the workers' connect (it still exits as soon as every worker connected).\n"
    "network_listener_s: 900\n")


def write_inventory(name: str, nodes: list[str], mgmt_ips: list[str], data_ips: list[str], key: Path,
                    mtu: int, gateway: str, kind: str = "node") -> Path:
    inv = inventory_dir(name)
    (inv / "group_vars").mkdir(parents=True, exist_ok=True)
    hosts = "\n".join(
        f"        {n}:\n          ansible_host: {m}\n          data_address: {d}"
        for n, m, d in zip(nodes, mgmt_ips, data_ips))
    (inv / "hosts.yml").write_text(
        f"---\n# Generated by tests/sim/simcluster.py for the simulated cluster '{name}'.\n"
        "all:\n  children:\n    trainers:\n      hosts:\n"
        f"{hosts}\n"
        "  vars:\n"
        "    ansible_user: root\n"
        f"    ansible_ssh_private_key_file: {key}\n"
        "    ansible_python_interpreter: /usr/bin/python3\n")
    (inv / "group_vars" / "all.yml").write_text(
        "---\n# Cluster variables, as a user sets them for a real cluster (see inventory/example-3x8-a100/).\n"
        "# The simulated nodes have no GPUs: a stand-in nvidia-smi replays a real H200 x4 node,\n"
        "# and the job runs one CPU process per node over gloo.\n"
        "cluster_gpus_per_node: 4\n"
        "cluster_nproc_per_node: 1\n"
        f"cluster_data_mtu: {mtu}\n"
        "cluster_data_iface: \"\"\n"
        "cluster_rendezvous_port: 39500\n"
        "cluster_output_root: /srv/outputs\n"
        "cluster_shared_root: /srv/shared\n"
        "cluster_code_dir: /srv/code\n"
        "cluster_job_name: train\n"
        "# Pre-imaged nodes: verify, do not install.\n"
        "nvidia_driver_install: false\n"
        "fabricmanager_install: false\n"
        "container_engine_install: false\n"
        "# The nodes run without CAP_SYS_RESOURCE: their engines cannot raise RLIMIT_MEMLOCK past the node's own\n"
        "# hard limit (8 MiB), so the training container asks for that instead of unlimited.\n"
        "container_ulimits: {memlock: 8388608, stack: 67108864}\n"
        "# CPU nodes: the NCCL check measures gloo over the data network; 64 MiB and CPU-sized floors\n"
        "# (gloo between simulated nodes on a 2-core machine: 0.3-0.7 GB/s; between two processes of one\n"
        "# node, -e cluster_nproc_per_node=2: about 0.8 GB/s, not the 50 GB/s of NVLink the default floor asks).\n"
        "nccl_check_size_mb: 64\n"
        "nccl_check_min_inter_busbw_gbps: 0.05\n"
        "nccl_check_min_intra_busbw_gbps: 0.05\n"
        f"container_image: {gateway}:{engine.REGISTRY_PORT}/{TRAIN_REPO}:{TRAIN_TAG}\n"
        + (LIGHT_VARS if kind == "light" else ""))
    meta = {"name": name, "kind": kind, "nodes": nodes, "mgmt": mgmt_ips, "data": data_ips, "mtu": mtu,
            "gateway": gateway, "key": str(key), "inventory": str(inv)}
    (state_dir(name) / "cluster.json").write_text(json.dumps(meta, indent=2))
    return inv


def free_ports(name: str, n: int) -> list[int]:
    """n consecutive TCP ports free on 127.0.0.1, starting from a base derived from the cluster name."""
    import socket
    base = 20000 + (zlib.crc32(name.encode()) % 400) * 100
    for start in range(base, base + 20000, 100):
        start = 20000 + (start - 20000) % 40000
        ok = True
        for port in range(start, start + n):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(start, start + n))
    raise SystemExit(f"no {n} free consecutive ports on 127.0.0.1 for the SSH ports of cluster '{name}'")


def start_plain_node(name: str, node: str, inet_net: str, inet_ip: str, ovl_net: str, ovl_ip: str,
                     ssh_port: int, image: str) -> None:
    """A rented container: default capabilities, no engine, SSH published on 127.0.0.1:<ssh_port>."""
    docker("run", "-d", "--name", node, "--hostname", node, "--label", f"{LABEL}={name}",
           "--tmpfs", "/run", "--tmpfs", "/tmp", "--shm-size", "512m",
           "--network", inet_net, "--ip", inet_ip, "-p", f"127.0.0.1:{ssh_port}:22", image)
    docker("network", "connect", "--ip", ovl_ip, ovl_net, node)


def wait_ssh(node: str, host: str, port: int, key: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    ssh = ["ssh", "-i", str(key), "-p", str(port), "-o", "StrictHostKeyChecking=no", "-o",
           "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=2", "-o", "BatchMode=yes",
           f"root@{host}", "true"]
    while time.monotonic() < deadline:
        if subprocess.run(ssh, capture_output=True).returncode == 0:
            return
        time.sleep(0.3)
    raise SystemExit(f"{node}: sshd not ready on {host}:{port} after {timeout:.0f} s (docker logs {node})")


def vast_rows(nodes: list[str], ports: list[int], inet_ips: list[str], ovl_ips: list[str], first_id: int,
              gpu_name: str, num_gpus: int) -> list[dict]:
    """The provider CLI's raw instance rows (`vastai show instances --raw`) for these nodes.

    Each row is the recorded row of tests/data/vast/show-instances.json with the fields the sim decides
    replaced: the same keys, types and shapes (ports as Docker's port map, local_ipaddrs as a string)."""
    template = json.loads((VAST_FIXTURES / "show-instances.json").read_text())[0]
    rows = []
    for i, (node, port, inet_ip, ovl_ip) in enumerate(zip(nodes, ports, inet_ips, ovl_ips)):
        row = json.loads(json.dumps(template))
        row.update({
            "id": first_id + i, "label": node, "machine_id": 9000 + i, "actual_status": "running",
            "intended_status": "running", "cur_state": "running", "next_state": "running",
            "gpu_name": gpu_name, "num_gpus": num_gpus, "public_ipaddr": "127.0.0.1",
            "ssh_host": "127.0.0.1", "ssh_port": port, "image_runtype": "ssh ssh_direc ssh_proxy",
            "ports": {"22/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]},
            "local_ipaddrs": f"{ovl_ip} {inet_ip}",
        })
        rows.append(row)
    return rows


def write_plain_inventory(name: str, nodes: list[str], ports: list[int], inet_ips: list[str],
                          ovl_ips: list[str], ovl_subnet: str, key: Path, mtu: int) -> Path:
    """Provider JSON (instances and overlays, in the CLI's --raw format) and the plugin inventory over it."""
    inv = inventory_dir(name)
    (inv / "group_vars").mkdir(parents=True, exist_ok=True)
    first_id = 31000000 + (zlib.crc32(name.encode()) % 1000) * 100
    rows = vast_rows(nodes, ports, inet_ips, ovl_ips, first_id, "H200", 4)
    (inv / "instances.vast.json").write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    overlays = [{"cluster_id": 88, "instances": [r["id"] for r in rows], "internal_subnet": ovl_subnet,
                 "name": f"{name}-overlay", "overlay_id": 700 + zlib.crc32(name.encode()) % 100}]
    (inv / "overlays.vast.json").write_text(json.dumps(overlays, indent=1, sort_keys=True) + "\n")
    (inv / "cluster.vast_instances.yml").write_text(
        f"---\n# Generated by tests/sim/simcluster.py for the plain simulated cluster '{name}'.\n"
        "plugin: vast_instances\n"
        "instances_file: instances.vast.json\n"
        "overlays_file: overlays.vast.json\n"
        f"overlay: {name}-overlay\n"
        "order_by: label\n"
        "host_vars:\n"
        f"  ansible_ssh_private_key_file: {key}\n"
        "  ansible_python_interpreter: /usr/bin/python3\n")
    # The reference inventory's variables, as a user copies them; the sim's own values in trainers.yml
    # (group trainers overrides group all).
    shutil.copy(REPO / "inventory/example-rented-overlay/group_vars/all.yml", inv / "group_vars" / "all.yml")
    (inv / "group_vars" / "trainers.yml").write_text(
        "---\n# The simulated cluster: CPU nodes (a stand-in nvidia-smi replays a real H200 x4 node),\n"
        "# one process per node over gloo; paths writable on a plain container.\n"
        "cluster_gpus_per_node: 4\n"
        "cluster_nproc_per_node: 1\n"
        "cluster_output_root: /srv/outputs\n"
        "cluster_shared_root: /srv/shared\n"
        "cluster_code_dir: /srv/code\n"
        "cluster_job_name: train\n"
        "cluster_preflight: {min_free_gb: 1, min_shm_mb: 64}\n"
        "# The all-reduce proves the overlay path; its speed is the shared machine's (0.02-0.7 GB/s seen under load).\n"
        "nccl_check_size_mb: 64\n"
        "nccl_check_min_inter_busbw_gbps: 0.001\n"
        "nccl_check_min_intra_busbw_gbps: 0.001\n")
    meta = {"name": name, "kind": "plain", "nodes": nodes, "mgmt": ["127.0.0.1"] * len(nodes),
            "ssh_ports": ports, "inet": inet_ips, "data": ovl_ips, "mtu": mtu, "key": str(key),
            "inventory": str(inv), "instance_ids": [r["id"] for r in rows]}
    (state_dir(name) / "cluster.json").write_text(json.dumps(meta, indent=2))
    return inv


def up_plain(args: argparse.Namespace, t0: float) -> None:
    name = args.name
    image = build_plain_image()
    inet, ovl = subnets(name)
    inet_net, ovl_net = f"{name}-inet", f"{name}-ovl"
    docker("network", "create", "--label", f"{LABEL}={name}", "--subnet", str(inet),
           "--gateway", str(inet.network_address + 1), inet_net)
    # The overlay: a private network without a gateway (no route out), MTU below the bridge's.
    docker("network", "create", "--label", f"{LABEL}={name}", "--internal", "--subnet", str(ovl),
           "--opt", f"com.docker.network.driver.mtu={args.data_mtu}", ovl_net)
    nodes = node_names(name, args.nodes)
    inet_ips = [str(inet.network_address + 10 + i) for i in range(1, args.nodes + 1)]
    ovl_ips = [str(ovl.network_address + 10 + i) for i in range(1, args.nodes + 1)]
    ports = free_ports(name, args.nodes)
    key = ssh_key(name)
    pubkey = key.with_suffix(".pub").read_text()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda a: start_plain_node(name, a[0], inet_net, a[1], ovl_net, a[2], a[3], image),
                      zip(nodes, inet_ips, ovl_ips, ports)))
        list(pool.map(lambda n: provision_node(n, pubkey), nodes))
        list(pool.map(lambda a: wait_ssh(a[0], "127.0.0.1", a[1], key), zip(nodes, ports)))
    inv = write_plain_inventory(name, nodes, ports, inet_ips, ovl_ips, str(ovl), key, args.data_mtu)
    took = time.monotonic() - t0
    (state_dir(name) / "bringup_seconds").write_text(f"{took:.1f}\n")
    log(f"cluster '{name}' up in {took:.1f} s: {args.nodes} plain nodes, overlay MTU {args.data_mtu}, "
        f"SSH on 127.0.0.1:{ports[0]}-{ports[-1]}, inventory {inv.relative_to(REPO)}")


def cmd_up(args: argparse.Namespace) -> None:
    t0 = time.monotonic()
    name = args.name
    if existing(name):
        log(f"cluster '{name}' exists; recreating it")
        cmd_down(args)
    if getattr(args, "kind", "node") == "plain":
        up_plain(args, t0)
        return
    kind = getattr(args, "kind", "node")
    slurm = getattr(args, "slurm", False)
    if slurm and kind != "node":
        raise SystemExit(f"--slurm needs --kind node (the Slurm daemons run beside each node's engine), not {kind}")
    node_image = build_light_image() if kind == "light" else build_slurm_image() if slurm else build_node_image()
    if kind == "node" and not args.no_train_image:
        build_train_image()
        push_train_image()
    mgmt, data = subnets(name)
    mgmt_net, data_net = f"{name}-mgmt", f"{name}-data"
    docker("network", "create", "--label", f"{LABEL}={name}", "--subnet", str(mgmt),
           "--gateway", str(mgmt.network_address + 1), mgmt_net)
    docker("network", "create", "--label", f"{LABEL}={name}", "--subnet", str(data),
           "--gateway", str(data.network_address + 1),
           "--opt", f"com.docker.network.driver.mtu={args.data_mtu}", data_net)
    nodes = node_names(name, args.nodes)
    mgmt_ips = [str(mgmt.network_address + 10 + i) for i in range(1, args.nodes + 1)]
    data_ips = [str(data.network_address + 10 + i) for i in range(1, args.nodes + 1)]
    key = ssh_key(name)
    pubkey = key.with_suffix(".pub").read_text()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda a: start_node(name, a[0], mgmt_net, a[1], data_net, a[2], node_image, kind),
                      zip(nodes, mgmt_ips, data_ips)))
        list(pool.map(lambda n: provision_node(n, pubkey), nodes))
        list(pool.map(lambda a: wait_ready(a[0], a[1], key, kind=kind), zip(nodes, mgmt_ips)))
    inv = write_inventory(name, nodes, mgmt_ips, data_ips, key, args.data_mtu, str(mgmt.network_address + 1),
                          kind)
    if slurm:
        provision_slurm(name, nodes, mgmt_ips)
        wait_slurm(name, nodes[0], len(nodes))
        meta_path = state_dir(name) / "cluster.json"
        meta = json.loads(meta_path.read_text())
        meta.update(slurm=True, slurm_other_user=SLURM_OTHER_USER)
        meta_path.write_text(json.dumps(meta, indent=2))
    took = time.monotonic() - t0
    (state_dir(name) / "bringup_seconds").write_text(f"{took:.1f}\n")
    log(f"cluster '{name}' up in {took:.1f} s: {args.nodes} {kind} nodes{' with Slurm' if slurm else ''}, "
        f"data MTU {args.data_mtu}, "
        f"inventory {inv.relative_to(REPO)}")


def existing(name: str) -> bool:
    """Anything of the cluster left: its containers, or its networks alone (a removal cut short)."""
    flt = f"label={LABEL}={name}"
    return bool(docker("ps", "-aq", "--filter", flt).stdout.split()
                or docker("network", "ls", "-q", "--filter", flt).stdout.split())


def remove_networks(networks: list[str], tries: int = 5) -> None:
    """docker network rm, again while the engine still counts an endpoint of a container just removed (it answers
    "has active endpoints" for a moment after docker rm); then the engine's message and what clears it."""
    for i in range(tries):
        left = [n for n in networks if docker("network", "rm", n, check=False).returncode != 0
                and docker("network", "inspect", n, check=False).returncode == 0]
        if not left:
            return
        networks = left
        time.sleep(1 + i)
    raise SystemExit(f"docker could not remove the networks {', '.join(networks)}: the engine still counts an "
                     "endpoint on them with no container attached. Restart the engine (make engine after stopping "
                     "dockerd), then run simcluster.py down again.")


def cmd_down(args: argparse.Namespace) -> None:
    name = args.name
    flt = f"label={LABEL}={name}"
    containers = docker("ps", "-aq", "--filter", flt).stdout.split()
    if containers:
        docker("rm", "-f", "-v", *containers)
    networks = docker("network", "ls", "-q", "--filter", flt).stdout.split()
    if networks:
        remove_networks(networks)
    volumes = docker("volume", "ls", "-q", "--filter", flt).stdout.split()
    if volumes:
        docker("volume", "rm", "-f", *volumes)
    inv = inventory_dir(name)
    if inv.exists():
        shutil.rmtree(inv)
    shutil.rmtree(state_dir(name), ignore_errors=True)
    log(f"cluster '{name}' removed ({len(containers)} containers, {len(networks)} networks, "
        f"{len(volumes)} volumes)")


def cmd_list(_args: argparse.Namespace) -> None:
    out = docker("ps", "-a", "--filter", f"label={LABEL}", "--format",
                 '{{.Label "' + LABEL + '"}}\t{{.Names}}\t{{.Status}}').stdout
    print(out.strip() or "no simulated clusters")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("images").set_defaults(func=cmd_images)
    up = sub.add_parser("up")
    up.add_argument("--name", default=DEFAULT_NAME)
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--data-mtu", type=int, default=9000)
    up.add_argument("--no-train-image", action="store_true", help="skip building/pushing the training image")
    up.add_argument("--kind", choices=KINDS, default="node",
                    help="node: docker-in-docker GPU-node look-alikes (default); plain: rented containers "
                         "(sshd and Python only, SSH on mapped ports of 127.0.0.1, an overlay and a bridge network); "
                         "light: sshd and Python only on the node kind's networks, for scale measurements")
    up.add_argument("--slurm", action="store_true",
                    help="node kind with a real Slurm (slurmctld on the head, slurmd and munge on every node)")
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down")
    down.add_argument("--name", default=DEFAULT_NAME)
    down.set_defaults(func=cmd_down)
    sub.add_parser("list").set_defaults(func=cmd_list)
    args = p.parse_args()
    if getattr(args, "nodes", 1) < 1 or getattr(args, "nodes", 1) > 64:
        p.error("--nodes must be between 1 and 64")
    if hasattr(args, "data_mtu") and not 1280 <= args.data_mtu <= 9216:
        p.error("--data-mtu must be between 1280 and 9216")
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
