"""The plan (site.yml --check --diff, playbooks/plan.yml) on one 2-node simulated cluster of its own.

In order, on the same cluster: fresh (the plan lists everything, rc 0, nothing changes on the nodes), converged
after a real site.yml (no change planned), drifted (one node's nccl.env edited by hand: the plan shows that node's
diff only), and a fault the run cannot fix (the fabric of one node not Completed: rc non-zero, node and check named).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import parse_recap

NAME = os.environ.get("TY_SIM_NAME", "pl") + "pl"
ENV_FILE = "/var/lib/trainyard/train/job-ro/nccl.env"  # the job's read-only directory
FAULT = "/etc/trainyard-standin/fault"


def node_state(cluster, node: str) -> dict[str, str]:
    """What a plan must not change on a node: /etc/environment, the state dir, containers, images."""
    def out(argv):
        return cluster.exec(node, ["sh", "-c", argv], check=False).stdout

    return {
        "environment": out("sha256sum /etc/environment 2>&1"),
        "state_dir": out("find /var/lib/trainyard /srv -printf '%p %s %T@\\n' 2>/dev/null | sort"),
        "containers": out("docker ps -a --format '{{.Names}} {{.Image}} {{.ID}} {{.State}}' | sort"),
        "images": out("docker images --digests --format '{{.Repository}}:{{.Tag}} {{.ID}}' | sort"),
    }


def plan_report(cluster, playbook: str, run_dir: Path, *extra: str):
    r = cluster.playbook(playbook, "--check", "--diff", "-e", f"cluster_run_dir={run_dir}", *extra)
    report = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").exists() else None
    return r, report


def changes(report: dict, host: str) -> list[dict]:
    return [e for e in report["plan"][host] if e.get("changed", True)]


@pytest.fixture(scope="module")
def pcluster(request):
    from helpers import sim_down, sim_up

    c = sim_up(NAME, nodes=2)
    try:
        yield c
    finally:
        sim_down(NAME)


@pytest.fixture(scope="module")
def stage():
    """Tests of this module build on each other: a failed stage skips the ones after it."""
    return {"ok": True}


def _need(stage):
    if not stage["ok"]:
        pytest.skip("an earlier stage of the plan sequence failed")


def test_fresh_cluster_plans_everything_changes_nothing(pcluster, stage, tmp_path):
    stage["ok"] = False
    before = {n: node_state(pcluster, n) for n in pcluster.nodes}
    r, report = plan_report(pcluster, "playbooks/plan.yml", tmp_path / "fresh")
    assert r.returncode == 0, r.stdout[-6000:]
    after = {n: node_state(pcluster, n) for n in pcluster.nodes}
    assert after == before
    assert report["check_mode"] and not report["failed"]
    for n in pcluster.nodes:
        kinds = {e["kind"] for e in changes(report, n)}
        assert {"file", "image", "container", "job"} <= kinds, report["plan"][n]
        files = [e for e in changes(report, n) if e["kind"] == "file"]
        env = next(e for e in files if "/etc/environment" in e["summary"])
        assert "+CUDA_DEVICE_ORDER=PCI_BUS_ID" in env["diff"]
        image = next(e for e in changes(report, n) if e["kind"] == "image")
        assert image["digest"].startswith("sha256:")
        job = next(e for e in report["plan"][n] if e["kind"] == "job")
        assert job["job"]["action"] == "start"
        pending = {r["check"]: r for r in report["pending"] if r["host"] == n}
        assert "nvidia_driver.device_order" in pending
        assert "Configure CUDA_DEVICE_ORDER" in pending["nvidia_driver.device_order"]["fix"]
        assert {"container.image_digest", "container.running"} <= set(pending)
    statuses = {(rec["host"], rec["check"]): rec["status"] for rec in report["records"]}
    assert statuses[(pcluster.nodes[0], "container.running")] == "pending"
    page = (tmp_path / "fresh" / "health.html").read_text()
    assert 'id="plan"' in page and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in page
    md = (tmp_path / "fresh" / "report.md").read_text()
    assert "## Plan" in md and "Pending checks" in md

    # site.yml --check --diff ends rc 0 too: every failure is one the run would fix.
    r = pcluster.playbook("site.yml", "--check", "--diff", "-e", f"cluster_run_dir={tmp_path / 'site'}")
    assert r.returncode == 0, r.stdout[-6000:]
    assert "Preflight failed" not in r.stdout
    assert {n: node_state(pcluster, n) for n in pcluster.nodes} == before
    stage["ok"] = True


def test_converged_cluster_plans_no_change(pcluster, stage, tmp_path):
    _need(stage)
    stage["ok"] = False
    # The converge itself is not under test here: no bandwidth measurement, which a loaded CI machine may fail.
    r = pcluster.playbook("site.yml", "-e", f"cluster_run_dir={tmp_path / 'run'}", "-e", "nccl_check_enabled=false")
    assert r.returncode == 0, r.stdout[-6000:]
    r, report = plan_report(pcluster, "playbooks/plan.yml", tmp_path / "plan")
    assert r.returncode == 0, r.stdout[-6000:]
    for n in pcluster.nodes:
        assert changes(report, n) == [], report["plan"][n]
        job = next(e for e in report["plan"][n] if e["kind"] == "job")
        assert job["job"]["action"] in ("leave_running", "leave_finished")  # the short simulated job may have ended
    assert report["pending"] == []
    assert all(v["changed"] == 0 for h, v in parse_recap(r.stdout).items() if h != "localhost")
    stage["ok"] = True


def test_drifted_node_shows_its_diff_only(pcluster, stage, tmp_path):
    _need(stage)
    stage["ok"] = False
    odd = pcluster.nodes[1]
    pcluster.exec(odd, ["sh", "-c", f"echo NCCL_DEBUG=TRACE >> {ENV_FILE}"])
    r, report = plan_report(pcluster, "playbooks/plan.yml", tmp_path / "plan")
    assert r.returncode == 0, r.stdout[-6000:]
    assert changes(report, pcluster.nodes[0]) == []
    planned = changes(report, odd)
    assert [e["kind"] for e in planned] == ["file"], planned
    assert ENV_FILE in planned[0]["summary"] and "-NCCL_DEBUG=TRACE" in planned[0]["diff"]
    consistent = next(rec for rec in report["records"] if rec["host"] == odd and rec["check"] == "nccl_env.consistent")
    assert consistent["status"] == "pending"
    stage["ok"] = True


def test_fault_the_run_cannot_fix_fails_the_plan_naming_it(pcluster, stage, tmp_path):
    _need(stage)
    odd = pcluster.nodes[1]
    pcluster.exec(odd, ["sh", "-c", f"mkdir -p {Path(FAULT).parent} && echo 'fabric=In Progress' > {FAULT}"])
    try:
        r, report = plan_report(pcluster, "site.yml", tmp_path / "plan")
    finally:
        pcluster.exec(odd, ["rm", "-f", FAULT])
    assert r.returncode != 0
    assert f"{odd}: fabricmanager.fabric FAIL" in r.stdout
    assert report["failed"]
    assert [(f["host"], f["check"]) for f in report["failures"]] == [(odd, "fabricmanager.fabric")]
    assert report["failures"][0]["fix"]
