#!/usr/bin/env python3
"""Share of a py-spy raw profile's samples (``py-spy record -f raw``) under each named frame, inclusive.

    .venv/bin/python docs/benchmarks/converged-roles/profiles/shares.py docs/benchmarks/converged-roles/profiles/*.raw
"""

from __future__ import annotations

import re
import sys
from collections import Counter

FRAMES = ["get_vars manager.py", "clean_facts clean.py", "namespace_facts clean.py", "all loader.py",
          "as_callback_task_result task_result.py", "start worker.py", "send_callback task_queue_manager.py",
          "_process_pending_results __init__.py", "all_plugins_inventory manager.py"]


def shares(path):
    inc, total = Counter(), 0
    for line in open(path):
        stack, _, n = line.rstrip().rpartition(" ")
        n = int(n)
        total += n
        names = set()
        for frame in stack.split(";"):
            m = re.match(r"(.*) \((.*):\d+\)", frame)
            names.add(m.group(1) + " " + m.group(2).split("/")[-1] if m else frame)
        for name in names:
            inc[name] += n
    return total, inc


for path in sys.argv[1:]:
    total, inc = shares(path)
    print(f"{path}: {total} samples")
    for name in FRAMES:
        print(f"  {100 * inc[name] / total:5.1f} %  {name}")
