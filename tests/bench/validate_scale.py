#!/usr/bin/env python3
"""What the validate play costs at cluster sizes no simulated cluster here reaches (prints figures; asserts nothing).

Every process of a run (one ansible-playbook, or a sharded run's parent and each child: docs/sharding.md) starts
with playbooks/validate.yml: cluster_validate, the run id and cluster_models on localhost, and each node's
cluster_model. The play contacts no host, so it runs on a generated inventory of --sizes nodes (addresses in
172.30-31.x, never reached). Per size, one run of each variant, in turn, --repeats rounds:

  one      one process (the play as reset.yml, status.yml and an unsplit site.yml run it)
  parent   the parent of a sharded site.yml (-e _cluster_may_split=true, cluster_shard_nodes = n / --shards)
  child    one child of --shards (TRAINYARD_SHARD=1/K with the plan the parent writes)

Each: wall time, CPU of ansible-playbook and every process it started (resource usage of the waited children),
and each task's seconds (profile_tasks), medians. --tree runs another checkout's playbooks (an export of an earlier
commit: git archive <commit> | tar -x -C <dir>) beside this one, alternating run by run.

    .venv/bin/python tests/bench/validate_scale.py --sizes 256,1024 --shards 16 --repeats 2 \
        [--tree /tmp/old --tree-label 4278938] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
PROFILE = re.compile(r"^(?:\S+ : )?(.+?) -+ (\d+\.\d+)s$")


def inventory(root: Path, n: int) -> Path:
    inv = root / f"inv{n}"
    (inv / "group_vars").mkdir(parents=True, exist_ok=True)
    lines = ["all:", "  children:", "    trainers:", "      hosts:"]
    for i in range(n):
        lines += [f"        f{i + 1}:", f"          ansible_host: 172.30.{i // 250}.{i % 250 + 1}",
                  f"          data_address: 172.31.{i // 250}.{i % 250 + 1}"]
    lines += ["  vars:", "    ansible_user: root", "    ansible_python_interpreter: /usr/bin/python3"]
    (inv / "hosts.yml").write_text("\n".join(lines) + "\n")
    return inv


def run(tree: Path, inv: Path, variant: str, n: int, shards: int, tmp: Path) -> dict:
    per = -(-n // shards)
    env = dict(os.environ, ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks",
               PROFILE_TASKS_TASK_OUTPUT_LIMIT="all", PROFILE_TASKS_SORT_ORDER="none", ANSIBLE_CONFIG=str(tree / "ansible.cfg"))
    for k in ("TRAINYARD_SHARD", "TRAINYARD_SHARD_DIR"):
        env.pop(k, None)
    args = [str(BIN / "ansible-playbook"), "-i", str(inv), str(tree / "playbooks" / "validate.yml")]
    if variant == "parent":
        args += ["-e", "_cluster_may_split=true", "-e", f"cluster_shard_nodes={per}", "-e", f"cluster_shard_max={shards}"]
    elif variant == "child":
        root = tmp / f"shards-{n}"
        nodes = [f"f{i + 1}" for i in range(n)]
        (root).mkdir(exist_ok=True)
        (root / "shards.json").write_text(json.dumps({"shards": [nodes[i:i + per] for i in range(0, n, per)]}))
        env.update(TRAINYARD_SHARD=f"1/{shards}", TRAINYARD_SHARD_DIR=str(root))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tasks = {}
    for line in r.stdout.split("TASKS RECAP")[-1].splitlines():
        m = PROFILE.match(line.strip())
        if m:
            tasks[m.group(1)] = float(m.group(2))
    if r.returncode != 0:
        print(r.stdout[-3000:], file=sys.stderr)
    return {"rc": r.returncode, "wall_s": round(wall, 2),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2), "tasks": tasks}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="256,1024")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--tree", default="", help="another checkout run beside this one")
    p.add_argument("--tree-label", default="other tree")
    p.add_argument("--json", default="")
    a = p.parse_args()
    trees = [("this tree", REPO)] + ([(a.tree_label, Path(a.tree))] if a.tree else [])
    out = {"command": " ".join(["tests/bench/validate_scale.py"] + sys.argv[1:]), "cores": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                    text=True).stdout.strip(), "runs": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for n in [int(x) for x in a.sizes.split(",") if x]:
            inv = inventory(tmp, n)
            for rnd in range(a.repeats):
                for label, tree in trees:
                    for variant in ("one", "parent", "child"):
                        row = dict(run(tree, inv, variant, n, a.shards, tmp), nodes=n, tree=label, variant=variant,
                                   round=rnd + 1)
                        out["runs"].append(row)
                        print(f"{n:>5} {label:>12} {variant:>6} round {rnd + 1}: rc {row['rc']}, wall {row['wall_s']} s, "
                              f"CPU {row['cpu_s']} s", flush=True)
    print("\n| nodes | tree | variant | wall s | CPU s | the three costliest tasks, s |\n|---|---|---|---|---|---|")
    keys = sorted({(r["nodes"], r["tree"], r["variant"]) for r in out["runs"]},
                  key=lambda k: (k[0], [t[0] for t in trees].index(k[1]), ["one", "parent", "child"].index(k[2])))
    for k in keys:
        rows = [r for r in out["runs"] if (r["nodes"], r["tree"], r["variant"]) == k]
        tasks: dict = {}
        for r in rows:
            for t, s in r["tasks"].items():
                tasks.setdefault(t, []).append(s)
        top = sorted(((statistics.median(v), t) for t, v in tasks.items()), reverse=True)[:3]
        print(f"| {k[0]} | {k[1]} | {k[2]} | {statistics.median(r['wall_s'] for r in rows):.2f} | "
              f"{statistics.median(r['cpu_s'] for r in rows):.2f} | "
              + "; ".join(f"{t[:60]} {s:.2f}" for s, t in top) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
