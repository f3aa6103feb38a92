"""collect.yml on hostile job data: bounded unpickling of flight-recorder dumps, records of the wrong types, caps
on what a node's evidence may hold (module_utils/job_collect.py, library/collect_bundle.py)."""

import pickle
import sys

import pytest

from helpers import load

cb = load("library/collect_bundle.py", "collect_bundle_bounds")


class _Call:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


@pytest.mark.parametrize("fn,args", [(bytes, (10 ** 12,)), (bytearray, (10 ** 12,)), (list, ("x" * 10,)),
                                     (str, (b"x",)), (int, ("9",)), (dict, ()), (tuple, ("ab",))])
def test_a_tiny_dump_cannot_make_the_controller_allocate(fn, args):
    """A 50-byte pickle asking for bytes(10**12) (or any call that allocates by its argument) is refused before
    anything is built; the allow-list holds set, frozenset and latin1 bytes of protocol 2 only."""
    data = pickle.dumps(_Call(fn, *args), protocol=4)
    assert len(data) < 100
    with pytest.raises(pickle.UnpicklingError, match="refused builtins"):
        cb.load_plain(data)


def test_object_count_and_text_size_are_capped():
    many = pickle.dumps({"entries": ["s"] * (cb.FR_MAX_OPS + 10)}, protocol=4)  # memo references: 2 bytes each
    with pytest.raises(pickle.UnpicklingError, match="more than %d objects" % cb.FR_MAX_OPS):
        cb.load_plain(many)
    with pytest.raises(pickle.UnpicklingError, match="bytes of strings"):
        cb.check_pickle(pickle.dumps(["x" * 100, b"y" * 100]), max_text=150)
    with pytest.raises(pickle.UnpicklingError, match="refused opcode"):
        cb.load_plain(b"(c__main__\nX\no.")  # INST/OBJ build an instance of any class


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_dumps_of_every_protocol_still_load(protocol):
    dump = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {"0": {"last_enqueued_collective": 3}}, "entries": [
                {"record_id": 1, "process_group": ("0", "default_pg"), "input_dims": [[2, 2]], "frames": [
                    {"name": "f", "filename": "a.py", "line": 3}], "tag": b"\x00\xffab", "set": {1, 2},
                 "fset": frozenset({"a"}), "z": 1.5, "ok": True, "none": None}]}
    assert cb.load_plain(pickle.dumps(dump, protocol=protocol)) == dump


@pytest.mark.parametrize("dump,why", [
    ({"pg_config": 5}, "'pg_config': expected dict, got int"),
    ({"pg_config": {"": 5}, "entries": [5, {"process_group": 7}]}, None),
    ({"entries": "x"}, "'entries': expected list, got str"),
    ([1, 2], "expected a JSON object, got list"),
])
def test_dumps_of_the_wrong_types_are_refused_or_tolerated_never_raised(tmp_path, dump, why):
    """A dump with "pg_config": 5 used to raise TypeError out of collect_bundle (a traceback, no bundle)."""
    r = cb.analyse_dumps(str(tmp_path), {0: pickle.dumps(dump)}, 1, sys.executable, 30)
    assert r["status"] == "skip"
    if why:
        assert "dumps refused: rank 0: " in r["note"] and why in r["note"], r["note"]


# ----------------------------------------------------------------------------------- caps on a node's evidence
import base64  # noqa: E402
import json  # noqa: E402

from ansible_collections.trainyard.core.plugins.module_utils import job_collect as jc  # noqa: E402
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr  # noqa: E402
from helpers import adhoc  # noqa: E402

lf = load("filter_plugins/launch_filters.py", "launch_filters_bounds")
DEEP = "[" * 50000 + "]" * 50000  # 100 KB of nesting: json.loads raised RecursionError


def _layout(tmp_path):
    job = tmp_path / "train"
    rw = job / tr.JOB_RW_DIR
    (rw / "flight_recorder").mkdir(parents=True)
    (rw / "progress").mkdir()
    (job / tr.JOB_RO_DIR).mkdir()
    return job, rw


