"""Container role on the simulated cluster: real pulls from the local registry, a real training container
on every node's own engine, and faults that must fail preflight with a named message.

Runs tests/integration/playbooks/container.yml (the role alone) and reads every node's preflight records
from the JSON it writes. Tests that break something put it back in `finally`.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from helpers import parse_recap

PLAYBOOK = "tests/integration/playbooks/container.yml"
NAME = "trainyard-train"
# The simulated nodes' engines lack CAP_SYS_RESOURCE, so they cannot raise RLIMIT_MEMLOCK to unlimited
# (real engines can); the nodes' own hard limit is 8 MiB.
SIM_ULIMITS = {"memlock": 8388608, "stack": 67108864}


def group_vars(cluster) -> dict:
    return yaml.safe_load((cluster.inventory / "group_vars" / "all.yml").read_text()) or {}


def converge(cluster, tmp_path: Path, *extra: str, entry: str = "main"):
    """Run the role; returns (completed process, {host: {check: record}}, recap)."""
    report = tmp_path / f"report-{uuid.uuid4().hex[:6]}.json"
    args = ["-e", f"container_report={report}", "-e", f"container_entry={entry}"]
    if "container_ulimits" not in group_vars(cluster):
        args += ["-e", json.dumps({"container_ulimits": SIM_ULIMITS})]
    r = cluster.playbook(PLAYBOOK, *args, *extra)
    records = {}
    if report.exists():
        records = {h: {x["check"]: x for x in recs} for h, recs in json.loads(report.read_text()).items()}
    return r, records, parse_recap(r.stdout)


def inspect(cluster, node: str) -> dict:
    out = cluster.exec(node, ["docker", "inspect", NAME], check=False)
    return json.loads(out.stdout)[0] if out.returncode == 0 else {}


def assert_healthy(records: dict, nodes: list[str], pulled: bool = True) -> None:
    for node in nodes:
        recs = records[node]
        if pulled:
            assert recs["container.image_pull"]["status"] == "pass", (node, recs["container.image_pull"])
        else:  # the read-only preflight entry point pulls nothing (records come from this run only)
            assert "container.image_pull" not in recs, (node, recs["container.image_pull"])
        for check in ("container.engine", "container.image_digest", "container.running",
                      "container.health.code_dir", "container.health.output_writable",
                      "container.health.shared_readable", "container.health.home", "container.health.logger",
                      "container.health.python", "container.health.torch", "container.health.ulimits"):
            assert recs[check]["status"] == "pass", (node, recs[check])
        # CPU nodes: no GPU to give, and the in-container GPU comparison cannot run, so it skips with the reason
        assert recs["container.gpus"]["status"] == "pass" and "no GPUs on this node" in recs["container.gpus"]["detail"]
        vis = recs["container.health.gpu_visible"]
        assert vis["status"] == "skip" and "no GPU on this node" in vis["detail"], (node, vis)


@pytest.fixture(scope="module")
def converged(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("container")
    r, records, recap = converge(cluster, tmp)
    assert r.returncode == 0, r.stdout[-4000:]
    assert_healthy(records, cluster.nodes)
    return cluster


def test_container_runs_with_host_namespaces_and_rerun_changes_nothing(converged, tmp_path):
    cluster = converged
    image = group_vars(cluster)["container_image"]
    ids = {}
    for node in cluster.nodes:
        info = inspect(cluster, node)
        assert info["State"]["Running"], node
        host = info["HostConfig"]
        assert (host["NetworkMode"], host["IpcMode"], host["PidMode"]) == ("host", "host", "host"), node
        assert host["RestartPolicy"]["Name"] == "unless-stopped"
        assert {u["Name"]: u["Soft"] for u in host["Ulimits"]}["stack"] == 67108864
        mounts = {m["Destination"]: m["RW"] for m in info["Mounts"]}
        assert mounts["/srv/shared"] is False and mounts["/srv/outputs"] is True and "/srv/code" in mounts
        assert info["Config"]["Image"] == image
        # Host network: the container sees the node's hostname and data interface.
        seen = cluster.exec(node, ["docker", "exec", NAME, "cat", "/proc/sys/kernel/hostname"]).stdout.strip()
        assert seen == node
        assert cluster.exec(node, ["docker", "exec", NAME, "test", "-d", "/sys/class/net/eth1"]).returncode == 0
        # Host PID namespace: the node's sshd is visible from inside.
        pids = cluster.exec(node, ["docker", "exec", NAME, "sh", "-c", "cat /proc/[0-9]*/comm 2>/dev/null; true"]).stdout
        assert "sshd" in pids and "dockerd" in pids, node
        # A file written inside lands in the node's output root.
        marker = f"/srv/outputs/.it-{uuid.uuid4().hex[:6]}"
        cluster.exec(node, ["docker", "exec", NAME, "sh", "-c", f"echo x > {marker}"])
        assert cluster.exec(node, ["cat", marker]).stdout.strip() == "x"
        cluster.exec(node, ["rm", "-f", marker])
        ids[node] = info["Id"]

    r, records, recap = converge(cluster, tmp_path)
    assert r.returncode == 0, r.stdout[-4000:]
    for node in cluster.nodes:
        assert recap[node]["changed"] == 0, (node, recap[node])
        assert recap[node]["failed"] == 0
        assert inspect(cluster, node)["Id"] == ids[node], f"{node}: container recreated on a converged run"
    assert_healthy(records, cluster.nodes)
    # No pull on the converged run: the image was present.
    assert all("present" in records[n]["container.image_pull"]["detail"] for n in cluster.nodes)


def test_the_job_cannot_signal_host_processes_nor_make_device_nodes(converged, tmp_path):
    """Hardened by default: the job (docker exec, as the launch, the health probe and nccl_check run it) is uid
    65532 with no capability and no-new-privileges; in the host PID namespace it cannot signal the node's sshd or
    dockerd (root's) and cannot mknod. On the old settings (root, docker's default capabilities) kill -0 succeeds
    (uid 0 -> uid 0) and mknod of a character device succeeds (CAP_MKNOD)."""
    cluster = converged
    for node in cluster.nodes:
        info = inspect(cluster, node)
        assert info["Config"]["User"] == "65532:65532", node
        assert info["HostConfig"]["CapDrop"] == ["ALL"] and not info["HostConfig"]["CapAdd"], node
        assert "no-new-privileges:true" in (info["HostConfig"]["SecurityOpt"] or []), node
        assert cluster.exec(node, ["docker", "exec", NAME, "id", "-u"]).stdout.strip() == "65532"
        # The writable mounts are the job's; HOME is one it can create.
        for path in ("/srv/outputs", "/srv/code"):
            assert cluster.exec(node, ["stat", "-c", "%u:%g", path]).stdout.strip() == "65532:65532", (node, path)
        # The read-only directory: root's, the job's group (the launch spec there is 0640 with that group).
        ro = next(m["Source"] for m in info["Mounts"] if m["Destination"].endswith("/job-ro"))
        assert cluster.exec(node, ["stat", "-c", "%u:%g", ro]).stdout.strip() == "0:65532", (node, ro)
        assert cluster.exec(node, ["docker", "exec", NAME, "ls", ro], check=False).returncode == 0, (node, ro)
        home = cluster.exec(node, ["docker", "exec", NAME, "sh", "-c", 'mkdir -p "$HOME" && touch "$HOME/x" && '
                                   'echo "$HOME"'], check=False)
        assert home.returncode == 0 and home.stdout.strip() == "/tmp/trainyard-home", (node, home.stderr)
    node = cluster.head
    for daemon in ("sshd", "dockerd"):
        pid = cluster.exec(node, ["pgrep", "-o", "-x", daemon]).stdout.split()[0]
        # The pid is the same inside (host PID namespace); the job sees it and cannot signal it.
        r = cluster.exec(node, ["docker", "exec", NAME, "sh", "-c", f"test -d /proc/{pid} && kill -0 {pid}"],
                         check=False)
        assert r.returncode != 0 and "not permitted" in r.stderr.lower(), (daemon, pid, r.returncode, r.stderr)
    r = cluster.exec(node, ["docker", "exec", NAME, "sh", "-c", "mknod /tmp/ty-mem c 1 1"], check=False)
    assert r.returncode != 0 and "not permitted" in r.stderr.lower(), (r.returncode, r.stderr)
    # no-new-privileges: the kernel marks the job's processes (a setuid program in the image gains nothing).
    r = cluster.exec(node, ["docker", "exec", NAME, "sh", "-c", "grep NoNewPrivs /proc/self/status"])
    assert r.stdout.split()[-1] == "1", r.stdout


def test_changing_shm_size_recreates_the_container(converged, tmp_path):
    cluster = converged
    before = {n: inspect(cluster, n)["Id"] for n in cluster.nodes}
    try:
        r, records, recap = converge(cluster, tmp_path, "-e", "container_shm_size=300m")
        assert r.returncode == 0, r.stdout[-4000:]
        for node in cluster.nodes:
            info = inspect(cluster, node)
            assert info["Id"] != before[node], node
            assert info["HostConfig"]["ShmSize"] == 300 * 2 ** 20
            assert recap[node]["changed"] >= 1
        assert_healthy(records, cluster.nodes)
    finally:
        r, _, _ = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-4000:]


def test_gpu_mode_devices_gives_the_container_what_the_node_has_and_names_what_it_lacks(converged, tmp_path):
    """container_gpus all with gpu mode devices on a CPU node: the engine probe reads the node's GPU paths in its own
    task (no other task runs for them); the stand-in nvidia-smi the node has is mounted read-only where the container
    looks for it, the driver's library directory is on LD_LIBRARY_PATH, and container.gpus fails naming the libraries
    the node lacks. The node's usual container comes back afterwards."""
    cluster = converged
    node = cluster.nodes[-1]
    opts = ("-e", "container_gpus=all", "-e", "container_gpu_mode=devices", "--limit", f"{node},localhost")
    try:
        r, records, _ = converge(cluster, tmp_path, *opts)
        assert "Find the GPU device nodes" not in r.stdout and "List the NVIDIA device nodes" not in r.stdout
        gpus = records[node]["container.gpus"]
        assert gpus["status"] == "fail" and gpus["data"]["gpu_mode"] == "devices", gpus
        assert "missing libcuda, libnvidia-ml" in gpus["detail"] and node in gpus["fix"], gpus
        info = inspect(cluster, node)
        smi = [m for m in info["Mounts"] if m["Destination"] == "/usr/local/nvidia/bin/nvidia-smi"]
        assert smi and smi[0]["Source"] == "/usr/local/bin/nvidia-smi" and smi[0]["RW"] is False, info["Mounts"]
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])
        assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64" and env["NVIDIA_VISIBLE_DEVICES"] == "all"
    finally:
        r, records, _ = converge(cluster, tmp_path, "--limit", f"{node},localhost")
        assert r.returncode == 0, r.stdout[-4000:]
        assert_healthy(records, [node])


