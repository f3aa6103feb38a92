"""Host-basics preflight and the report on the simulated cluster: a clean run passes and writes the report;
faults on two nodes (small /dev/shm, a dead docker socket with container_engine_install false) and an
unreachable node are all reported at once, and the run fails only after the whole table is printed."""

from __future__ import annotations

import subprocess
import tempfile

from helpers import parse_recap, report_of, run_dir_of

PLAY = "tests/integration/playbooks/cluster.yml"


def test_clean_cluster_passes_and_writes_the_report(cluster):
    r = cluster.playbook(PLAY)
    assert r.returncode == 0, r.stdout[-4000:]
    report = report_of(r.stdout)
    assert report["schema"] == 1 and report["hosts"] == cluster.nodes and not report["failed"]
    checks = {"cluster.python", "cluster.disk", "cluster.shm", "cluster.memlock", "cluster.docker", "cluster.clock"}
    for node in cluster.nodes:
        seen = {x["check"]: x["status"] for x in report["records"] if x["host"] == node}
        assert set(seen) == checks, seen
        assert all(seen[c] in ("pass", "warn") for c in checks), seen
    assert report["cluster_model"][cluster.head]["node_rank"] == 0
    run_dir = run_dir_of(r.stdout)
    assert run_dir.parent.name == "runs" and (run_dir.parent / "latest").is_symlink()
    assert (run_dir / "report.md").read_text().count(f"| {cluster.nodes[1]} | 1 |") == 1
    assert str(run_dir / "report.json") in r.stdout


def test_every_failure_is_reported_before_the_run_fails(cluster):
    shm_node, docker_node, down_node = cluster.nodes[0], cluster.nodes[1], cluster.nodes[2]
    cluster.exec(shm_node, ["mount", "-o", "remount,size=64m", "/dev/shm"])
    cluster.exec(docker_node, ["mv", "/var/run/docker.sock", "/var/run/docker.sock.away"])
    subprocess.run(["docker", "pause", down_node], check=True)  # frozen: SSH cannot reach it
    try:
        # A fresh ControlPersist directory: no master connection from an earlier run reaches the frozen node.
        with tempfile.TemporaryDirectory(prefix="ty-cp-") as cp:
            r = cluster.playbook(PLAY, "-e", "container_engine_install=false",
                                 env={"ANSIBLE_SSH_CONTROL_PATH_DIR": cp, "ANSIBLE_TIMEOUT": "5"}, timeout=300)
    finally:
        subprocess.run(["docker", "unpause", down_node], check=True)
        cluster.exec(docker_node, ["mv", "/var/run/docker.sock.away", "/var/run/docker.sock"])
        cluster.exec(shm_node, ["mount", "-o", "remount,size=512m", "/dev/shm"])
    out = r.stdout
    assert r.returncode != 0, out[-4000:]
    recap = parse_recap(out)
    assert recap[down_node]["unreachable"] == 1, recap
    assert recap["localhost"]["failed"] == 1, recap
    report = report_of(out)
    status = {(x["host"], x["check"]): x["status"] for x in report["records"]}
    assert status[(shm_node, "cluster.shm")] == "fail"
    assert status[(docker_node, "cluster.docker")] == "fail"
    assert status[(down_node, "host.reachable")] == "unreachable"
    assert status[(shm_node, "cluster.docker")] == "pass" and status[(docker_node, "cluster.shm")] == "pass"
    # The table and every failure were printed before the failing assert of the report play.
    tail = out[out.index("TASK [cluster : Show the node x check table]"):]
    for node in cluster.nodes:
        assert node in tail
    final = tail[tail.index("Stop if any check failed"):]
    assert f"{shm_node}: cluster.shm FAIL: /dev/shm 64 MiB" in final
    assert f"{docker_node}: cluster.docker FAIL" in final
    assert f"{down_node}: host.reachable UNREACHABLE" in final
