#!/usr/bin/env python3
"""Network role figures (prints them; asserts nothing):

  pairwise  the don't-fragment path check between every pair of nodes at 3, 8 and 16 simulated nodes:
            wall time of the Ansible task (all nodes at once, n·(n-1)·2 pings) and the slowest node's probe time
  mismatch  on 3 nodes with one node's data MTU at 1500 (network_manage_mtu=false): seconds from the start of
            site.yml to the network.mtu record of that node, and to the end of the failed run

    python3 tests/bench/bench_network.py [--sizes 3,8,16] [--repeats 3] [--only pairwise,mismatch]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from helpers import BIN, ansible_env, sim_down, sim_up  # noqa: E402

PLAYBOOK = "tests/integration/playbooks/network.yml"
TASK_TIME = re.compile(r"^network : Ping every peer with don't-fragment pings.*?(\d+\.\d+)s\s*$", re.M)


def log(msg: str) -> None:
    print(f"[bench_network] {msg}", file=sys.stderr, flush=True)


def run(inventory: Path, playbook: str, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), playbook, *args]
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=1800)
    return time.monotonic() - t0, r


def pairwise(sizes: list[int], repeats: int) -> list[dict]:
    rows = []
    for n in sizes:
        name = f"bn{n}"
        log(f"{n} nodes: bring-up")
        c = sim_up(name, nodes=n)
        try:
            tasks, probes, oks = [], [], []
            with tempfile.TemporaryDirectory() as tmp:
                for i in range(repeats):
                    report = Path(tmp) / f"r{i}.json"
                    _, r = run(c.inventory, PLAYBOOK, "-e", f"network_report={report}",
                               "-e", "network_port_check=false")
                    m = TASK_TIME.search(r.stdout)
                    if m:
                        tasks.append(float(m.group(1)))
                    if report.exists():
                        recs = json.loads(report.read_text())["records"]
                        path = [x for h in recs.values() for x in h if x["check"] == "network.path_mtu"]
                        secs = [float(re.search(r"\((\d+\.?\d*) s\)", x["detail"]).group(1)) for x in path
                                if re.search(r"\((\d+\.?\d*) s\)", x["detail"])]
                        probes.append(max(secs) if secs else float("nan"))
                        oks.append(len(path) == n and all(x["status"] == "pass" for x in path))
            rows.append({"nodes": n, "pings": n * (n - 1) * 2,
                         "task_s": statistics.median(tasks) if tasks else float("nan"),
                         "probe_s": statistics.median(probes) if probes else float("nan"),
                         "all_pass": all(oks) and bool(oks)})
            log(f"{n} nodes: {rows[-1]}")
        finally:
            sim_down(name)
    return rows


def mismatch(repeats: int) -> list[dict]:
    rows = []
    c = sim_up("bnmis", nodes=3)
    low = c.nodes[2]
    try:
        for playbook in ("site.yml", PLAYBOOK):
            to_record, to_end, named = [], [], []
            for _ in range(repeats):
                c.set_mtu(low, 1500)
                try:
                    argv = [str(BIN / "ansible-playbook"), "-i", str(c.inventory), playbook,
                            "-e", "network_manage_mtu=false"]
                    t0 = time.monotonic()
                    seen = None
                    out = []
                    p = subprocess.Popen(argv, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
                    in_mtu_task = False
                    for line in p.stdout:
                        out.append(line)
                        if line.startswith("TASK [network : Ping every peer with don't-fragment pings"):  # records
                            in_mtu_task = True
                        elif in_mtu_task and line.startswith("TASK ["):
                            in_mtu_task = False
                            seen = seen or time.monotonic() - t0
                    rc = p.wait()
                    end = time.monotonic() - t0
                finally:
                    c.set_mtu(low, 9000)
                text = "".join(out)
                to_record.append(seen if seen is not None else float("nan"))
                to_end.append(end)
                named.append(rc != 0 and low in text and re.search(r"(?i)mtu", text) is not None
                             if playbook == "site.yml" else seen is not None)
                if seen is None:
                    log(f"{playbook}: the network role did not run; last lines:\n{''.join(out[-15:])}")
            rows.append({"playbook": playbook, "to_mtu_record_s": statistics.median(to_record),
                         "to_exit_s": statistics.median(to_end), "named": all(named)})
            log(f"mismatch via {playbook}: {rows[-1]}")
    finally:
        sim_down("bnmis")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="3,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="pairwise,mismatch")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if "pairwise" in only:
        rows = pairwise([int(s) for s in args.sizes.split(",")], args.repeats)
        print("Pairwise don't-fragment path check (all nodes at once; task = Ansible task wall time, "
              "probe = slowest node's pings)")
        print(f"{'nodes':>5} {'pings':>6} {'task s':>8} {'probe s':>8}  all pass")
        for r in rows:
            print(f"{r['nodes']:>5} {r['pings']:>6} {r['task_s']:>8.2f} {r['probe_s']:>8.2f}  {r['all_pass']}")
    if "mismatch" in only:
        rows = mismatch(args.repeats)
        print("One node's data MTU 1500, others 9000, 3 nodes, network_manage_mtu=false")
        print(f"{'playbook':<40} {'to network.mtu record s':>24} {'to exit s':>10}  named")
        for r in rows:
            print(f"{r['playbook']:<40} {r['to_mtu_record_s']:>24.1f} {r['to_exit_s']:>10.1f}  {r['named']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