def test_preflight_entry_point_reads_only(converged, tmp_path):
    cluster = converged
    node = cluster.nodes[-1]
    r, records, recap = converge(cluster, tmp_path, entry="preflight")
    assert r.returncode == 0, r.stdout[-4000:]
    assert_healthy(records, cluster.nodes, pulled=False)
    assert all(recap[n]["changed"] == 0 for n in cluster.nodes)
    cluster.exec(node, ["docker", "rm", "-f", NAME])
    try:
        r, records, recap = converge(cluster, tmp_path, entry="preflight")
        assert r.returncode == 0, r.stdout[-4000:]
        assert records[node]["container.running"]["status"] == "fail"
        assert "does not exist" in records[node]["container.running"]["detail"]
        assert records[node]["container.health.output_writable"]["status"] == "skip"
        assert inspect(cluster, node) == {}, "preflight must not create the container"
        assert_healthy(records, [n for n in cluster.nodes if n != node], pulled=False)
    finally:
        r, _, _ = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-4000:]


def test_reset_restarts_or_recreates(converged, tmp_path):
    cluster = converged
    node = cluster.head
    before = inspect(cluster, node)
    # A process running in the container dies with the restart.
    cluster.exec(node, ["docker", "exec", "-d", NAME, "sleep", "4242"])
    r, _, _ = converge(cluster, tmp_path, entry="reset")
    assert r.returncode == 0, r.stdout[-4000:]
    after = inspect(cluster, node)
    assert after["Id"] == before["Id"] and after["State"]["StartedAt"] != before["State"]["StartedAt"]
    assert after["State"]["Running"]
    # the process itself, by its whole command line (a container id in a shim's arguments can hold "4242")
    assert "sleep 4242" not in [a.strip() for a in cluster.exec(node, ["ps", "-eo", "args"]).stdout.splitlines()]
    r, _, _ = converge(cluster, tmp_path, "-e", "container_reset_recreate=true", entry="reset")
    assert r.returncode == 0, r.stdout[-4000:]
    assert inspect(cluster, node)["Id"] != before["Id"]
    assert inspect(cluster, node)["State"]["Running"]
    # A container that is gone (job_reset's read says exists false) is created again.
    cluster.exec(node, ["docker", "rm", "-f", NAME])
    r, _, _ = converge(cluster, tmp_path, entry="reset")
    assert r.returncode == 0, r.stdout[-4000:]
    assert inspect(cluster, node)["State"]["Running"]


