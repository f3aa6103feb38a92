"""The job role's status filters (filter_plugins/launch_progress.py): the per-node table, the
straggler line and the ranks grouped by the call they sit in, from job_progress results as hostvars hold them."""

from helpers import load

lp = load("filter_plugins/launch_progress.py", "launch_progress")


def rank(r, node_rank, compute, step=40, t=100.0):
    return {"rank": r, "node_rank": node_rank, "step": step, "steps_total": 100, "time": t, "step_s": 0.25,
            "compute_s": compute}


def hostvars():
    gpu = {"index": 0, "util_pct": 97, "mem_used_mib": 70000, "temp_c": 81, "throttle": ["gpu_idle"]}
    return {
        "n1": {"cluster_model": {"node_rank": 0}, "__job_progress": {
            "progress": [rank(0, 0, 0.1)], "gpus": [gpu], "now": 101.0}},
        "n2": {"cluster_model": {"node_rank": 1}, "__job_progress": {
            "progress": [rank(1, 1, 0.4)], "gpus": [dict(gpu, throttle=["hw_slowdown"], temp_c=92)], "now": 101.0},
            "__job_stacks": {"stacks": [{"rank": 1, "method": "py-spy", "call": "main (train.py:9)"}]}},
        "n3": {"cluster_model": {"node_rank": 2}, "__job_progress": {
            "progress": [rank(2, 2, 0.11)], "gpus": [], "gpu_skipped": "no nvidia-smi on the node (no GPU)",
            "now": 101.0},
            "__job_stacks": {"stacks": [{"rank": 2, "skipped": "SIGUSR1 not caught"}]}},
    }


def test_table_has_a_row_per_node_with_speed_eta_and_gpus():
    s = lp.launch_progress_summary(hostvars(), ["n1", "n2", "n3"], 300, 1.3)
    lines = lp.launch_progress_lines(s, {"n1": "running", "n2": "running", "n3": "running"})
    assert lines[0].split() == ["node", "rank", "state", "step", "steps/s", "ETA", "compute", "s", "GPU", "util",
                                "GPU", "mem", "temp", "throttle"]
    n1 = lines[1].split()
    assert n1[:7] == ["n1", "0", "running", "40", "4.00", "0h00m15s", "0.100"] and "97%" in n1 and "81C" in n1
    assert "hw_slowdown" in lines[2] and "92C" in lines[2]
    assert "skip: no nvidia-smi on the node (no GPU)" in lines[3]
    assert lines[4].startswith("STRAGGLER n2 (node rank 1) is a straggler: its ranks [1]")
    assert not any(x.startswith("STALLED") for x in lines)


def test_stalled_and_stack_groups():
    s = lp.launch_progress_summary(hostvars(), ["n1", "n2", "n3"], 0.5, 1.3)
    assert s["stalled"] == ["n1", "n2", "n3"]
    lines = lp.launch_stack_lines(hostvars(), ["n1", "n2", "n3"])
    assert lines[0] == "rank 1 (n2) sits in main (train.py:9)" and len(lines) == 2
    assert lines[1].startswith("n3 rank 2: no stack: SIGUSR1 not caught. fix: put py-spy on the controller")


def test_a_node_with_no_step_and_a_silent_log_is_stalled_and_said_so():
    hv = hostvars()
    hv["n3"]["__job_progress"] = {"progress": [], "gpus": [], "now": 101.0, "log_mtime": 20.0}
    hv["n3"]["__job_status"] = {"state": "running", "started_at": 10.0}
    s = lp.launch_progress_summary(hv, ["n1", "n2", "n3"], 50, 1.3)
    assert s["stalled"] == ["n3"]
    lines = lp.launch_progress_lines(s, {"n1": "running", "n2": "running", "n3": "running"})
    assert "STALLED: no progress on n3 (no step recorded and its log silent)" in lines[-1]
    hv["n3"]["__job_status"]["state"] = "finished"
    assert lp.launch_progress_summary(hv, ["n1", "n2", "n3"], 50, 1.3)["stalled"] == []


def test_watch_goes_on_while_a_node_runs_and_nothing_failed():
    def st(state, *nodes):
        return {"state": state, "nodes": [{"node": "n%d" % i, "state": s} for i, s in enumerate(nodes)]}
    assert lp.launch_watch_more(st("running", "running", "running"))
    assert lp.launch_watch_more(st("partial", "finished", "running"))  # one node finished a moment earlier
    assert not lp.launch_watch_more(st("finished", "finished", "finished"))
    assert not lp.launch_watch_more(st("failed", "failed", "running"))
    assert not lp.launch_watch_more(st("unreachable", "unreachable", "running"))
    assert not lp.launch_watch_more(st("partial", "absent", "finished"))
