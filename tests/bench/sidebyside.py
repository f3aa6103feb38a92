"""The user path of two trees side by side on the same clusters, run by run (issue 35's per-node goal, measured
under this machine's drift).

    git worktree add /tmp/base <commit>; ln -s $PWD/.venv /tmp/base/.venv; ln -s $PWD/.cache /tmp/base/.cache
    .venv/bin/python tests/bench/sidebyside.py --base /tmp/base [--sizes 2,4,8] [--rounds 2] [--out FILE]

The user-path bench (tests/bench/userpath.py) measures one tree; on this 2-core VM the same tree moves by up to 23 %
between hours, more than a round of changes moves it. Here both trees run on one cluster per size, alternating: a
first site.yml from this tree (the long job starts, as userpath.py's), then per round base, this, this, base (ABBA:
a trend in the machine's load falls on both alike). Each run is a converged site.yml from its own tree (its roles,
plugins and ansible.cfg; the cluster's inventory is this tree's), measured as scale.measured_run measures it
(controller CPU from the run's own cgroup). Per size the medians of each tree and the median of the paired
differences; per tree the least-squares fit over the sizes (CPU-s per added node, per run).
Raw: --out, by default docs/benchmarks/userpath-sidebyside-<base commit>-<this commit>.json. Figures are never
asserted: this is measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "tests")]

import scale  # noqa: E402
from userpath import KINDS  # noqa: E402

REPO = HERE.parents[1]
KEYS = ("controller_cpu_s", "controller_main_cpu_s", "wall_s", "others_cpu_s")


def commit_of(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                          text=True).stdout.strip()


def run_from(tree: Path, inv: Path, nodes: list[str], group, label: str, args: list[str]) -> dict:
    """One measured site.yml run from ``tree`` (scale.measured_run runs from scale.REPO)."""
    saved = scale.REPO
    scale.REPO = tree
    try:
        run = scale.measured_run(Path(sys.executable).parent, inv, nodes, group, label=label, args=args,
                                 env_extra={"ANSIBLE_CONFIG": str(tree / "ansible.cfg")})
    finally:
        scale.REPO = saved
    return {k: run.get(k) for k in ("label", "rc", "changed", "tasks_by_host", "head", *KEYS)}


def summary(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["rc"] == 0 and r["changed"] == 0]
    out = {"runs": len(runs), "clean": len(ok)}
    for k in KEYS:
        vals = [r[k] for r in ok if r.get(k) is not None]
        if vals:
            out[k] = round(statistics.median(vals), 2)
            out[k + "_range"] = [min(vals), max(vals)]
    return out


def bench(base: Path, sizes: list[int], rounds: int, raw: Path | None) -> dict:
    from helpers import SIM
    trees = {"base": base.resolve(), "this": REPO}
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": rounds, "order": "ABBA",
               "commits": {k: commit_of(t) for k, t in trees.items()}, "sizes": []}
    c = results["commits"]
    raw = raw or REPO / f"docs/benchmarks/userpath-sidebyside-{c['base']}-{c['this']}.json"
    kind, args = KINDS["user"]
    group = scale.CpuGroup(f"trainyard-sidebyside-{time.monotonic_ns()}")
    try:
        for n in sorted(sizes):
            name = f"sbs{n}"
            subprocess.run([*SIM, "up", "--name", name, "--nodes", str(n), "--kind", kind], cwd=REPO, check=True)
            try:
                meta = json.loads((REPO / ".sim" / name / "cluster.json").read_text())
                inv, nodes = Path(meta["inventory"]), meta["nodes"]
                first = run_from(REPO, inv, nodes, group, "this first", args)
                runs: dict[str, list[dict]] = {"base": [], "this": []}
                for i in range(rounds):
                    for which in ("base", "this", "this", "base"):
                        runs[which].append(run_from(trees[which], inv, nodes, group, f"{which} round {i + 1}", args))
                pairs = [t["controller_cpu_s"] - b["controller_cpu_s"] for b, t in zip(runs["base"], runs["this"])]
                results["sizes"].append({
                    "nodes": n, "first": first, "runs": runs,
                    "base": summary(runs["base"]), "this": summary(runs["this"]),
                    "paired_diff_cpu_s": {"median": round(statistics.median(pairs), 2),
                                          "all": [round(p, 2) for p in pairs]}})
            finally:
                subprocess.run([*SIM, "down", "--name", name], cwd=REPO, check=False)
            raw.write_text(json.dumps(results, indent=1) + "\n")  # a run cut short keeps what it measured
    finally:
        group.close()
    for which in ("base", "this"):
        ns = [e["nodes"] for e in results["sizes"]]
        ys = [e[which]["controller_cpu_s"] for e in results["sizes"]]
        if len(ns) >= 2:
            a, b = scale.fit_line(ns, ys)
            results[f"fit_{which}"] = {"per_added_node": round(b, 3), "per_run": round(a, 2), "fitted_on": ns}
    raw.write_text(json.dumps(results, indent=1) + "\n")
    return results


def table(results: dict) -> str:
    c = results["commits"]
    lines = [f"| nodes | {c['base']} controller CPU s (median, min-max) | {c['this']} controller CPU s | "
             f"paired difference, median (each pair) | clean runs |", "|---|---|---|---|---|"]
    for e in results["sizes"]:
        b, t = e["base"], e["this"]
        lines.append(f"| {e['nodes']} | {b['controller_cpu_s']} ({b['controller_cpu_s_range'][0]}-"
                     f"{b['controller_cpu_s_range'][1]}) | {t['controller_cpu_s']} ({t['controller_cpu_s_range'][0]}-"
                     f"{t['controller_cpu_s_range'][1]}) | {e['paired_diff_cpu_s']['median']:+.2f} "
                     f"({', '.join(f'{p:+.2f}' for p in e['paired_diff_cpu_s']['all'])}) | "
                     f"{b['clean']}/{b['runs']}, {t['clean']}/{t['runs']} |")
    for which in ("base", "this"):
        f = results.get(f"fit_{which}")
        if f:
            lines.append(f"\n{c[which]}: **{f['per_added_node']} CPU-s per added node**, {f['per_run']} per run "
                         f"(least squares over the medians at {f['fitted_on']} nodes)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="a checkout of the commit compared against")
    ap.add_argument("--sizes", default="2,4,8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path,
                    help="the raw file (default docs/benchmarks/userpath-sidebyside-<base>-<this>.json)")
    ap.add_argument("--from-raw", type=Path, help="print the table of this raw file without measuring")
    a = ap.parse_args()
    if a.from_raw:
        print(table(json.loads(a.from_raw.read_text())))
        return 0
    if a.base is None or not (a.base / "site.yml").is_file():
        print(f"--base {a.base}: no site.yml there (a checkout of the commit to compare against)", file=sys.stderr)
        return 2
    print(table(bench(a.base, [int(s) for s in a.sizes.split(",")], a.rounds, a.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