# ----------------------------------------------------------------------------------------------- faults

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def docker_host(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=600)


def test_digest_drift_on_one_node_is_named(converged, tmp_path):
    """A second registry serves a different image under the same name; one node's pulls are NATed to it."""
    cluster = converged
    node = cluster.nodes[1]
    image = group_vars(cluster)["container_image"]
    gw, rest = image.split(":", 1)
    port = int(rest.split("/", 1)[0])
    repo_tag = rest.split("/", 1)[1]
    other = free_port()
    storage = Path(tempfile.mkdtemp(prefix="ty-drift-registry-"))
    config = storage / "config.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {storage}/data\n"
                      f"http:\n  addr: 0.0.0.0:{other}\n")
    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    registry = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    # A small, different image under the same repository and tag.
    local = f"127.0.0.1:{other}/{repo_tag}"
    rootfs = storage / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "drift").write_text(uuid.uuid4().hex)
    rule = ["OUTPUT", "-p", "tcp", "-d", gw, "--dport", str(port), "-j", "DNAT", "--to-destination", f"{gw}:{other}"]
    keep = f"trainyard-it-keep:{uuid.uuid4().hex[:6]}"
    try:
        for _ in range(40):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{other}/v2/", timeout=1)
                break
            except OSError:
                time.sleep(0.25)
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
        subprocess.run(["docker", "import", "-", local], input=tar, capture_output=True, check=True)
        docker_host("push", local)
        # That node must pull again: remove its container and untag the image (a keep tag holds the layers,
        # so putting it back is quick), then NAT its pulls to the other registry.
        cluster.exec(node, ["docker", "rm", "-f", NAME])
        cluster.exec(node, ["docker", "tag", image, keep])
        cluster.exec(node, ["docker", "image", "rm", image])
        cluster.exec(node, ["iptables", "-t", "nat", "-A", *rule])
        r, records, _ = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-4000:]
        bad = records[node]["container.image_digest"]
        assert bad["status"] == "fail", bad
        assert node in bad["detail"] and "expected" in bad["detail"]
        assert "registry route" in bad["fix"]
        assert bad["data"]["image_id"] and bad["data"]["reference"] and bad["data"]["image_id"] != bad["data"]["reference"]
        for peer in cluster.nodes:
            if peer != node:
                rec = records[peer]["container.image_digest"]
                assert rec["status"] == "pass", rec
                assert f"differing: {node}" in rec["detail"]
    finally:
        cluster.exec(node, ["iptables", "-t", "nat", "-D", *rule], check=False)
        cluster.exec(node, ["docker", "rm", "-f", NAME], check=False)
        cluster.exec(node, ["docker", "image", "rm", "-f", image], check=False)
        cluster.exec(node, ["docker", "tag", keep, image], check=False)
        cluster.exec(node, ["docker", "image", "rm", keep], check=False)
        registry.terminate()
        registry.wait(timeout=10)
        docker_host("image", "rm", "-f", local, check=False)
        shutil.rmtree(storage, ignore_errors=True)
        r, records, _ = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-4000:]
        assert records[node]["container.image_digest"]["status"] == "pass"


