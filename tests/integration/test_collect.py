"""playbooks/collect.yml and the progress part of playbooks/status.yml on the simulated cluster: a real DDP job
over gloo (examples/ddp_train.py with CPU-bound work per step, per-rank progress files), faults injected by the
stand-ins (Xid 79 in node 2's kernel log through the stand-in dmesg, a pending row remap and uncorrectable ECC
errors in its nvidia-smi XML). Each must be named by node and rank, with the fix; the evidence of every node lands
in runs/<id>/; status.yml shows each node's progress and GPUs.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest

from helpers import wait_until


LAUNCH = "tests/integration/playbooks/launch.yml"
STATE = "/var/lib/trainyard/train"
RW = f"{STATE}/job-rw"  # the job-writable part (module_utils/torchrun.py JOB_RW_DIR): progress files, log, pid record
FAULT = "/etc/trainyard-standin/fault"
CONTAINER = "trainyard-train"
ARGV = ["--steps", "100000", "--save-every", "0", "--sleep", "0.05", "--work", "400", "--output-root", "/srv/outputs"]


def steps(cluster, node) -> int:
    """The lowest step in the node's progress files (0 before the first)."""
    out = cluster.exec(node, ["sh", "-c", f"cat {RW}/progress/rank_*.json 2>/dev/null"], check=False).stdout
    found = [int(m) for m in re.findall(r'"step": (\d+)', out)]
    return min(found) if found else 0


def launch(cluster, *args):
    return cluster.playbook(LAUNCH, *args)


def clear_progress_and_checkpoints(cluster):
    """An empty progress directory and no checkpoint on any node: the launch resumes from the newest checkpoint under
    /srv/outputs, and an earlier test's (another file's job on the same cluster) would start this job at its step,
    or past its last one, so that it ends without a step or a progress file."""
    for node in cluster.nodes:
        cluster.exec(node, ["sh", "-c", f"mkdir -p -m 1777 {RW}/progress && rm -f {RW}/progress/* "
                                        f"&& rm -rf {STATE}/stacks /srv/outputs/checkpoint-*"])


def run_dir_of(output: str) -> Path:
    m = re.search(r"Summary: (\S+)/collect\.md", output)
    assert m, output[-4000:]
    return Path(m.group(1))


@pytest.fixture(scope="module")
def job(cluster):
    """The example job on every node with progress files; node 2 given GPU faults."""
    r = launch(cluster, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
    assert r.returncode == 0, r.stdout[-3000:]
    clear_progress_and_checkpoints(cluster)
    extra = {"launch_example_argv": ARGV, "launch_wait_timeout": 600,
             "launch_env": {"TRAINYARD_PROGRESS_DIR": f"{RW}/progress"}}
    r = launch(cluster, "-e", "test_launch_entry=main", "-e", json.dumps(extra))
    assert r.returncode == 0, r.stdout[-3000:]
    bad = cluster.nodes[1]
    assert wait_until(lambda: all(steps(cluster, n) >= 3 for n in cluster.nodes), 900, step=2.0), "no progress files"
    cluster.exec(bad, ["sh", "-c", f"mkdir -p /etc/trainyard-standin && printf 'xid=79@0\\necc=2@3\\nremap=pending@3\\n'"
                                   f" > {FAULT}"])
    try:
        yield cluster
    finally:
        cluster.exec(bad, ["rm", "-f", FAULT], check=False)
        launch(cluster, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")


def test_collect_names_the_gpu_faults_and_gathers_every_node(job):
    bad = job.nodes[1]
    r = job.playbook("playbooks/status.yml", "-e", "status_stall_s=100000")
    assert r.returncode == 0, r.stdout[-3000:]
    # Read-only on the nodes, so --check gathers and stores the same (it wrote nothing else before, and failed).
    r = job.playbook("playbooks/collect.yml", "--check")
    assert r.returncode == 0 and (run_dir_of(r.stdout) / "collect.tar.gz").is_file(), r.stdout[-4000:]
    r = job.playbook("playbooks/collect.yml")
    out = r.stdout
    assert r.returncode == 0, out[-4000:]
    # Xid 79 on node 2's GPU 0 (the rank there: node rank 1, local rank 0 -> rank 1), with the fix.
    assert re.search(rf"{bad}: nvidia_driver.xid FAIL: Xid 79 on {bad} \(node rank 1\) GPU 0 \(0000:00:06\), "
                     r"rank 1 \(local rank 0\)", out), out[-4000:]
    assert "power-cycle" in out
    assert re.search(rf"{bad}: nvidia_driver.ecc FAIL: .*{bad} \(node rank 1\) GPU 3 .*row remap pending", out)
    for node in job.nodes:
        assert f"{node}: nvidia_driver.xid" not in out or node == bad

    run = run_dir_of(out)
    for node in job.nodes:
        d = run / "nodes" / node
        log = (d / "torchrun.log").read_text()
        assert "trainyard: rendezvous done" in log
        # job-ro/nccl.env is gathered when the node has one (an earlier site.yml on this cluster rendered it; this
        # job's launch used the stand-in test.env), and only then.
        on_node = job.exec(node, ["test", "-f", f"{STATE}/job-ro/nccl.env"], check=False).returncode == 0
        assert (d / "nccl.env").exists() is on_node
        assert json.loads((d / "launch.json").read_text())["job"] == "train"
        assert json.loads((d / "launch.pid.json").read_text())["pid"] > 1  # the launcher's record, from job-rw
        assert (d / "nvidia-smi-q.xml").read_text().lstrip().startswith("<?xml")
        assert json.loads((d / "container.inspect.json").read_text())[0]["Name"] == "/" + CONTAINER
        assert list((d / "progress").glob("rank_*.json"))
    assert "fallen off the bus" in (run / "nodes" / bad / "kernel.log").read_text()
    listing = json.loads((run / "nodes" / job.nodes[0] / "collect.json").read_text())["files"]
    assert any(f["name"] == "fabricmanager.journal" and f["skipped"] for f in listing)
    page = (run / "health.html").read_text()
    assert 'id="job"' in page and f'href="nodes/{bad}/kernel.log"' in page
    with tarfile.open(run / "collect.tar.gz") as t:
        names = t.getnames()
    assert any(n.endswith(f"nodes/{bad}/kernel.log") for n in names) and any(n.endswith("health.html") for n in names)
    report = json.loads((run / "report.json").read_text())
    rec = {(x["host"], x["check"]): x["status"] for x in report["records"]}
    assert rec[(bad, "nvidia_driver.xid")] == "fail" and rec[(job.nodes[0], "nvidia_driver.xid")] == "pass"
    # every node reported progress (the straggler verdict itself is unit-tested: tests/unit/module_utils/test_job_collect.py)
    assert {rec[(n, "job.straggler")] for n in job.nodes} <= {"pass", "warn"}


def test_status_shows_progress_and_gpus_per_node(job):
    r = job.playbook("playbooks/status.yml", "-e", "status_stall_s=100000")
    out = r.stdout
    assert r.returncode == 0, out[-3000:]
    for node in job.nodes:
        assert re.search(rf"{node}\s+\d\s+running\s+\d+\s+\d+\.\d\d\s", out), out[-3000:]
    # the stand-in GPUs: utilisation, memory, temperature per GPU
    assert "0%/0%/0%/0%" in out and "38C" in out
