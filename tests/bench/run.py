#!/usr/bin/env python3
"""Benchmark suite (`make bench`): prints tables and writes docs/benchmarks.md.

    .venv/bin/python tests/bench/run.py [--sizes 2,4,8,16] [--repeats 3] [--only site,faults,...]

What it measures (medians of --repeats runs; ratios measured side by side in one run):
  bringup   simulated-cluster bring-up time (3 nodes, images cached)
  site      first site.yml run and converged re-run (changed=0) per cluster size
  config    converged re-run with Ansible's defaults vs the project's ansible.cfg (ratio)
  faults    time from `ansible-playbook` start to the named failure, per injected fault
  scripts   the per-area benchmark scripts (tests/bench/bench_*.py): validation, network, launch, janitor, reset
  scale     converged site.yml on light nodes per size (--sizes 16,32,64): wall, controller and node CPU per node,
            tasks and remote executions per node, the faster-than-linear tasks apart, a fitted model and its
            projection to 1,024 nodes; --config-at N adds ansible.cfg against Ansible's defaults, one setting at a
            time, at N nodes (tests/bench/scale.py; raw output docs/benchmarks-scale.json)
  userpath  converged site.yml with every role on (default simulated nodes, a long job) at --userpath-sizes
            (2,4,8), the light harness beside it at each size: controller CPU, its slope per added node and per
            run, tasks run and skipped on the head and a worker; the roles' cost (the difference) added to the
            light harness's 16-64-node points, said to be estimates, and projected to 1,024 nodes
            (tests/bench/userpath.py; raw output docs/benchmarks-userpath.json)
  health    the health page and report.json of a report grown to 64, 256 and 1,024 nodes: render time, sizes, and
            whether headless Chromium opens the page (tests/bench/health.py; raw output docs/benchmarks-health.json)
  reset     reset.yml after a crash on 3 default simulated nodes (a fresh launch, one rank killed -9, reset.yml timed),
            --repeats times: median and spread (tests/bench/reset.py; raw output docs/benchmarks-reset.json)
  shards    converged site.yml on light nodes in one ansible-playbook process against K child processes
            (docs/sharding.md) at --shard-sizes (16,32), K in --shard-counts (1,2), side by side per round: wall,
            controller CPU, the parent's and each child's main process, changed, the same report; per-node costs and
            a 16-core projection (tests/bench/shards.py; raw output docs/benchmarks-shards.json)
  mitogen   Ansible's linear strategy against the opt-in mitogen_linear, side by side on 3 default simulated nodes:
            converged site.yml and reset.yml after a crash (tests/bench/mitogen_strategy.py; raw docs/benchmarks-mitogen.json)
Figures are never asserted: this is measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests/bench"))
from helpers import BIN, SimCluster, ansible_env, parse_recap, run_playbook, sim_down, sim_up  # noqa: E402
from scale import table  # noqa: E402  (tests/bench/scale.py: the markdown tables of every section)

DOC = REPO / "docs/benchmarks.md"
# docs/benchmarks.md: the tables above this line are this script's; the analysis from it on is written by hand
# (targets, where the time goes, what was tried) and kept as it is when the tables are rewritten.
ANALYSIS_MARK = "<!-- analysis: written by hand; tests/bench/run.py rewrites only what is above this line -->"
DEFAULTS_CFG = REPO / "tests/bench/ansible-defaults.cfg"
SCALE_TITLE = "## Scale"
HEALTH_TITLE = "## Health page"
RESET_TITLE = "## reset.yml after a crash"
SHARDS_TITLE = "## Sharded runs"


def log(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


def timed_playbook(inventory: Path, playbook: str, *args: str, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    r = run_playbook(inventory, playbook, *args, env=env)
    return time.monotonic() - t0, r


def playbook_until(inventory: Path, playbook: str, pattern: str, *args: str) -> tuple[float | None, float, int, str]:
    """Run a playbook reading its output as it comes: (seconds to the first line matching pattern or None,
    seconds to the end, return code, output)."""
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), playbook, *args]
    t0 = time.monotonic()
    first, lines = None, []
    with subprocess.Popen(argv, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as p:
        for line in p.stdout:
            lines.append(line)
            if first is None and re.search(pattern, line):
                first = time.monotonic() - t0
        rc = p.wait()
    return first, time.monotonic() - t0, rc, "".join(lines)


def changed_total(output: str) -> int:
    return sum(v["changed"] for v in parse_recap(output).values())


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# --------------------------------------------------------------------------- site runs per size

# The example job runs through every re-run of a size (a re-run while the job trains is the everyday case: it must
# change nothing and leave the job alone); the same options every time, so the launch sees the same command.
LONG_JOB = ["-e", json.dumps({"train_args_options": {"--steps": 100000, "--save-every": 50, "--sleep": 0.2,
                                                     "--output-root": "{{ train_args_output_dir }}"}})]


def bench_site(sizes: list[int], repeats: int) -> tuple[list[dict], list[dict]]:
    rows, cfg_rows = [], []
    for n in sizes:
        name = f"b{n}"
        log(f"{n} nodes: bring-up")
        t0 = time.monotonic()
        c = sim_up(name, nodes=n)
        up = time.monotonic() - t0
        try:
            first, r = timed_playbook(c.inventory, "site.yml", *LONG_JOB)
            ok_first = r.returncode == 0
            if not ok_first:
                log(f"{n} nodes: first site.yml failed:\n{r.stdout[-3000:]}")
            reruns, changed = [], []
            for _ in range(repeats):
                t, r = timed_playbook(c.inventory, "site.yml", *LONG_JOB)
                reruns.append(t)
                changed.append(changed_total(r.stdout) if r.returncode == 0 else -1)
            rows.append({"nodes": n, "bringup_s": up, "first_s": first, "first_ok": ok_first,
                         "rerun_s": median(reruns), "rerun_changed": max(changed) if changed else None})
            # Ansible's defaults vs the project's settings, side by side on the same converged cluster.
            t_proj, _ = timed_playbook(c.inventory, "site.yml", *LONG_JOB)
            t_def, rd = timed_playbook(c.inventory, "site.yml", *LONG_JOB, env={"ANSIBLE_CONFIG": str(DEFAULTS_CFG)})
            cfg_rows.append({"nodes": n, "project_s": t_proj, "defaults_s": t_def,
                             "defaults_ok": rd.returncode == 0,
                             "ratio": t_def / t_proj if (t_proj and rd.returncode == 0) else None})
        finally:
            sim_down(name)
    return rows, cfg_rows


# --------------------------------------------------------------------------- faults

@dataclass
class Fault:
    name: str
    expect: str                                   # regex that names the failure in the output
    inject: Callable[[SimCluster], None] = lambda c: None
    undo: Callable[[SimCluster], None] = lambda c: None
    args: list[str] = field(default_factory=list)
    inventory: Callable[[SimCluster, Path], Path] | None = None


def _fault_file(node_index: int, text: str) -> tuple[Callable, Callable]:
    def inject(c: SimCluster) -> None:
        c.exec(c.nodes[node_index], ["sh", "-c", f"mkdir -p /etc/trainyard-standin && printf '%s\\n' '{text}' "
                                                 "> /etc/trainyard-standin/fault"])

    def undo(c: SimCluster) -> None:
        c.exec(c.nodes[node_index], ["rm", "-f", "/etc/trainyard-standin/fault"])
    return inject, undo


def _bad_inventory(mutate: Callable[[str], str]) -> Callable[[SimCluster, Path], Path]:
    def build(c: SimCluster, tmp: Path) -> Path:
        import shutil
        dst = tmp / "inv"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(c.inventory, dst)
        gv = dst / "group_vars/all.yml"
        gv.write_text(mutate(gv.read_text()))
        return dst
    return build


def faults() -> list[Fault]:
    out = [
        Fault("validation: MTU out of range", r"Stop if cluster_data_mtu is outside",
              inventory=_bad_inventory(lambda s: re.sub(r"cluster_data_mtu: \d+", "cluster_data_mtu: 20000", s))),
        Fault("validation: port as a string", r"Stop if cluster_rendezvous_port",
              inventory=_bad_inventory(lambda s: s.replace("cluster_rendezvous_port: 39500",
                                                           "cluster_rendezvous_port: \"39500x\""))),
        Fault("network: one node's data MTU 1500", r"node3: network\.(path_)?mtu FAIL",
              inject=lambda c: c.set_mtu(c.nodes[2], 1500), undo=lambda c: c.set_mtu(c.nodes[2], 9000),
              args=["-e", "network_manage_mtu=false"]),
        Fault("network: port held by another process", r"network\.rendezvous_port FAIL: port 39500 is held by another",
              inject=lambda c: c.exec(c.head, ["sh", "-c", "nohup python3 -c \"import socket,time;s=socket.socket();"
                                                           "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
                                                           "s.bind(('0.0.0.0',39500));s.listen();time.sleep(600)\" "
                                                           ">/dev/null 2>&1 & echo $! > /tmp/bench-holder.pid"]),
              undo=lambda c: c.exec(c.head, ["sh", "-c", "kill $(cat /tmp/bench-holder.pid)"], check=False)),
        Fault("network: port dropped by a firewall", r"network\.rendezvous_reach FAIL: .*timed out",
              inject=lambda c: c.exec(c.head, ["iptables", "-I", "INPUT", "-p", "tcp", "--dport", "39500", "-j", "DROP"]),
              undo=lambda c: c.exec(c.head, ["iptables", "-D", "INPUT", "-p", "tcp", "--dport", "39500", "-j", "DROP"],
                                    check=False)),
    ]
    for label, text, expect in [("fabric state In Progress", "fabric=In Progress", r"node2: fabricmanager\.fabric FAIL"),
                                ("driver drift on one node", "driver=570.86.15", r"node2: nvidia_driver\.drift FAIL"),
                                ("fewer GPUs than configured", "gpus=3", r"node2: nvidia_driver\.gpu_count FAIL"),
                                ("fabric manager version differs", "fabricmanager=580.95.05", r"node2: fabricmanager\.version FAIL")]:
        inject, undo = _fault_file(1, text)
        out.append(Fault(f"gpu: {label}", expect, inject=inject, undo=undo))
    out.append(Fault("container: training container stopped on one node", r"node2: container\.running FAIL",
                     inject=lambda c: c.exec(c.nodes[1], ["docker", "stop", "-t", "0", "trainyard-train"]),
                     undo=lambda c: c.exec(c.nodes[1], ["docker", "start", "trainyard-train"], check=False)))
    return out


def bench_faults(repeats: int) -> list[dict]:
    import tempfile
    rows = []
    c = sim_up("bfault", nodes=3)
    try:
        # Converge first (no job: a running job would hold the rendezvous port): faults are the only difference.
        t, r = timed_playbook(c.inventory, "site.yml", "--skip-tags", "launch")
        log(f"fault cluster converged in {t:.1f} s (rc {r.returncode})")
        with tempfile.TemporaryDirectory() as tmp:
            for f in faults():
                times, ends, named = [], [], True
                for _ in range(repeats):
                    inv = f.inventory(c, Path(tmp)) if f.inventory else c.inventory
                    f.inject(c)
                    try:
                        first, end, rc, _ = playbook_until(inv, "playbooks/preflight.yml", f.expect, *f.args)
                    finally:
                        f.undo(c)
                    named = named and rc != 0 and first is not None
                    times.append(first if first is not None else end)
                    ends.append(end)
                rows.append({"fault": f.name, "seconds": median(times), "run_s": median(ends), "named": named})
                log(f"{f.name}: named after {median(times):.1f} s, run {median(ends):.1f} s, named={named}")
    finally:
        sim_down("bfault")
    return rows


# --------------------------------------------------------------------------- per-area scripts

def bench_scripts() -> list[tuple[str, str]]:
    out = []
    for script in sorted((REPO / "tests/bench").glob("bench_*.py")):
        log(f"running {script.name}")
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=3600)
        text = (r.stdout.strip() or "(no output)") + (f"\n(exit {r.returncode}: {r.stderr[-500:]})" if r.returncode else "")
        out.append((f"{script.name} ({time.monotonic() - t0:.0f} s)", text))
        print(text, flush=True)
    return out


# --------------------------------------------------------------------------- report

def machine() -> str:
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), "?")
    docker = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                            text=True).stdout.strip()
    return (f"{platform.node()}: {os.cpu_count()} cores, {int(mem) // 1024 // 1024} GiB RAM, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, dockerd {docker}")


def _split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The measured part of the doc -> (header, [('## title' line, section text)])."""
    parts = re.split(r"(?m)^(?=## )", text)
    return parts[0], [(p.splitlines()[0], p) for p in parts[1:]]