def test_stale_local_image_on_one_node_is_named(converged, tmp_path):
    """A node that kept an older image under the configured name (no pull: it is present) is caught too."""
    cluster = converged
    node = cluster.nodes[-1]
    image = group_vars(cluster)["container_image"]
    try:
        cluster.exec(node, ["docker", "commit", "--change", f"LABEL trainyard.stale={uuid.uuid4().hex[:8]}",
                            NAME, image])
        r, records, _ = converge(cluster, tmp_path, entry="preflight")
        assert r.returncode == 0, r.stdout[-4000:]
        bad = records[node]["container.image_digest"]
        assert bad["status"] == "fail" and node in bad["detail"], bad
        # The running container still uses the old image ID: named as well.
        assert records[node]["container.running"]["status"] == "fail"
        assert "runs image" in records[node]["container.running"]["detail"]
    finally:
        cluster.exec(node, ["docker", "image", "rm", "-f", image], check=False)
        r, records, _ = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-4000:]
        assert records[node]["container.image_digest"]["status"] == "pass"


def test_read_only_output_root_on_one_node_is_named(converged, tmp_path):
    """The node's output filesystem went read-only (as after disk errors): the probe write fails there."""
    cluster = converged
    node = cluster.nodes[-1]
    out = group_vars(cluster)["cluster_output_root"]
    try:
        cluster.exec(node, ["docker", "rm", "-f", NAME])
        cluster.exec(node, ["mount", "--bind", out, out])
        cluster.exec(node, ["mount", "-o", "remount,bind,ro", out])
        r, records, _ = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-4000:]
        rec = records[node]["container.health.output_writable"]
        assert rec["status"] == "fail", rec
        assert "Read-only file system" in rec["detail"] and out in rec["detail"]
        assert out in rec["fix"]
        for peer in cluster.nodes:
            if peer != node:
                assert records[peer]["container.health.output_writable"]["status"] == "pass"
    finally:
        cluster.exec(node, ["umount", out], check=False)
        cluster.exec(node, ["docker", "rm", "-f", NAME], check=False)
        r, records, _ = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-4000:]
        assert records[node]["container.health.output_writable"]["status"] == "pass"


