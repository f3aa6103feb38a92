"""The sharded benchmark's arithmetic (tests/bench/shards.py): the user path estimated from the light harness's
sharded fits plus the roles' cost per node, each cost where the projection puts it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests/bench"))
import shards  # noqa: E402  (tests/bench/shards.py)


def _light():
    """Light runs that fit exactly: one process main 1 + 0.2n, workers 0.5n; sharded parent 1 + 0.03n, busiest
    child 1 + 0.1s + 0.02n, every worker 0.6n (the children's main processes K times the busiest)."""
    sizes = []
    for n in (16, 32, 64):
        runs = [{"k": 1, "wall_s": 1.0, "controller_cpu_s": 1 + 0.2 * n + 0.5 * n, "controller_main_cpu_s": 1 + 0.2 * n,
                 "shard_main_cpu_s": [], "changed": 0, "rc": 0, "statuses": {"a": "pass"}}]
        for k in (2, 4):
            child = 1 + 0.1 * (n / k) + 0.02 * n
            runs.append({"k": k, "wall_s": 1.0, "controller_main_cpu_s": 1 + 0.03 * n, "shard_main_cpu_s": [child] * k,
                         "controller_cpu_s": 1 + 0.03 * n + child * k + 0.6 * n, "changed": 0, "rc": 0,
                         "statuses": {"a": "pass"}})
        sizes.append({"nodes": n, "runs": runs})
    return {"sizes": sizes, "counts": [1, 2, 4], "commit": "abc", "date": "d"}


def _userpath(main_per_node, all_per_node):
    def med(ctrl, main):
        return {"median": {"controller_cpu_s": ctrl, "controller_main_cpu_s": main, "node_cpu_s": 0.0}}
    return {"sizes": [{"nodes": n, "user": med(2 + (0.5 + all_per_node) * n, 1 + (0.2 + main_per_node) * n),
                       "light": med(2 + 0.5 * n, 1 + 0.2 * n)} for n in (2, 4, 8)], "commit": "def", "date": "e"}


def test_the_roles_main_cost_goes_to_the_child_and_the_rest_over_the_cores():
    est = shards.user_estimate(_light(), _userpath(0.25, 0.85), cores=16)
    assert est["roles_main_per_node"] == pytest.approx(0.25) and est["roles_workers_per_node"] == pytest.approx(0.6)
    at = {(x["nodes"], x["k"]): x["estimated_s"] for x in est["points"]}
    # 1,024 nodes, K = 16 (64 a shard): parent 1 + 0.03·1024, child 1 + 0.1·64 + 0.02·1024 + 0.25·64,
    # workers (0.6 + 0.6)·1024 over 16 cores
    want = (1 + 0.03 * 1024) + (1 + 6.4 + 20.48 + 16) + 1.2 * 1024 / 16
    assert at[(1024, 16)] == pytest.approx(want, abs=0.2)
    assert at[(256, 16)] < at[(256, 8)] and at[(1024, 32)] < at[(1024, 16)]
    assert shards.estimate_lines(est)[-1].startswith("| 1024 | 32 |")


def test_no_estimate_without_both_raw_files():
    assert shards.user_estimate({"sizes": [], "counts": []}, _userpath(0.2, 0.8)) == {}
    assert shards.estimate_lines({}) == []