def test_collect_caps_the_files_a_job_plants_and_says_what_it_left_out(tmp_path):
    """Sparse dumps and progress files cost the job nothing: at most files_max per directory and node_max_bytes
    per node are taken, the rest is listed in left_out and as skipped files."""
    job, rw = _layout(tmp_path)
    for i in range(30):
        (rw / "flight_recorder" / ("rank_%d" % i)).write_bytes(b"\x80\x04N." + b"\0" * 5000)
        (rw / "progress" / ("rank_%d.json" % i)).write_text(json.dumps({"rank": i, "step": 1}))
    (rw / "torchrun.log").write_text("x" * 20000)
    r = adhoc("job_collect", {"job": "train", "state_root": str(tmp_path), "nvidia_smi": "", "files_max": 5,
                              "node_max_bytes": 40000})
    assert not r.get("failed"), r.get("msg")
    dumps = [f for f in r["files"] if f["name"].startswith("flight_recorder/")]
    assert len(dumps) == 5 and len(r["progress"]) <= 5
    left = {x["name"]: x["why"] for x in r["left_out"]}
    assert "25 more files than files_max (5" in left["flight_recorder/"], left
    assert any("reached node_max_bytes (40000" in why for why in left.values()), left
    assert sum(len(base64.b64decode(f["content"])) for f in r["files"] if "content" in f) <= 40000


def test_deep_and_wrongly_typed_records_never_raise(tmp_path):
    """A progress file of 100 KB of nesting, "step": "x", 1e999: job_collect used to die of RecursionError (its
    redaction parsed every JSON file) and the controller of ValueError; now refused at the reader, file kept."""
    job, rw = _layout(tmp_path)
    (rw / "progress" / "rank_0.json").write_text(DEEP)
    (rw / "progress" / "rank_1.json").write_text('{"rank": 1, "step": "x"}')
    (rw / "progress" / "rank_2.json").write_text('{"rank": 2, "step": 3, "time": 1e999}')
    (rw / "progress" / "rank_3.json").write_text('{"rank": 3, "step": 4, "time": 10.0}')
    (job / "launch.json").write_text('{"job": "train", "started_at": "x", "nested": %s}' % DEEP)
    r = adhoc("job_collect", {"job": "train", "state_root": str(tmp_path), "nvidia_smi": ""})
    assert not r.get("failed"), r.get("msg")
    assert r["progress"] == [{"rank": 3, "step": 4, "time": 10.0}] and r["state"] is None
    refused = {x["name"]: x["why"] for x in r["left_out"]}
    assert "nested deeper" in refused["progress/rank_0.json"] and "'step'" in refused["progress/rank_1.json"]
    assert "overflows" in refused["progress/rank_2.json"]
    assert {f["name"] for f in r["files"]} >= {"progress/rank_%d.json" % i for i in range(4)}
    assert jc.redact_file("x.json", DEEP.encode())  # redacted as text, no RecursionError


def test_controller_side_consumers_tolerate_wrong_types():
    ranks = [{"rank": 0, "step": "x"}, {"rank": 1, "step": 2, "time": float("inf")}, {"rank": "2", "step": 1},
             {"rank": 3, "step": 5, "time": 99.0, "step_s": "fast", "compute_s": True}, 7, None,
             {"rank": 4, "step": 6, "time": 99.0, "step_s": 0.5, "compute_s": 0.1}]
    s = jc.progress_summary({"n1": {"node_rank": 0, "ranks": ranks},
                             "n2": {"node_rank": 1, "state": "running", "now": "x", "started_at": [1],
                                    "log_mtime": float("nan")}}, 100.0)
    assert [n["ranks"] for n in s["nodes"]] == [[4], []]
    res = {"state": "failed", "node_rank": 0, "exit": {"returncode": -9, "ended_at": "x"}}
    f = lf.first_failure({"n1": res, "n2": dict(res, node_rank="y", exit={"returncode": 1, "ended_at": 1e999})})
    assert f["node"] == "n1"