def test_read_only_output_mount_by_configuration_is_named(converged, tmp_path):
    """A host var that mounts the output root read-only on one node."""
    cluster = converged
    node = cluster.nodes[0]
    gv = group_vars(cluster)
    host_vars = cluster.inventory / "host_vars"
    host_vars.mkdir(exist_ok=True)
    hv = host_vars / f"{node}.yml"
    mounts = [{"source": gv["cluster_shared_root"], "read_only": True},
              {"source": gv["cluster_output_root"], "read_only": True},
              {"source": gv["cluster_code_dir"]}, {"source": "/var/lib/trainyard/train/job-ro", "read_only": True},
              {"source": "/var/lib/trainyard/train/job-rw"}]
    try:
        hv.write_text(yaml.safe_dump({"container_mounts": mounts}))
        r, records, _ = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-4000:]
        rec = records[node]["container.health.output_writable"]
        assert rec["status"] == "fail" and "Read-only file system" in rec["detail"], rec
    finally:
        hv.unlink(missing_ok=True)
        r, records, _ = converge(cluster, tmp_path)
        assert r.returncode == 0, r.stdout[-4000:]
        assert records[node]["container.health.output_writable"]["status"] == "pass"


def test_missing_logger_in_the_image_is_named(converged, tmp_path):
    """An image built without tensorboard: every node fails the logger check, named, before any job runs."""
    cluster = converged
    image = group_vars(cluster)["container_image"]
    repo = image.rsplit(":", 1)[0]
    gw_port = repo.split("/", 1)[0]
    port = gw_port.split(":")[1]
    tag = f"nolog-{uuid.uuid4().hex[:6]}"
    local_src = f"127.0.0.1:{port}/{image.split('/', 1)[1]}"
    local_dst = f"127.0.0.1:{port}/{repo.split('/', 1)[1]}:{tag}"
    builder = f"ty-nolog-{uuid.uuid4().hex[:6]}"
    try:
        docker_host("run", "--name", builder, local_src, "sh", "-c",
                    "rm -rf /usr/local/lib/python3*/dist-packages/tensorboard "
                    "/usr/local/lib/python3*/dist-packages/tensorboard-*")
        docker_host("commit", builder, local_dst)
        docker_host("push", local_dst)
        r, records, _ = converge(cluster, tmp_path, "-e", f"container_image={repo}:{tag}")
        assert r.returncode == 0, r.stdout[-4000:]
        for node in cluster.nodes:
            rec = records[node]["container.health.logger"]
            assert rec["status"] == "fail", rec
            assert "tensorboard" in rec["detail"] and "ModuleNotFoundError" in rec["detail"]
            assert "pip install tensorboard" in rec["fix"]
            assert records[node]["container.health.torch"]["status"] == "pass"
        # Another logger configured: the same image passes that check.
        r, records, _ = converge(cluster, tmp_path, "-e", f"container_image={repo}:{tag}",
                                 "-e", "container_logger_module=json", entry="preflight")
        assert all(records[n]["container.health.logger"]["status"] == "pass" for n in cluster.nodes)
    finally:
        docker_host("rm", "-f", builder, check=False)
        docker_host("image", "rm", "-f", local_dst, check=False)
        r, records, _ = converge(cluster, tmp_path)
        for node in cluster.nodes:
            cluster.exec(node, ["docker", "image", "rm", "-f", f"{repo}:{tag}"], check=False)
        assert r.returncode == 0, r.stdout[-4000:]
        assert_healthy(records, cluster.nodes)


