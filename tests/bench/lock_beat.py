#!/usr/bin/env python3
"""What one beat of the cluster lock's heartbeat costs (prints figures; asserts nothing).

The callback cluster_lock beats every held lock every cluster_lock_stale_s/4 seconds with one ad-hoc run over every
node (plugin_utils/lock_keeper.py). This bench takes the lock on the first N nodes of a simulated cluster and times
beats of two kinds, alternating, --repeats times each, at every size of --sizes:

  module  the module cluster_lock, state=heartbeat (the beat before BEAT_SCRIPT): a Python module built, sent and run
  raw     lock_keeper.beat_argv: the module raw running BEAT_SCRIPT (no module, no Python on the node)

For each: wall time, the controller's CPU (the ad-hoc process and its workers and SSH clients: a cpuacct cgroup of
their own, as tests/bench/scale.py measures ansible-playbook) and the nodes' CPU (their containers' cpuacct), medians;
then the cost per added node (least squares over the sizes). Every beat is checked: exit status 0 and the head's lock
touched.

    .venv/bin/python tests/bench/lock_beat.py [--name <running sim cluster>] [--nodes 32] [--sizes 8,16,32]
                                                [--repeats 5] [--json out.json]

Without --name it brings up its own light cluster (bench-beat) and removes it afterwards.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "bench"))
sys.path.insert(0, str(REPO / "collections"))
from helpers import BIN, SIM, SimCluster, ansible_env  # noqa: E402
from scale import CpuGroup, container_cpu_s  # noqa: E402

from ansible_collections.trainyard.core.plugins.plugin_utils import lock_keeper  # noqa: E402

LOCK_DIR = "/var/lib/trainyard-lock"
TOKEN = "0be47c0ffee0be47c0ffee00"  # a run token's shape (24 hex digits); no real run holds it


def log(msg: str) -> None:
    print(f"[bench:lock-beat] {msg}", flush=True)


def argv_of(kind: str, cliargs: dict, hosts: list[str]) -> list[str]:
    python = str(BIN / "python")
    if kind == "module":
        return lock_keeper.adhoc_argv(cliargs, hosts, {"path": LOCK_DIR, "state": "heartbeat", "token": TOKEN}, python)
    return lock_keeper.beat_argv(cliargs, hosts, LOCK_DIR, TOKEN, python)


def lock_mtime(cluster: SimCluster, node: str) -> float:
    out = cluster.exec(node, ["stat", "-c", "%.Y", f"{LOCK_DIR}/cluster.lock"]).stdout
    return float(out.strip().replace(",", "."))


def one_beat(kind: str, cluster: SimCluster, hosts: list[str], ids: list[str], group: CpuGroup) -> dict:
    cliargs = {"inventory": (str(cluster.inventory),)}
    before_mtime = lock_mtime(cluster, hosts[0])
    time.sleep(1.1)  # a touch within the same second as the last one must still show
    c0, n0, t0 = group.usage_s(), container_cpu_s(ids), time.monotonic()
    r = subprocess.run(argv_of(kind, cliargs, hosts), cwd=REPO, env=ansible_env(), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=group.enter)
    wall = time.monotonic() - t0
    c1, n1 = group.usage_s(), container_cpu_s(ids)
    if r.returncode != 0:
        sys.exit(f"{kind} beat of {len(hosts)} nodes failed ({r.returncode}): "
                 f"{lock_keeper.first_problem(r.returncode, r.stdout)}\n{r.stdout[-2000:]}")
    if lock_mtime(cluster, hosts[0]) <= before_mtime:
        sys.exit(f"{kind} beat exited 0 but did not touch {hosts[0]}'s lock")
    return {"wall_s": wall, "controller_cpu_s": None if c0 is None else c1 - c0, "node_cpu_s": n1 - n0}


def slope(points: list[tuple[int, float]]) -> float:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", help="use this running simulated cluster instead of bringing one up")
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--sizes", default="8,16,32")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path, help="write the raw figures here")
    args = p.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    own = args.name is None
    name = args.name or "bench-beat"
    if own:
        subprocess.run([*SIM, "up", "--name", name, "--nodes", str(max(args.nodes, *sizes)), "--kind", "light"],
                       check=True, cwd=REPO)
    cluster = SimCluster(name)
    group = CpuGroup(f"trainyard-bench-beat-{name}")
    try:
        if len(cluster.nodes) < sizes[-1]:
            sys.exit(f"cluster {name} has {len(cluster.nodes)} nodes, --sizes asks for {sizes[-1]}")
        ids = [subprocess.run(["docker", "inspect", "-f", "{{.Id}}", n], capture_output=True, text=True,
                              check=True).stdout.strip() for n in cluster.nodes]
        take = lock_keeper.adhoc_argv({"inventory": (str(cluster.inventory),)}, cluster.nodes[:sizes[-1]],
                                      {"path": LOCK_DIR, "state": "present",
                                       "record": {"token": TOKEN, "version": 1, "host": "bench"}}, str(BIN / "python"))
        r = subprocess.run(take, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if r.returncode != 0:
            sys.exit(f"could not take the bench's lock: {r.stdout[-2000:]}")
        runs: dict[str, dict[int, list[dict]]] = {"module": {}, "raw": {}}
        for n in sizes:
            for i in range(args.repeats):
                for kind in ("module", "raw") if i % 2 == 0 else ("raw", "module"):
                    runs[kind].setdefault(n, []).append(one_beat(kind, cluster, cluster.nodes[:n], ids, group))
            log(f"{n} nodes: {args.repeats} beats of each kind")
        release = lock_keeper.adhoc_argv({"inventory": (str(cluster.inventory),)}, cluster.nodes[:sizes[-1]],
                                         {"path": LOCK_DIR, "state": "absent", "token": TOKEN}, str(BIN / "python"))
        subprocess.run(release, cwd=REPO, env=ansible_env(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    finally:
        group.close()
        if own:
            subprocess.run([*SIM, "down", "--name", name], check=False, cwd=REPO)

    def med(kind: str, n: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind][n])

    print(f"\nOne heartbeat over N nodes, median of {args.repeats} (2-core machine, simulated light nodes; "
          f"controller = the ad-hoc process, its workers and SSH clients; nodes = their containers)\n")
    print("| beat | nodes | wall s | controller CPU s | nodes' CPU s |")
    print("|---|---:|---:|---:|---:|")
    for kind in ("module", "raw"):
        for n in sizes:
            print(f"| {kind} | {n} | {med(kind, n, 'wall_s'):.2f} | {med(kind, n, 'controller_cpu_s'):.2f} | "
                  f"{med(kind, n, 'node_cpu_s'):.2f} |")
    print("\nPer added node (least squares over the sizes' medians) and at none (the ad-hoc run's start):\n")
    print("| beat | controller ms / node | controller s at 0 nodes | nodes' CPU ms / node | wall ms / node |")
    print("|---|---:|---:|---:|---:|")
    fits = {}
    for kind in ("module", "raw"):
        pts = {key: [(n, med(kind, n, key)) for n in sizes] for key in ("controller_cpu_s", "node_cpu_s", "wall_s")}
        c = slope(pts["controller_cpu_s"])
        c0 = statistics.fmean(y for _, y in pts["controller_cpu_s"]) - c * statistics.fmean(sizes)
        fits[kind] = {"controller_s_per_node": c, "controller_s_at_0": c0,
                      "node_s_per_node": slope(pts["node_cpu_s"]), "wall_s_per_node": slope(pts["wall_s"])}
        print(f"| {kind} | {1000 * c:.1f} | {c0:.2f} | {1000 * fits[kind]['node_s_per_node']:.1f} | "
              f"{1000 * fits[kind]['wall_s_per_node']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"sizes": sizes, "repeats": args.repeats, "runs": runs, "fits": fits},
                                        indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
