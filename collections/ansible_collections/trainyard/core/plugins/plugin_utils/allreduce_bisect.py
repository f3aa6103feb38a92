# -*- coding: utf-8 -*-
"""The slow node or link of a cluster whose all-reduce is below expectation, found by bisection (docs/bandwidth.md).

Stateless: ``step(nodes, history, slow)`` replays the search over every measurement taken so far (``history``:
{"a,b": busbw or None}, a group's all-reduce; None: it did not complete) and answers the next round's groups (node
disjoint, run at once) or, when nothing is left to measure, the findings. roles/nccl_check/tasks/bisect.yml calls it
once per round.

The search, on a set S known slow (at first: every node):
* |S| = 2: the pair is measured alone; when slow, each end is measured with a node known fine (a reference): one end
  slow -> that node; both -> both nodes; neither -> the link between them; no reference (two nodes in all) -> the pair.
* |S| >= 3: halves A (the smaller) and B are measured (A only with two nodes or more); a slow half is searched again;
  both fine -> the fault lies between them: the larger side is halved and one half measured with the other side until
  one node faces one node (a pair, as above).
One fault costs about 2 log2 n + log2 n + 3 groups; a fault everywhere about 2n (every group of n log2 n node slots
at most: the O(n log n) bound).

Unit-tested with synthetic measurements in tests/unit/test_allreduce_bisect.py.
"""

from __future__ import annotations


def key(group) -> str:
    return ",".join(group)


class _Need(Exception):
    """The search cannot go on before these groups are measured."""

    def __init__(self, groups):
        super().__init__()
        self.groups = groups


