"""The reset role's summary (filter_plugins/reset_filters.py) and the container's line of it
(filter_plugins/container_filters.py reset_summary)."""

from helpers import load

rf = load("filter_plugins/reset_filters.py", "reset_filters")
cf = load("filter_plugins/container_filters.py", "container_filters_reset")


def test_summary_line_names_what_was_found_cleaned_and_kept():
    s = {"found": "job train (2 processes)", "cleaned": "2 processes", "port_report": "39500 free",
         "kept": ["/dev/shm/torch_x"], "errors": ["rm: busy"]}
    assert rf.summary_line(s) == ("found job train (2 processes) | cleaned: 2 processes | port: 39500 free | kept 1 "
                                  "matching files of others | ERRORS: rm: busy")
    assert rf.summary_line({"found": "nothing", "cleaned": "nothing"}) == "found nothing | cleaned: nothing"
    assert rf.summary_line({}) == rf.summary_line(None) == "UNREACHABLE or failed before cleaning: not reset"


def test_not_reset_names_missing_nodes_then_nodes_with_errors():
    hosts = ["n1", "n2", "n3"]
    assert rf.not_reset(hosts, {"n1": {"errors": []}, "n3": {"errors": ["x"]}}) == [
        "n2: unreachable or not reset", "n3: errors (see summary)"]
    assert rf.not_reset(hosts, {h: {} for h in hosts}) == []


def test_container_reset_line():
    assert cf.reset_summary("trainyard-train", True, "", True, False) == "trainyard-train restarted"
    assert cf.reset_summary("c", False, "x" * 300, True, True) == "c: recreate failed: " + "x" * 197 + "..."
    assert cf.reset_summary("c", False, "", False, True) == "c created"
    assert cf.reset_summary("c", False, "", True, True) == "c recreated"
    assert cf.reset_summary("c", False, "", True, False) == "c running, left alone"


nf = load("filter_plugins/network_filters.py", "network_filters_reset")


def test_network_reset_line():
    assert nf.network_reset_summary({"skipped": True}) == "not the head: no rendezvous port here"
    done = {"verdict": {"detail": "port 39500 free", "state": "free"}, "stopped": [41, 42]}
    assert nf.network_reset_summary(done) == "port 39500 free after stopping PID 41, 42 of this tool's job"
    other = {"verdict": {"detail": "port 39500 held by PID 7 (nc)", "state": "other", "fix": "stop it"}, "stopped": []}
    assert nf.network_reset_summary(other) == "port 39500 held by PID 7 (nc) (left alone: not this tool's job; stop it)"
    assert nf.network_reset_summary({"verdict": {"detail": "port 39500 free", "state": "free"}}) == "port 39500 free"
