"""The health page of a failing simulated cluster loads in headless Chromium and shows the failing cell.

A screenshot is written to artifacts/health-page.png (kept by CI as an artifact, not committed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile

import pytest

from helpers import REPO, run_dir_of

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0"]


def chromium(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def test_health_page_of_a_failing_cluster(cluster):
    worker = cluster.nodes[2]
    cluster.set_mtu(worker, 1500)
    try:
        r = cluster.playbook("playbooks/preflight.yml", "-e", "network_manage_mtu=false")
    finally:
        cluster.set_mtu(worker, 9000)
    assert r.returncode != 0, r.stdout
    run_dir = run_dir_of(r.stdout)
    page = run_dir / "health.html"
    assert page.is_file(), f"no health page in {run_dir}:\n{r.stdout[-3000:]}"
    assert str(page) in r.stdout  # the path is printed at the end of the run
    report = json.loads((run_dir / "report.json").read_text())
    failing = {(x["host"], x["check"]) for x in report["records"] if x["status"] == "fail"}
    assert any(h == worker for h, _ in failing), failing

    dom = chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-ready="1"' in dom.stdout  # the page's script ran
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr, dom.stderr[-2000:]
    for host, check in failing:
        assert f'data-host="{host}" data-check="{check}" data-status="fail"' in dom.stdout

    artifacts = REPO / "artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / "health-page.png"
    shot.unlink(missing_ok=True)
    r = chromium("--window-size=1400,1200", f"--screenshot={shot}", page.as_uri())
    assert r.returncode == 0 and shot.stat().st_size > 10_000, r.stderr[-2000:]


@pytest.mark.parametrize("status", ["fail"])
def test_health_page_renders_offline_from_a_report_file(tmp_path, status):
    """Rendering needs only the report: no network, no cluster (the CLI users run after the fact)."""
    report = {"run_id": "x", "hosts": ["a", "b"], "cluster_model": {"a": {"node_rank": 0}, "b": {"node_rank": 1}},
              "records": [{"host": "b", "check": "network.mtu", "status": status, "detail": "1500", "fix": "mtu 9000"}]}
    src = tmp_path / "report.json"
    src.write_text(json.dumps(report))
    out = tmp_path / "health.html"
    r = subprocess.run([sys.executable, str(REPO / "filter_plugins/health_page.py"), str(src),
                        str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    dom = chromium("--dump-dom", out.as_uri())
    assert 'data-host="b" data-check="network.mtu" data-status="fail"' in dom.stdout


def test_health_page_of_1024_nodes_opens_and_names_every_failure(tmp_path):
    """A real 2-node report grown to 1,024 nodes the way the network role probes at that size (tests/bench/health.py):
    the page opens in Chromium with every failing check cell and every failing link, without the n² matrix cells."""
    sys.path.insert(0, str(REPO / "tests/bench"))
    import health as bench

    source = json.loads(bench.SOURCE.read_text())
    results, models, hosts, _ = bench.grow(source, 1024)
    report = bench.cluster_report.build_report(results, hosts, models, source["run_id"], str(tmp_path))
    src = tmp_path / "report.json"
    src.write_text(json.dumps(report))
    out = tmp_path / "health.html"
    r = subprocess.run([sys.executable, str(REPO / "filter_plugins/health_page.py"), str(src), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    dom = chromium("--dump-dom", out.as_uri(), timeout=120)
    assert dom.returncode == 0 and 'data-ready="1"' in dom.stdout, dom.stderr[-2000:]
    for x in report["failures"]:
        assert f'data-host="{x["host"]}" data-check="{x["check"]}" data-status="{x["status"]}"' in dom.stdout
    failing_links = {(rec["host"], peer) for rec in report["records"]
                     for row in ((rec.get("data") or {}).get("pairwise") or {}).values()
                     for peer, ok in row.items() if ok is False}
    assert failing_links
    for host, peer in failing_links:
        assert f'<tr data-src="{host}" data-dst="{peer}" data-value="False">' in dom.stdout
    assert 'class="heat" style="background:#f6f8fa"' not in dom.stdout  # no diagonal: no matrix drawn
