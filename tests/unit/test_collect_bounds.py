"""collect.yml on hostile job data: bounded unpickling of flight-recorder dumps, records of the wrong types, caps
on what a node's evidence may hold (module_utils/job_collect.py, library/collect_bundle.py)."""

import pickle
import sys

import pytest

from conftest import load

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
