"""filter_plugins/launch_filters.py: every node's status folded into one view that names the first
failing node and rank, fed with the module's own results parsed from real torchrun logs."""

from __future__ import annotations

from helpers import REPO, load

from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr

lf = load("filter_plugins/launch_filters.py", "launch_filters")
DATA = REPO / "tests/data/torchrun"


def node_result(log_name, node_rank, state="failed"):
    """What torchrun_launch state=status returns for a node whose log is log_name."""
    text = (DATA / log_name).read_text()
    f = tr.root_cause(text)
    f["node_rank"] = node_rank
    f["sort_key"] = [k if k != float("inf") else 1e18 for k in tr.failure_sort_key(f)]
    return {"state": state, "node_rank": node_rank, "failure": f, "log": "/var/lib/trainyard/train/torchrun.log",
            "log_tail": tr.failure_tail(text, 5), "last_log_line": tr.last_line(text), "pid": 100 + node_rank}


def test_names_the_killed_node_not_the_earlier_survivor():
    hv = {"n1": {"__job_status": node_result("sim_node_survivor.log", 0)},
          "n2": {"__job_status": node_result("sim_node_killed.log", 1)},
          "n3": {"__job_status": node_result("sim_node_survivor.log", 2)}}
    s = lf.status_summary(hv, ["n1", "n2", "n3"])
    assert s["state"] == "failed"
    assert s["first_failure"]["node"] == "n2" and s["first_failure"]["rank"] == 1
    assert s["failure_text"].startswith("first failure: node n2 (node rank 1), rank 1 (local rank 0), exit code -9 "
                                        "(SIGKILL)")
    assert "torchrun exited with code 1" in s["failure_text"]
    assert [n["state"] for n in s["nodes"]] == ["failed"] * 3


def test_all_running_and_all_finished():
    run = {"state": "running", "node_rank": 0, "last_log_line": "trainyard: step 5 loss 0.1", "failure": None}
    hv = {"a": {"__job_status": run}, "b": {"__job_status": dict(run, node_rank=1)}}
    s = lf.status_summary(hv, ["a", "b"])
    assert s["state"] == "running" and s["first_failure"] is None and s["failure_text"] == ""
    assert "trainyard: step 5 loss 0.1" in s["lines"][0]
    fin = {"a": {"__job_status": dict(run, state="finished")}, "b": {"__job_status": dict(run, state="finished")}}
    assert lf.status_summary(fin, ["a", "b"])["state"] == "finished"


def test_unreachable_and_partial():
    run = {"state": "running", "node_rank": 0, "failure": None}
    hv = {"a": {"__job_status": run}, "b": {}}
    s = lf.status_summary(hv, ["a", "b"], reachable=["a"])
    assert s["state"] == "unreachable" and s["nodes"][1]["state"] == "unreachable"
    hv = {"a": {"__job_status": run}, "b": {"__job_status": {"state": "absent"}}}
    assert lf.status_summary(hv, ["a", "b"])["state"] == "partial"


def test_a_dead_agent_without_report_is_still_named():
    dead = {"state": "failed", "node_rank": 2, "failure": None, "exit": {"returncode": -9}, "log": "/l",
            "log_tail": "trainyard: step 9"}
    ok = {"state": "running", "node_rank": 0, "failure": None}
    s = lf.status_summary({"a": {"__job_status": ok}, "c": {"__job_status": dead}}, ["a", "c"])
    assert s["first_failure"]["node"] == "c" and s["first_failure"]["rank"] is None
    assert "its torchrun agent" in s["failure_text"]


def test_an_agent_killed_from_outside_is_named_before_the_connection_errors_it_caused():
    """kill -9 of one node's torchrun agent: that node's log has no per-rank report, the other node's ranks log
    'Connection closed by peer' a second later. The dead agent is the cause."""
    survivor = node_result("sim_node_survivor.log", 0)
    killed_at = survivor["failure"]["time_epoch"] - 1
    dead = {"state": "failed", "node_rank": 1, "failure": None, "log": "/l1", "log_tail": "trainyard: step 9",
            "exit": {"returncode": -9, "ended_at": killed_at}}
    s = lf.status_summary({"a": {"__job_status": survivor}, "b": {"__job_status": dead}}, ["a", "b"])
    assert s["first_failure"]["node"] == "b"
    assert s["failure_text"].startswith("first failure: node b (node rank 1), its torchrun agent, exit code -9 "
                                        "(SIGKILL)")
    # torn down by SIGTERM (a user's stop), the agent is not the cause: the survivor's failure is named
    torn = dict(dead, exit={"returncode": -15, "ended_at": killed_at})
    s = lf.status_summary({"a": {"__job_status": survivor}, "b": {"__job_status": torn}}, ["a", "b"])
    assert s["first_failure"]["node"] == "a"


def test_a_node_stopped_by_the_fail_fast_watcher_says_why_and_is_not_the_cause():
    """The fail-fast watcher stopped node a's torchrun (exit code 1, no per-rank report) 2 s after node b's rank
    died: b's rank is named first, and a's line says why a ended."""
    killed = node_result("sim_node_killed.log", 1)
    reason = "stopped because node rank 1 failed: rank 1 (local rank 0), exit code -9 (SIGKILL)"
    stopped = {"state": "failed", "node_rank": 0, "failure": None, "log": "/l0", "last_log_line": "trainyard: step 9",
               "exit": {"returncode": 1, "ended_at": killed["failure"]["time_epoch"] - 30,
                        "peer_stop": {"why": "peer_failed", "reason": reason}}}
    s = lf.status_summary({"a": {"__job_status": stopped}, "b": {"__job_status": killed}}, ["a", "b"])
    assert s["first_failure"]["node"] == "b" and s["first_failure"]["rank"] == 1
    assert s["nodes"][0]["why"] == reason and reason in s["lines"][0]
    assert s["nodes"][1]["why"] == ""
