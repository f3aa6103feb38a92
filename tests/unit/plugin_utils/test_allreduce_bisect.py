"""The bisection that names the slow node or link (plugin_utils/allreduce_bisect.py), on synthetic measurements: a
group all-reduces at its slowest node's or link's rate (a ring crosses every node; the model takes every pair)."""

from __future__ import annotations

import itertools
import math

import pytest

from ansible_collections.trainyard.core.plugins.plugin_utils import allreduce_bisect as ab

FAST, SLOW = 10.0, 1.0


def cluster(n, slow_nodes=(), slow_links=(), dead_nodes=()):
    nodes = [f"node{i}" for i in range(1, n + 1)]
    calls = []

    def measure(group):
        calls.append(list(group))
        assert len(group) >= 2
        if any(h in dead_nodes for h in group):
            return None
        rate = FAST
        if any(h in slow_nodes for h in group):
            rate = SLOW
        if any({a, b} == set(link) for a, b in itertools.combinations(group, 2) for link in slow_links):
            rate = SLOW
        return rate

    return nodes, measure, calls


def slow(v):
    return v < 5


def named(out):
    return sorted((f["kind"], tuple(f["nodes"])) for f in out["findings"])


def bound(n):
    """Node slots measured at most: n log2 n (the O(n log n) pairs of the issue), plus the pairs that attribute."""
    return n * max(1, math.ceil(math.log2(n))) + 6


@pytest.mark.parametrize("n", [3, 5, 8])
def test_one_slow_node_is_named_whichever_it_is(n):
    for i in range(1, n + 1):
        nodes, measure, calls = cluster(n, slow_nodes={f"node{i}"})
        out = ab.run(nodes, measure, slow)
        assert named(out) == [("node", (f"node{i}",))], (i, out["findings"])
        assert sum(map(len, calls)) <= bound(n), calls
        assert "is slow: 1 GB/s with node" in out["findings"][0]["text"]


@pytest.mark.parametrize("n", [3, 5, 8])
def test_one_slow_link_is_named(n):
    for a, b in itertools.combinations(range(1, n + 1), 2):
        link = (f"node{a}", f"node{b}")
        nodes, measure, calls = cluster(n, slow_links=[link])
        out = ab.run(nodes, measure, slow)
        assert named(out) == [("link", link)], (link, out["findings"])
        assert sum(map(len, calls)) <= bound(n), (link, calls)


def test_two_nodes_name_the_pair_they_cannot_tell_apart():
    nodes, measure, calls = cluster(2, slow_nodes={"node2"})
    out = ab.run(nodes, measure, slow)
    assert named(out) == [("pair", ("node1", "node2"))]
    assert "no other node measured fine" in out["findings"][0]["text"]
    assert calls == [["node1", "node2"]]


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_all_slow_names_no_single_culprit_and_stays_in_bound(n):
    nodes, measure, calls = cluster(n, slow_nodes=set(f"node{i}" for i in range(1, n + 1)))
    out = ab.run(nodes, measure, slow)
    assert out["findings"] and all(f["kind"] == "pair" for f in out["findings"]), out["findings"]
    assert sum(map(len, calls)) <= bound(n), calls


def test_a_node_that_breaks_the_all_reduce_is_named():
    nodes, measure, _ = cluster(5, dead_nodes={"node4"})
    out = ab.run(nodes, measure, slow)
    assert named(out) == [("node", ("node4",))]
    assert "node4 is slow: did not complete with" in out["findings"][0]["text"]


def test_two_slow_nodes_in_different_halves_are_both_named():
    nodes, measure, _ = cluster(8, slow_nodes={"node2", "node7"})
    assert named(ab.run(nodes, measure, slow)) == [("node", ("node2",)), ("node", ("node7",))]


def test_rounds_are_node_disjoint_and_bounded():
    nodes, measure, _ = cluster(8, slow_nodes={"node3"})
    history = {}
    for rounds in range(ab.max_rounds(8)):
        out = ab.step(nodes, history, slow)
        if out["done"]:
            break
        used = [h for g in out["groups"] for h in g]
        assert len(used) == len(set(used)), out["groups"]
        history.update({ab.key(g): measure(g) for g in out["groups"]})
    assert out["done"] and rounds < ab.max_rounds(8)


def test_a_cluster_that_is_fine_between_pairs_says_so():
    # The whole cluster was slow (e.g. load) but every half and every pair is fine.
    nodes, measure, _ = cluster(3)
    out = ab.run(nodes, measure, slow)
    assert out["findings"] == [] or all(f["kind"] == "none" for f in out["findings"])


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 16])
def test_every_single_and_double_fault_ends_within_the_rounds_the_role_allows(n):
    cases = ([{"slow_nodes": {f"node{i}"}} for i in range(1, n + 1)]
             + [{"slow_links": [(f"node{a}", f"node{b}")]} for a, b in itertools.combinations(range(1, n + 1), 2)]
             + [{"slow_nodes": {f"node{a}", f"node{b}"}} for a, b in itertools.combinations(range(1, n + 1), 2)]
             + [{"slow_nodes": {f"node{i}" for i in range(1, n + 1)}}])
    for case in cases:
        nodes, measure, calls = cluster(n, **case)
        out = ab.run(nodes, measure, slow)
        assert out["rounds"] <= ab.max_rounds(n), (case, out["rounds"])
        assert sum(map(len, calls)) <= bound(n) * 2, (case, calls)
