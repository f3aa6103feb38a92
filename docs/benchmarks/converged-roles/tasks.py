#!/usr/bin/env python3
"""Which tasks ran on a node, per role, from one run's ansible-playbook output (the default callback's per-host
lines): `tasks.py <log> <head> <worker>` prints each task with what it did on the head and on a worker (o ok, c
changed, s skipped, i included; blank: not run there: a run_once task on the other host, or meta: end_role), then
per role the tasks run (ok + changed) and skipped on each. PLAY RECAP counts an include as ok too."""

from __future__ import annotations

import collections
import re
import sys

TASK = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(.*?)\] \*+")
STATUS = re.compile(r"^(ok|changed|skipping|fatal|failed): \[([^\]]+?)(?: -> [^\]]*)?\]")
INCLUDED = re.compile(r"^included: \S+ for (.*)$")


def main(log: str, head: str, worker: str) -> None:
    rows: list[tuple[str, dict]] = []
    for line in open(log, encoding="utf-8"):
        line = line.rstrip("\n")
        m = TASK.match(line)
        if m:
            rows.append((m.group(1), {}))
            continue
        if not rows:
            continue
        m = STATUS.match(line)
        if m:
            rows[-1][1].setdefault(m.group(2), set()).add(m.group(1)[0])
            continue
        m = INCLUDED.match(line)
        if m:
            for h in m.group(1).split(", "):
                rows[-1][1].setdefault(h.strip(), set()).add("i")
    per_role: dict = collections.defaultdict(lambda: collections.Counter())
    for name, st in rows:
        a, b = "".join(sorted(st.get(head, ""))), "".join(sorted(st.get(worker, "")))
        if not (a or b):
            continue
        role = name.split(" : ", 1)[0] if " : " in name else "(play level)"
        print(f"{a:3} {b:3} | {name[:130]}")
        for who, s in (("head", a), ("worker", b)):
            per_role[role][who + " run"] += bool(set(s) & set("oci"))
            per_role[role][who + " skipped"] += "s" in s
    print("\nrole | head run | head skipped | worker run | worker skipped")
    tot = collections.Counter()
    for role, c in per_role.items():
        print(f"{role} | {c['head run']} | {c['head skipped']} | {c['worker run']} | {c['worker skipped']}")
        tot.update(c)
    print(f"total | {tot['head run']} | {tot['head skipped']} | {tot['worker run']} | {tot['worker skipped']}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
