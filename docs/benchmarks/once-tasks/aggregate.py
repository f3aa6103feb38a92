#!/usr/bin/env python3
"""Per task: the workers' CPU and templating (sums over hosts), the hosts it ran on; the tasks on one host (n=1) summed
as the once-per-run part. Input: the lines worker-cpu.patch writes (one per worker)."""
import collections
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
by = collections.defaultdict(lambda: {"cpu": 0.0, "pv": 0.0, "hosts": 0, "skipped": 0})
for r in rows:
    b = by[r["task"]]
    b["cpu"] += r["cpu"] + r["child"]
    b["pv"] += r.get("pv", 0.0)
    b["hosts"] += 1
    b["skipped"] += r["skipped"]
total = sum(b["cpu"] for b in by.values())
once = {k: b for k, b in by.items() if b["hosts"] == 1}
print(f"workers: {len(rows)}, CPU {total:.2f} s, templating {sum(b['pv'] for b in by.values()):.2f} s; "
      f"tasks on one host: {len(once)}, CPU {sum(b['cpu'] for b in once.values()):.2f} s")
print(f"{'CPU s':>7} {'tmpl s':>7} {'hosts':>5} {'skip':>4}  task")
for k, b in sorted(by.items(), key=lambda kv: -kv[1]["cpu"]):
    print(f"{b['cpu']:7.3f} {b['pv']:7.3f} {b['hosts']:5d} {b['skipped']:4d}  {k[:110]}")