def test_registry_login_is_recorded_and_the_password_never_logged(converged, tmp_path):
    cluster = converged
    secret = f"s3cret-{uuid.uuid4().hex}"
    try:
        r, records, recap = converge(cluster, tmp_path, "-v", "-e", "container_registry_username=trainer",
                                     "-e", f"container_registry_password={secret}")
        assert r.returncode == 0, r.stdout[-4000:]
        assert secret not in r.stdout
        for node in cluster.nodes:
            rec = records[node]["container.registry_login"]
            assert rec["status"] == "pass" and "trainer" in rec["detail"], rec
            assert secret not in json.dumps(records[node])
            assert recap[node]["failed"] == 0
    finally:
        for node in cluster.nodes:
            cluster.exec(node, ["rm", "-f", "/root/.docker/config.json"], check=False)


def test_install_path_on_a_pre_imaged_node_changes_nothing(converged, tmp_path):
    """container_engine_install: true on a node that already has the engine: packages present, engine left
    running, the container untouched."""
    cluster = converged
    node = cluster.head
    before = inspect(cluster, node)["Id"]
    r, records, recap = converge(cluster, tmp_path, "-l", f"{node},localhost",
                                   "-e", "container_engine_install=true", "-v")
    assert r.returncode == 0, r.stdout[-4000:]
    assert recap[node]["changed"] == 0, recap[node]
    assert records[node]["container.engine"]["status"] == "pass"
    assert inspect(cluster, node)["Id"] == before
    # The engine is asked once a run: engine.yml takes install.yml's answer (nothing started or restarted it).
    probe = r.stdout.split("else probe the docker engine and pull the training image]", 1)[1].split("TASK [", 1)[0]
    assert f"ok: [{node}]" in probe and '"asked": false' in probe, probe
