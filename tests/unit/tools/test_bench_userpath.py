"""The user-path benchmark's arithmetic (tests/bench/userpath.py): the roles' cost from the difference of the two
paths at the same sizes, the user path's slope and intercept, and the estimated points at light-harness sizes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests/bench"))
import userpath  # noqa: E402  (tests/bench/userpath.py)


def _point(n, ctrl, main, node, by=None):
    by = by or {f"c-node{i}": {"run": 40 if i == 1 else 30, "skipped": 5} for i in range(1, n + 1)}
    return {"nodes": n, "controller_cpu_s": ctrl, "controller_main_cpu_s": main, "node_cpu_s": node,
            "tasks_by_host": by, "head": "c-node1", "wall_s": 10.0, "ssh_execs_per_node": 9.0, "cores": 2}


def _results(user, light):
    return {"sizes": [{"nodes": u["nodes"], "user": {"median": u}, "light": {"median": lp}}
                      for u, lp in zip(user, light)]}


def test_roles_cost_is_the_fitted_difference_of_the_two_paths():
    # user = 8 + 3n, light = 5 + 1.5n: the roles add 3 + 1.5n; main 1 + 0.5n against 0.5 + 0.25n; nodes 2n against n.
    res = _results([_point(n, 8 + 3 * n, 1 + 0.5 * n, 2 * n) for n in (2, 4, 8)],
                   [_point(n, 5 + 1.5 * n, 0.5 + 0.25 * n, n) for n in (2, 4, 8)])
    roles = userpath.roles_cost(res)
    assert roles["fitted_on"] == [2, 4, 8]
    assert roles["controller_cpu_s"]["per_node"] == pytest.approx(1.5)
    assert roles["controller_cpu_s"]["fixed"] == pytest.approx(3.0)
    assert roles["controller_main_cpu_s"]["per_node"] == pytest.approx(0.25)
    assert roles["node_cpu_s"]["per_node"] == pytest.approx(1.0)
    fit = userpath.fit_user(res)
    assert fit["slope_s_per_node"] == pytest.approx(3.0) and fit["intercept_s"] == pytest.approx(8.0)


def test_estimated_points_add_the_roles_cost_to_each_light_point():
    roles = {"controller_cpu_s": {"per_node": 1.5, "fixed": 3.0}, "controller_main_cpu_s": {"per_node": 0.25, "fixed": 0.5},
             "node_cpu_s": {"per_node": 1.0, "fixed": 0.0}}
    light = [_point(16, 18.0, 4.8, 30.0), _point(64, 74.0, 19.0, 130.0)]
    est = userpath.estimated_points(light, roles)
    assert [p["controller_cpu_s"] for p in est] == [pytest.approx(18 + 3 + 24), pytest.approx(74 + 3 + 96)]
    assert est[1]["controller_main_cpu_s"] == pytest.approx(19 + 0.5 + 16)
    assert est[0]["node_cpu_s"] == pytest.approx(46.0)
    assert light[0]["controller_cpu_s"] == 18.0  # the measured points are left as they were


def test_head_and_worker_counts_come_from_the_recap_by_host():
    hw = userpath.head_worker(_point(3, 1, 1, 1))
    assert hw == {"head_run": 40, "head_skipped": 5, "worker_run": 30, "worker_skipped": 5}


def test_the_median_uses_only_clean_runs_and_says_whether_every_run_was():
    runs = [dict(_point(2, c, 1.0, 2.0), rc=rc, changed=ch, others_cpu_s=0.0, tasks_per_node=45.0,
                 tasks_run_per_node=35.0) for c, rc, ch in ((10.0, 0, 0), (30.0, 2, 0), (12.0, 0, 0), (11.0, 0, 0))]
    m = userpath._median(runs)
    assert m["controller_cpu_s"] == 11.0 and m["controller_cpu_s_range"] == [10.0, 12.0]
    assert m["runs_used"] == 3 and m["all_clean"] is False


def test_a_negative_fixed_part_of_the_roles_cost_is_fitted_as_a_cost_per_node_alone():
    # The differences 1.9, 4.1, 7.9 at 2, 4, 8 nodes fit -0.1 + 1.0n; the roles' cost is taken as b·n through 0.
    res = _results([_point(n, d + 1.0, 1.0, 1.0) for n, d in ((2, 1.9), (4, 4.1), (8, 7.9))],
                   [_point(n, 1.0, 1.0, 1.0) for n in (2, 4, 8)])
    roles = userpath.roles_cost(res)
    assert roles["controller_cpu_s"]["fixed"] == 0.0
    assert roles["controller_cpu_s"]["per_node"] == pytest.approx((2 * 1.9 + 4 * 4.1 + 8 * 7.9) / 84, abs=1e-3)