def write_doc(sections: list[str], keep_header: bool = False) -> None:
    """Write the measured sections, keeping the hand-written analysis at the end of the file, and every measured
    section of the old file that this run did not measure (by its title), in place."""
    old = DOC.read_text() if DOC.exists() else ""
    tail = old[old.index(ANALYSIS_MARK):] if ANALYSIS_MARK in old else ""
    old_head, old_secs = _split_sections(old[:old.index(ANALYSIS_MARK)] if ANALYSIS_MARK in old else old)
    new_head, new_secs = _split_sections("\n".join(sections))
    fresh = dict(new_secs)
    # A full run rewrites its own tables as before; a scale-only run keeps the others; the scale, health and reset
    # tables survive a run without them.
    kept = [(t, x) for t, x in old_secs
            if t in fresh or keep_header or t.startswith((SCALE_TITLE, HEALTH_TITLE, RESET_TITLE, SHARDS_TITLE))]
    merged = [fresh.pop(title, text) for title, text in kept] + [text for title, text in new_secs if title in fresh]
    head = old_head if (keep_header and old_head.strip()) else new_head
    body = head.rstrip("\n") + "\n\n" + "".join(p.rstrip("\n") + "\n\n" for p in merged)
    DOC.write_text(body.rstrip("\n") + "\n" + ("\n" + tail if tail else ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=os.environ.get("BENCH_SIZES", "2,4,8,16"))
    p.add_argument("--repeats", type=int, default=int(os.environ.get("BENCH_REPEATS", "3")))
    p.add_argument("--only", default=os.environ.get("BENCH_ONLY", "site,faults,scripts,health"))
    p.add_argument("--shard-sizes", default=os.environ.get("BENCH_SHARD_SIZES", "16,32"),
                   help="shards: the sizes of light simulated nodes")
    p.add_argument("--shard-kind", choices=["light", "user"], default="light",
                   help="shards: light simulated nodes, or default ones with every role on (the user's path)")
    p.add_argument("--shard-counts", default=os.environ.get("BENCH_SHARD_COUNTS", "1,2"),
                   help="shards: the process counts K compared (1 = one process)")
    p.add_argument("--userpath-sizes", default=os.environ.get("BENCH_USERPATH_SIZES", "2,4,8"),
                   help="userpath: the sizes of default simulated nodes (every role on), the light harness beside each")
    p.add_argument("--config-at", type=int, default=None,
                   help="scale: also measure ansible.cfg against Ansible's defaults at this size (one of --sizes)")
    p.add_argument("--from-raw", action="store_true",
                   help="scale, userpath: rewrite the doc's tables from their raw files without measuring")
    args = p.parse_args()
    only = set(args.only.split(","))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    sections = [f"# Benchmarks\n\nMachine: {machine()}  \nDate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  \n"
                f"Command: `.venv/bin/python tests/bench/run.py --sizes {args.sizes} --repeats {args.repeats} --only {args.only}` "
                "(`make bench`)\n"]
    keep_header = not (only & {"site", "faults", "scripts"})  # a scale-only run keeps the other tables' header
    if "reset" in only:
        import reset
        results = json.loads(reset.RAW.read_text()) if reset.RAW.exists() else {}
        results["command"] = f".venv/bin/python tests/bench/run.py --only reset --repeats {args.repeats}"
        results.setdefault("trees", {})["this tree"] = reset.bench_reset(args.repeats, os.environ.get("TY_SIM_NAME", "br"))
        reset.RAW.write_text(json.dumps(results, indent=1) + "\n")
        sections.append(reset.section(results))
        print(sections[-1], flush=True)
        write_doc(sections, keep_header)
    if "shards" in only:
        import shards as shards_bench
        import userpath
        raw = shards_bench.raw_path(args.shard_kind)
        if args.from_raw:
            results = json.loads(raw.read_text())
        else:
            results = shards_bench.bench_shards([int(x) for x in args.shard_sizes.split(",") if x],
                                                [int(x) for x in args.shard_counts.split(",") if x], args.repeats,
                                                args.shard_kind)
            results["command"] = (f".venv/bin/python tests/bench/run.py --only shards --shard-kind {args.shard_kind} "
                                  f"--shard-sizes {args.shard_sizes} --shard-counts {args.shard_counts} "
                                  f"--repeats {args.repeats}")
            raw.write_text(json.dumps(results, indent=1) + "\n")
        estimate = None
        if args.shard_kind == "user" and shards_bench.RAW.exists() and userpath.RAW.exists():
            estimate = shards_bench.user_estimate(json.loads(shards_bench.RAW.read_text()),
                                                  json.loads(userpath.RAW.read_text()))
            results["estimate"] = estimate
            raw.write_text(json.dumps(results, indent=1) + "\n")
        sections.append(shards_bench.section(results, machine(), estimate))
        print(sections[-1], flush=True)
        write_doc(sections, keep_header)
    if "mitogen" in only:
        import mitogen_strategy as mitogen_bench
        results = mitogen_bench.bench_mitogen(args.repeats, os.environ.get("TY_SIM_NAME", "bm"))
        results["command"] = f".venv/bin/python tests/bench/run.py --only mitogen --repeats {args.repeats}"
        mitogen_bench.RAW.write_text(json.dumps(results, indent=1) + "\n")
        sections.append(mitogen_bench.section(results))
        print(sections[-1], flush=True)
        write_doc(sections, keep_header)
    if "scale" in only:
        import scale
        if args.from_raw:
            results = json.loads(scale.RAW.read_text())
            command = results.get("command", "")
        else:
            command = (f".venv/bin/python tests/bench/run.py --only scale --sizes {args.sizes} --repeats {args.repeats}"
                       + (f" --config-at {args.config_at}" if args.config_at else ""))
            results = scale.bench_scale(sizes, args.repeats, args.config_at)
            results["command"] = command
            scale.RAW.write_text(json.dumps(results, indent=1) + "\n")
        sections += scale.sections(results, command, machine())
        print("\n".join(sections[1:]), flush=True)
        write_doc(sections, keep_header)
    if "userpath" in only:
        import userpath
        import scale
        scale_results = json.loads(scale.RAW.read_text()) if "scale" in only and scale.RAW.exists() else None
        command = f".venv/bin/python tests/bench/run.py --only userpath --userpath-sizes {args.userpath_sizes} --repeats {args.repeats}"
        if args.from_raw:
            results = json.loads(userpath.RAW.read_text())
            light = json.loads(scale.RAW.read_text()) if scale.RAW.exists() else {}
            sections.append(userpath.section(results, light, results.get("scale_source", "?"), machine()))
        else:
            sections.append(userpath.run([int(s) for s in args.userpath_sizes.split(",") if s], args.repeats,
                                         command, scale_results, machine()))
        print(sections[-1], flush=True)
        write_doc(sections, keep_header)
    if "health" in only:
        import health
        results = {"command": f".venv/bin/python tests/bench/run.py --only health --repeats {args.repeats}",
                   "repeats": args.repeats, "rows": health.bench_health(health.SIZES, args.repeats)}
        health.RAW.write_text(json.dumps(results, indent=1) + "\n")
        sections.append(health.section(results))
        print(sections[-1], flush=True)
        write_doc(sections, keep_header)
    if "site" in only:
        rows, cfg = bench_site(sizes, args.repeats)
        sections.append("## site.yml per cluster size\n\nFirst run (images pulled, everything installed) and converged "
                        f"re-run (median of {args.repeats}; `changed` must be 0).\n\n" + table(rows, [
                            ("nodes", "nodes", "d"), ("bring-up s", "bringup_s", ".1f"), ("first run s", "first_s", ".1f"),
                            ("first ok", "first_ok", ""), ("re-run s", "rerun_s", ".1f"),
                            ("re-run changed", "rerun_changed", "")]))
        sections.append("## Project ansible.cfg vs Ansible's defaults (converged re-run, side by side)\n\n"
                        f"Defaults: `{DEFAULTS_CFG.relative_to(REPO)}` (paths only: no pipelining, Ansible's own SSH "
                        "multiplexing settings, forks 5, 1 ms internal poll interval).\n\n" + table(cfg, [
                            ("nodes", "nodes", "d"), ("project s", "project_s", ".1f"), ("defaults s", "defaults_s", ".1f"),
                            ("defaults ok", "defaults_ok", ""), ("defaults / project", "ratio", ".2f")]))
        print("\n".join(sections[-2:]), flush=True)
        write_doc(sections, keep_header)  # after every section: a long suite cut short keeps what it measured
    if "faults" in only:
        rows = bench_faults(max(1, args.repeats))
        sections.append("## Time to a named failure, per injected fault (3 nodes, `playbooks/preflight.yml`)\n\n"
                        "From the start of ansible-playbook to the first output line that names the node and the "
                        "check (`<node>: <check> FAIL`), and to the end of the failed run.\n\n"
                        + table(rows, [("fault", "fault", ""), ("named after s", "seconds", ".1f"),
                                       ("run s", "run_s", ".1f"), ("named", "named", "")]))
        print(sections[-1], flush=True)
        write_doc(sections, keep_header)
    if "scripts" in only:
        for title, text in bench_scripts():
            sections.append(f"## {title}\n\n```\n{text}\n```\n")
    write_doc(sections, keep_header)
    log(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
