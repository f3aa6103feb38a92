# -*- coding: utf-8 -*-
"""The one "did you mean": the known name a mistyped one was meant to be, or None (controller only, stdlib only).

Every typo hint of the product asks ``nearest``: NCCL/environment variable names (nccl_vars), inventory variables,
keys, choices and groups (cluster_model), DeepSpeed keys (ds_config, deepspeed_validate) and LLaMA-Factory
arguments (llamafactory_validate, also in its child interpreter, which finds this package on PYTHONPATH). The rule:
case-insensitive edit distance with adjacent transpositions, within ``max_distance`` of the longer of the two names,
so a hint is a plausible slip and never an unrelated name.
"""

from __future__ import annotations

from typing import Iterable


def distance(a: str, b: str) -> int:
    """Edit distance with adjacent transpositions (optimal string alignment)."""
    if a == b:
        return 0
    prev2: list = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[len(b)]


def max_distance(name: str) -> int:
    """How many edits a name may be from a known one to count as its typo: 1 up to 15 characters, 2 up to 23,
    3 beyond (a longer name has more room for a slip, never enough to reach an unrelated name)."""
    return 1 if len(name) < 16 else 2 if len(name) < 24 else 3


def nearest(name: str, known: Iterable[str], limit: int | None = None) -> str | None:
    """The known name closest to ``name`` (case-insensitive; ties: the first in sorted order) within ``limit``
    edits, by default max_distance of the longer of the two; None when no known name is that close."""
    name = str(name)
    upper = name.upper()
    best, best_d = None, None
    for k in sorted(set(str(k) for k in known)):
        room = max_distance(max(name, k, key=len)) if limit is None else limit
        if abs(len(k) - len(name)) > room:
            continue
        d = distance(upper, k.upper())
        if d <= room and (best_d is None or d < best_d):
            best, best_d = k, d
    return best
