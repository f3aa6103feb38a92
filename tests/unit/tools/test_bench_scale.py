"""The scale benchmark's pure parts (tests/bench/scale.py): parsing Ansible's output, finding the tasks whose cost
grows faster than linearly in the role files, and the fitted model that projects a converged run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests/bench"))
import scale  # noqa: E402  (tests/bench/scale.py)

OUTPUT = """
PLAY RECAP *********************************************************************
hn-node1                 : ok=84   changed=0    unreachable=0    failed=0    skipped=99   rescued=0    ignored=0
hn-node2                 : ok=77   changed=1    unreachable=0    failed=0    skipped=100  rescued=0    ignored=0
localhost                  : ok=12   changed=0    unreachable=0    failed=0    skipped=1    rescued=0    ignored=0

TASKS RECAP ********************************************************************
Monday 23 November 2026  22:33:35 +0000 (0:00:01.065)       0:00:49.316 *******
===============================================================================
Validate the cluster model ---------------------------------------------- 0.07s
network : Ping every peer with don't-fragment pings at MTU - 28 and 1472 bytes --- 1.41s
cluster : Record the host basics ---------------------------------------- 0.45s
"""


def test_recap_and_profile_are_parsed():
    recap = scale.parse_recap(OUTPUT)
    assert recap["hn-node2"] == {"ok": 77, "changed": 1, "unreachable": 0, "failed": 0, "skipped": 100}
    prof = scale.parse_profile(OUTPUT)
    assert prof[1] == ("network : Ping every peer with don't-fragment pings at MTU - 28 and 1472 bytes", 1.41)
    assert len(prof) == 3 and scale.parse_profile("no recap") == []


def test_superlinear_tasks_are_found_in_the_role_files():
    classes = scale.superlinear_tasks()
    assert [k for k, v in classes.items() if v == "path_mtu"] == [
        "network : Ping every peer with don't-fragment pings at MTU - 28 and 1472 bytes, connect to the rendezvous port "
        "and record every network check"]
    assert any(v == "cross_node" and k.startswith("network : ") for k, v in classes.items())


def test_fit_line():
    assert scale.fit_line([16, 32, 64], [1 + 0.5 * x for x in (16, 32, 64)]) == pytest.approx((1, 0.5))
    assert scale.fit_line([8], [3.0]) == (3.0, 0.0)


def test_a_per_node_cost_that_falls_with_n_is_not_extrapolated_downwards():
    assert scale.fit_growth([4, 16, 32], [4.0, 2.7, 3.1]) == (pytest.approx(3.2666, abs=1e-3), 0.0)
    assert scale.fit_growth([4, 16], [1.0, 2.2]) == pytest.approx((0.6, 0.1))


def point(n, s0=0.5, s1=0.002, w0=4.0, w1=0.01, c0=3.0, c1=0.02):
    main = n * (s0 + s1 * n)
    workers = n * (w0 + w1 * n)
    node = n * (c0 + c1 * n)
    # Half of a 2-core machine busy with other work: the run gets one core.
    wall = main + workers + node
    return {"nodes": n, "controller_main_cpu_s": main, "controller_cpu_s": main + workers, "node_cpu_s": node,
            "wall_s": wall, "others_cpu_s": wall, "cores": 2, "ssh_execs_per_node": 20}


def test_model_recovers_the_costs_and_projects_with_the_nodes_in_parallel():
    m = scale.model([point(16), point(32), point(64)])
    f = m["fit"]
    assert (f["s0"], f["s1"], f["w0"], f["w1"], f["c0"], f["c1"]) == pytest.approx((0.5, 0.002, 4.0, 0.01, 3.0, 0.02))
    assert all(abs(c["error_pct"]) < 0.1 and abs(c["cpu_error_pct"]) < 0.1 and c["cores_got"] == 1
               for c in m["checks"])
    assert abs(m["holdout"]["error_pct"]) < 0.1 and m["holdout"]["fitted_on"] == [16, 32]
    p = {r["nodes"]: r for r in m["projection"]}
    n = 1024
    want = n * (0.5 + 0.002 * n) + n * (4.0 + 0.01 * n) / 16 + (3.0 + 0.02 * n) + 20 * 0.001
    assert p[n]["wall_s"] == pytest.approx(want, abs=0.1)


def test_the_once_per_run_tasks_are_found_in_the_role_files_and_the_controller_plays():
    once = scale.once_tasks()
    assert "nccl_env : Compare the env files of every node and record each node's fabric and env file checks" in once  # run_once
    assert "cluster : Collect every node's check records" in once  # the report play, on localhost
    assert "cluster : Leave out the failing nodes and remember the machines that failed" in once  # the exclude play
    assert "network : Probe the network, set and persist the data interface MTU" not in once  # every node
    run = {"task_cpu": [["nccl_env : Compare the env files of every node and record each node's fabric and env file checks", 0.25, 0.0],
                        ["network : Probe the network, set and persist the data interface MTU", 3.0, 9.0],
                        ["cluster : Collect every node's check records", 0.5, 0.0]]}
    assert scale.once_cpu_s(run) == pytest.approx(0.75)
    assert scale.once_cpu_s({}) is None


def test_the_once_per_run_tasks_are_serial_in_the_projection():
    """A once-per-run task runs in one worker: however many cores, its CPU adds to the wall time whole."""
    def with_once(n, o0=1.0, o1=0.05):
        p = point(n)
        once = o0 + o1 * n
        return dict(p, controller_cpu_s=p["controller_cpu_s"] + once, controller_once_cpu_s=once,
                    wall_s=p["wall_s"] + once, others_cpu_s=p["others_cpu_s"] + once)
    m = scale.model([with_once(16), with_once(32), with_once(64)])
    f = m["fit"]
    assert (f["o0"], f["o1"], f["w0"], f["w1"]) == pytest.approx((1.0, 0.05, 4.0, 0.01))
    p = {r["nodes"]: r for r in m["projection"]}
    n = 1024
    want = n * (0.5 + 0.002 * n) + (1.0 + 0.05 * n) + n * (4.0 + 0.01 * n) / 16 + (3.0 + 0.02 * n) + 20 * 0.001
    assert p[n]["once_s"] == pytest.approx(1.0 + 0.05 * n, abs=0.1)
    assert p[n]["wall_s"] == pytest.approx(want, abs=0.1)
    # Points without the once tasks' CPU: counted as parallel, as before
    legacy = scale.model([point(16), point(32), point(64)])
    assert legacy["fit"]["o0"] == 0 and legacy["fit"]["o1"] == 0


def test_the_cost_per_task_reads_rows_with_the_main_process_column():
    """cpu_per_task writes [task, controller, nodes, ansible-playbook's own CPU]; rows of three (older raw files) too."""
    run = {"nodes": 2, "ssh_tasks": {"a": 2}, "task_cpu": [["a", 0.4, 1.0, 0.1], ["b", 0.2, 0.0]]}
    text = scale.task_cost_section(run)
    assert "| a |" in text and "| b |" in text