class _Search:
    def __init__(self, nodes, history, slow):
        self.nodes = list(nodes)
        self.history = dict(history or {})
        self.slow = slow
        self.pending: list[list[str]] = []
        self.findings: list[dict] = []

    def order(self, group):
        pos = {h: i for i, h in enumerate(self.nodes)}
        return sorted(group, key=lambda h: pos.get(h, len(pos)))

    def value(self, group):
        """(known, slow, busbw) of a group's measurement."""
        k = key(self.order(group))
        if k not in self.history:
            return False, None, None
        v = self.history[k]
        return True, v is None or self.slow(v), v

    def need(self, *groups):
        """Every group's slowness, or _Need for those not measured yet."""
        missing = [self.order(g) for g in groups if not self.value(g)[0]]
        if missing:
            raise _Need(missing)
        return [self.value(g)[1] for g in groups]

    def good(self):
        """Nodes that took part in a measurement that was fine, in node order."""
        fine = set()
        for k, v in self.history.items():
            if v is not None and not self.slow(v):
                fine.update(k.split(","))
        return [h for h in self.nodes if h in fine]

    # -------------------------------------------------------------------------------- the search
    def run(self, group):
        """Search ``group`` (known slow); pending measurements gathered, findings appended."""
        try:
            self._search(self.order(group))
        except _Need as n:
            self.pending.extend(n.groups)

    def _search(self, s):
        if len(s) < 2:
            return
        if len(s) == 2:
            self._pair(s[0], s[1])
            return
        a, b = s[:len(s) // 2], s[len(s) // 2:]
        groups = [g for g in (a, b) if len(g) >= 2]
        slow = dict(zip(map(key, groups), self.need(*groups)))
        slow_a, slow_b = slow.get(key(a), False), slow[key(b)]
        if slow_a:
            self.run(a)
        if slow_b:
            self.run(b)
        if not slow_a and not slow_b:
            self.run_cross(a, b)

    def run_cross(self, a, b):
        try:
            self._cross(a, b)
        except _Need as n:
            self.pending.extend(n.groups)

    def _cross(self, a, b):
        """a and b each fine (or one node), a + b slow: the fault lies on a link between them."""
        while len(a) > 1 or len(b) > 1:
            big, other = (a, b) if len(a) >= len(b) else (b, a)
            first, second = big[:len(big) // 2], big[len(big) // 2:]
            (slow,) = self.need(first + other)
            big = first if slow else second
            a, b = (big, other) if len(a) >= len(b) else (other, big)
        self._pair(a[0], b[0])

    def _pair(self, x, y):
        (slow,) = self.need([x, y])
        pair_v = self.value([x, y])[2]
        if not slow:
            self.findings.append({"kind": "none", "nodes": [x, y], "busbw_gbps": {key([x, y]): pair_v},
                                  "text": f"{x} and {y} all-reduce at {_fmt(pair_v)} alone: the slowness did not "
                                          "show between two nodes (load, or a fault of the whole group)"})
            return
        refs = [h for h in self.good() if h not in (x, y)]
        # No node known fine yet (three nodes: the lone half is never measured alone): a third node serves, and
        # counts as fine when one of its two pairs is.
        unproven = not refs
        refs = refs or [h for h in self.nodes if h not in (x, y)]
        if not refs:
            self.findings.append({"kind": "pair", "nodes": [x, y], "busbw_gbps": {key([x, y]): pair_v},
                                  "text": f"the pair {x}-{y} is slow ({_fmt(pair_v)}); no other node measured fine "
                                          "to tell which end"})
            return
        # A reference already measured with an end keeps the replay stable as references are learnt.
        # Pairs spread over the references (by the end's place in the cluster) so that rounds run side by side.
        at = self.nodes.index(x) if x in self.nodes else 0
        rx = next((r for r in refs if self.value([x, r])[0]), refs[at % len(refs)])
        ry = next((r for r in refs if self.value([y, r])[0]), refs[(at + 1) % len(refs)])
        missing = [g for g in ([x, rx], [y, ry]) if not self.value(g)[0]]
        if missing:
            raise _Need([self.order(g) for g in missing])
        sx, sy = self.value([x, rx])[1], self.value([y, ry])[1]
        numbers = {key(self.order(g)): self.value(g)[2] for g in ([x, y], [x, rx], [y, ry])}
        if sx and not sy:
            self.findings.append(_node(x, rx, numbers, self.order))
        elif sy and not sx:
            self.findings.append(_node(y, ry, numbers, self.order))
        elif sx and sy and unproven:
            self.findings.append({"kind": "pair", "nodes": [x, y], "busbw_gbps": numbers,
                                  "text": f"the pair {x}-{y} is slow ({_fmt(pair_v)}), and each end with {rx} too: "
                                          "no node measured fine to tell which"})
        elif sx and sy:
            self.findings.append(_node(x, rx, numbers, self.order))
            self.findings.append(_node(y, ry, numbers, self.order))
        else:
            self.findings.append({"kind": "link", "nodes": [x, y], "busbw_gbps": numbers,
                                  "text": f"the link {x}-{y} is slow ({_fmt(numbers[key(self.order([x, y]))])}); "
                                          f"{x} with {rx}: {_fmt(numbers[key(self.order([x, rx]))])}, {y} with "
                                          f"{ry}: {_fmt(numbers[key(self.order([y, ry]))])}"})


def _fmt(v) -> str:
    return "did not complete" if v is None else f"{v:g} GB/s"


def _node(x, ref, numbers, order) -> dict:
    with_ref = numbers[key(order([x, ref]))]
    return {"kind": "node", "nodes": [x], "busbw_gbps": numbers,
            "text": f"{x} is slow: {_fmt(with_ref)} with {ref}, a node measured fine"}


def step(nodes, history, slow) -> dict:
    """The next round: {done, groups: [[host, ...]] (node disjoint), findings: [{kind: node|link|pair|none, nodes,
    busbw_gbps: {"a,b": value}, text}], measured (groups measured so far)}. ``slow(busbw)`` is the test."""
    nodes = list(nodes)
    s = _Search(nodes, history, slow)
    if len(nodes) >= 2:
        s.run(nodes)
    groups, busy = [], set()
    for g in s.pending:
        if key(g) in {key(x) for x in groups} or busy & set(g):
            continue
        groups.append(g)
        busy.update(g)
    # Keep every finding's order stable and drop repeats (a node found from two sides).
    seen, findings = set(), []
    for f in s.findings:
        k = (f["kind"], key(f["nodes"]))
        if k not in seen:
            seen.add(k)
            findings.append(f)
    return {"done": not groups, "groups": groups, "findings": findings if not groups else [],
            "measured": len(s.history)}


def run(nodes, measure, slow, max_rounds: int = 64) -> dict:
    """The whole search with ``measure(group) -> busbw or None`` (tests, and a reference for the role's loop):
    {findings, history, rounds}."""
    history: dict = {}
    for rounds in range(max_rounds + 1):
        out = step(nodes, history, slow)
        if out["done"]:
            return {"findings": out["findings"], "history": history, "rounds": rounds}
        for g in out["groups"]:
            history[key(g)] = measure(g)
    raise RuntimeError(f"bisection did not finish in {max_rounds} rounds")


def max_rounds(n: int) -> int:
    """Rounds the role's loop allows for n nodes (each round measures at least one group)."""
    import math

    if n < 2:
        return 0
    # Measured over every one-node, one-link, two-node and all-node fault up to 16 nodes
    # (tests/unit/test_allreduce_bisect.py): 9 rounds at most, against 16 here.
    return 3 * math.ceil(math.log2(n)) + 4


# ------------------------------------------------------------------------------------------------ the role's loop
def start(nodes, threshold_gbps, reason: str = "") -> dict:
    """The bisection's state before its first round (roles/nccl_check/tasks/bisect.yml): {nodes, threshold_gbps,
    history, rounds, done, groups, findings, reason}. ``reason`` non-empty: no bisection (why), done at once."""
    nodes = list(nodes or [])
    state = {"nodes": nodes, "threshold_gbps": float(threshold_gbps or 0), "history": {}, "rounds": 0,
             "done": True, "groups": [], "findings": [], "reason": reason}
    if not reason and len(nodes) < 2:
        state["reason"] = "one node: no link to locate"
    if not state["reason"] and state["threshold_gbps"] <= 0:
        state["reason"] = "no expectation and no floor: nothing tells slow from fine"
    return state if state["reason"] else advance(state, {})


def advance(state: dict, measured: dict) -> dict:
    """The state after a round: ``measured`` {"a,b": busbw or None} of the round's groups."""
    history = dict(state.get("history") or {}, **(measured or {}))
    limit = float(state["threshold_gbps"])
    out = step(state["nodes"], history, lambda v: float(v) < limit)
    return dict(state, history=history, rounds=int(state.get("rounds", 0)) + (1 if measured else 0),
                done=out["done"], groups=out["groups"], findings=out["findings"])


def group_of(groups, host) -> dict:
    """This host's place in the round: {index (the group's, for its port), members, rank}; {} when it sits out."""
    for i, g in enumerate(groups or []):
        if host in g:
            return {"index": i, "members": list(g), "rank": list(g).index(host)}
    return {}
