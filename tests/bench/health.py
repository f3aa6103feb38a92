#!/usr/bin/env python3
"""The health page and report.json at scale (prints figures; asserts nothing).

A real 2-node report (docs/gpu-acceptance/container-h100-merged/report-site.json: two H100 nodes, every role but the
network role on) is grown to N nodes the way the product would record them at that size:

  * every node gets the records of the real worker (the head those of the real head), its cluster_model fact
    (node_rank, data address, hosts_by_rank of all N nodes);
  * the network role's records are built by its own code (plugin_utils/netrecords.py) from a plan chosen by
    netcheck.path_pairs with the role's defaults (network_path_mtu_full_mesh_max 16, network_path_mtu_samples 2,
    seed 0): a full mesh up to 16 nodes, above it a ring, 2 seeded random rings and one pair per data subnet pair
    (one /16 data subnet per 256 nodes); every worker connects to the head's rendezvous port;
  * faults, so the page has failures to show: one node's data MTU is 1500 (its network.mtu and every path to and
    from it fail), one node is unreachable (no records: host.reachable, and every path to it fails), one worker's
    rendezvous connect is refused, one node runs another driver (drift).

With --training, the usual converged re-run instead: the job trains on every node, so nccl_check does not measure
and each node's nccl_check.inter_node and nccl_check.intra_node are the skips the role records then (where the job
trains named by the role's filter, plugin_utils/allreduce_checks.py busy_nodes). --busy-names every names every node
in them, as the role did before busy_nodes: what that cost at each size.

The report is built by cluster_report.build_report (the report play's filter), report.json written as the play does
(to_nice_json(indent=1)), the page by health_page.render; each size is then opened in headless Chromium (DOM dump:
the page's script ran; and a screenshot).

    .venv/bin/python tests/bench/health.py [--sizes 64,256,1024] [--repeats 3] [--out DIR] [--no-browser]
        [--training [--busy-names bounded|every]]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "filter_plugins"))
sys.path.insert(0, str(REPO / "collections"))
import cluster_report  # noqa: E402
import health_page  # noqa: E402
from ansible_collections.trainyard.core.plugins.plugin_utils import allreduce_checks, netrecords  # noqa: E402

SOURCE = REPO / "docs/gpu-acceptance/container-h100-merged/report-site.json"
RAW = REPO / "docs/benchmarks-health.json"
MTU, PORT = 9000, 39500
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def log(msg: str) -> None:
    print(f"[bench_health] {msg}", file=sys.stderr, flush=True)


def _address(i: int) -> str:
    """Node i's data address: one /16 per 256 nodes (a rack's subnet)."""
    rack, j = divmod(i, 256)
    return f"10.{rack}.{j // 200}.{j % 200 + 1}"


def _retarget(rec: dict, old: str, new: str, run_id: str) -> dict:
    rec = copy.deepcopy(rec)
    rec.pop("host", None)
    rec["run"] = run_id
    for key in ("detail", "fix"):
        if isinstance(rec.get(key), str):
            rec[key] = rec[key].replace(old, new)
    return rec


def grow(source: dict, n: int) -> tuple[dict, dict, list[str], dict]:
    """(results {host: records or None}, models {host: cluster_model}, hosts in rank order, faults) of n nodes."""
    src_head, src_worker = source["hosts"][0], source["hosts"][1]
    run_id = source["run_id"]
    hosts = [f"gpu-node{i}" for i in range(n)]
    head = hosts[0]
    faults = {"low_mtu": hosts[n // 3], "unreachable": hosts[n // 2], "refused": hosts[(2 * n) // 3],
              "driver": hosts[n - 1]}
    models = {}
    for i, h in enumerate(hosts):
        base = source["cluster_model"][src_head if i == 0 else src_worker]
        models[h] = dict(base, node_rank=i, data_address=_address(i), head=head, master_addr=_address(0),
                         hosts_by_rank=list(hosts), nnodes=n, world_size=n * int(base.get("nproc_per_node", 1)))
    # The network role's plan, by its own code, with its defaults.
    facts = {h: {"selected": {"iface": "ens1", "address": _address(i),
                              "mtu": 1500 if h == faults["low_mtu"] else MTU},
                 "interfaces": {"ens1": {"nets": [_address(i) + "/16"]}},
                 "route": {"ok": True, "dev": "ens1"}, "config": {"method": "netplan", "path": "/etc/netplan/60-data.yaml"},
                 "in_container": False, "bridges": [], "persisted": {}, "mtu_set": {}}
             for i, h in enumerate(hosts)}
    plan = netrecords.cluster_plan(hosts, facts, MTU, full_mesh_max=16, samples=2, seed=0)
    plan["expected"] = MTU  # the configured MTU (the low node fails against it)
    held = {"verdict": {"ok": True, "state": "free", "detail": f"port {PORT} is free: the probe listener ran on it",
                        "fix": ""}, "listener": {"listening": True}}
    port_opts = {"nodes": len(hosts), "head_in_play": head in hosts, "head": head, "master_addr": _address(0),
                 "master_port": PORT, "check_mode": False}
    bad_nodes = {faults["low_mtu"], faults["unreachable"]}
    results: dict[str, list | None] = {}
    for i, h in enumerate(hosts):
        if h == faults["unreachable"]:
            results[h] = None
            continue
        src = src_head if i == 0 else src_worker
        recs = [_retarget(r, src, h, run_id) for r in source["records"]
                if r["host"] == src and r["check"] != "network.enabled"]
        if h == faults["driver"]:
            for r in recs:
                if r["check"] == "nvidia_driver.smi":
                    r["data"]["drift"] = dict(r["data"].get("drift") or {}, driver="570.86.15")
        net = netrecords.probe_records(facts[h], {"host": h, "requested": "", "head_address": _address(0),
                                                  "is_head": i == 0, "measure": False, "manage": True,
                                                  "persist": True, "mgmt": ""}, True, "", MTU)
        probes = {}
        for peer, address in ((p["name"], p["address"]) for p in plan["peers"].get(h, [])):
            base_ok = peer != faults["unreachable"]
            full_ok = base_ok and not ({h, peer} & bad_nodes)
            probes[peer] = {"address": address,
                            "full": {"ok": full_ok, "outcome": "ok" if full_ok else "lost"},
                            "base": {"ok": base_ok, "outcome": "ok" if base_ok else "lost"}}
        net.append(netrecords.path_record(h, plan, {"probes": probes, "seconds": 1.1}))
        reach = {"outcome": "refused" if h == faults["refused"] else "ok", "message": "", "seconds": 0.01}
        net += netrecords.port_records(h, port_opts, held, reach)
        results[h] = recs + [dict(r, run=run_id, **({} if "data" in r else {"data": {}})) for r in net]
    return results, models, hosts, faults


def job_training(results: dict, hosts: list[str], busy_names: str = "bounded") -> None:
    """The converged re-run while the job trains on every node: nccl_check's two records of each node become the skips
    roles/nccl_check/tasks/enabled.yml records then (its detail's text; where the job trains by the role's filter, or
    every node named with busy_names 'every', the record before the filter)."""
    where = allreduce_checks.busy_nodes(hosts, hosts) if busy_names == "bounded" else ", ".join(hosts)
    detail = (f"not measured: job train is training on {where} (an all-reduce now would compete with it for the GPUs "
              "and the network)")
    fix = ("Measure once the job has ended (playbooks/status.yml) or after reset.yml: ansible-playbook "
           "playbooks/nccl_check.yml; or set nccl_check_while_running: true")
    for recs in results.values():
        for i, rec in enumerate(recs or []):
            if rec["check"] in ("nccl_check.inter_node", "nccl_check.intra_node"):
                recs[i] = dict(rec, status="skip", detail=detail, fix=fix, data={})


def chromium(*args: str, timeout: int = 120) -> tuple[subprocess.CompletedProcess, float]:
    """Headless Chromium on a page: (its result, seconds); a run past ``timeout`` counts as failed (rc 124)."""
    binary = shutil.which("chromium") or "/usr/bin/chromium"
    argv = [binary, *CHROMIUM_FLAGS, *args]
    with tempfile.TemporaryDirectory() as profile:
        t0 = time.monotonic()
        try:
            r = subprocess.run([*argv, f"--user-data-dir={profile}"], capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            r = subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout} s")
        return r, time.monotonic() - t0


def measure(n: int, repeats: int, out: Path, browser: bool, training: bool = False,
            busy_names: str = "bounded") -> dict:
    source = json.loads(SOURCE.read_text())
    results, models, hosts, faults = grow(source, n)
    if training:
        job_training(results, hosts, busy_names)
    t0 = time.monotonic()
    report = cluster_report.build_report(results, hosts, models, source["run_id"], str(out),
                                         generated=source["generated"])
    build_s = time.monotonic() - t0
    text = json.dumps(report, indent=1, sort_keys=True, separators=(",", ": ")) + "\n"  # to_nice_json(indent=1)
    walls, cpus, page = [], [], ""
    for _ in range(repeats):
        w0, c0 = time.monotonic(), time.process_time()
        page = health_page.render(report)
        walls.append(time.monotonic() - w0)
        cpus.append(time.process_time() - c0)
    md = cluster_report.markdown(report)
    out.mkdir(parents=True, exist_ok=True)
    html_path = out / f"health-{n}.html"
    html_path.write_text(page, encoding="utf-8")
    row = {"nodes": n, **({"scenario": f"job training, busy names {busy_names}"} if training else {}),
           "records": len(report["records"]), "failures": len(report["failures"]),
           "summary": report["summary"], "faults": faults, "build_s": round(build_s, 3),
           "render_s": round(statistics.median(walls), 3), "render_cpu_s": round(statistics.median(cpus), 3),
           "page_mb": round(len(page.encode()) / 1e6, 3), "report_json_mb": round(len(text.encode()) / 1e6, 3),
           "report_md_mb": round(len(md.encode()) / 1e6, 3), "load_1min": round(os.getloadavg()[0], 1)}
    if browser:
        dom, dom_s = chromium("--dump-dom", html_path.as_uri())
        shot = out / f"health-{n}.png"
        r, shot_s = chromium("--window-size=1400,1200", f"--screenshot={shot}", html_path.as_uri())
        row.update(browser_ready='data-ready="1"' in dom.stdout, dom_s=round(dom_s, 2),
                   screenshot_ok=r.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000,
                   screenshot_s=round(shot_s, 2))
    return row


SIZES = [64, 256, 1024]
TITLE = "## Health page and report.json at scale"
COLUMNS = [("nodes", "nodes", "d"), ("records", "records", "d"), ("failures", "failures", "d"),
           ("render s", "render_s", ".2f"), ("render CPU s", "render_cpu_s", ".2f"), ("load", "load_1min", ".1f"),
           ("page MB", "page_mb", ".2f"),
           ("report.json MB", "report_json_mb", ".2f"), ("report.md MB", "report_md_mb", ".2f"),
           ("Chromium: script ran", "browser_ready", ""), ("screenshot", "screenshot_ok", ""),
           ("screenshot s", "screenshot_s", ".1f")]


def section(results: dict) -> str:
    """The docs/benchmarks.md section of a run: what was measured, the command, the table."""
    from scale import table  # tests/bench/scale.py: the tables of every section
    return (f"{TITLE}\n\nA real 2-node report grown to N nodes the way the product probes at that size "
            "(tests/bench/health.py says how), rendered by the report play's filters; render time the median of "
            f"{results['repeats']} (wall and CPU; load: the machine's 1-minute load average then); the page opened "
            "in headless Chromium (the page's script ran; a 1400x1200 screenshot). Raw output: "
            "`docs/benchmarks-health.json`.\n\n"
            f"Command: `{results['command']}`\n\n" + table(results["rows"], COLUMNS))


def bench_health(sizes: list[int], repeats: int, out: Path | None = None, browser: bool = True,
                 training: bool = False, busy_names: str = "bounded") -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        where = out or Path(tmp)
        for n in sizes:
            log(f"{n} nodes")
            rows.append(measure(n, repeats, where, browser and bool(shutil.which("chromium")), training, busy_names))
            log(json.dumps(rows[-1]))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="keep the pages and screenshots here")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--training", action="store_true",
                    help="the converged re-run while the job trains (nccl_check records that it waits)")
    ap.add_argument("--busy-names", choices=["bounded", "every"], default="bounded",
                    help="with --training: where the job trains as the role names it, or every node named")
    ap.add_argument("--write", action="store_true", help=f"write the raw output to {RAW.relative_to(REPO)}")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    extra = (" --training --busy-names " + args.busy_names) if args.training else ""
    results = {"command": f".venv/bin/python tests/bench/health.py --sizes {args.sizes} --repeats {args.repeats}"
                          f"{extra}{' --no-browser' if args.no_browser else ''}",
               "repeats": args.repeats,
               "rows": bench_health(sizes, args.repeats, args.out, not args.no_browser, args.training,
                                    args.busy_names)}
    if args.write and not args.training:
        RAW.write_text(json.dumps(results, indent=1) + "\n")
    print(section(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
