"""plugin_utils/shards.py: which shard this process runs (TRAINYARD_SHARD), the split of the nodes into contiguous
shards, and the exchange of every shard's values at a cross-node step, run here as K real threads over real files
under tmp_path (docs/sharding.md)."""

import os
import threading
import time

import pytest

from ansible_collections.trainyard.core.plugins.plugin_utils import shards

PLAN = [["n1", "n2"], ["n3", "n4"], ["n5", "n6"]]


def write_plan(root, plan=PLAN):
    shards.write_json(os.path.join(str(root), shards.PLAN), {"shards": plan})


def run_shards(root, values, step, wait_s=5.0, fn=None):
    """Each index of values as its own thread with its own Shard (same root, count = the plan's K): {index: answer or
    the exception it raised}. fn(shard, value) defaults to union."""
    count = len(PLAN)
    fn = fn or (lambda shard, value: shards.union(value, step, shard))
    out = {}

    def one(i, value):
        try:
            out[i] = fn(shards.Shard(i, count, str(root), wait_s), value)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out[i] = e

    threads = [threading.Thread(target=one, args=(i, v), daemon=True) for i, v in values.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(wait_s + 5)
        assert not t.is_alive(), "a shard's exchange never returned"
    return out


def tmp_files(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(str(root)) for f in fs if f.endswith(".tmp")]


# current(): the shard of this process, from its environment.


def test_current_is_none_outside_a_sharded_run(monkeypatch):
    assert shards.current({}) is None
    assert shards.current({shards.ENV_SHARD: "", shards.ENV_DIR: "/x"}) is None
    monkeypatch.delenv(shards.ENV_SHARD, raising=False)
    assert shards.current() is None


def test_current_reads_index_count_dir_and_wait(tmp_path, monkeypatch):
    s = shards.current({shards.ENV_SHARD: "1/3", shards.ENV_DIR: str(tmp_path)})
    assert (s.index, s.count, s.root, s.wait_s) == (1, 3, str(tmp_path), shards.DEFAULT_WAIT_S)
    assert not s.leader and "1/3" in repr(s)
    s = shards.current({shards.ENV_SHARD: "0/2", shards.ENV_DIR: str(tmp_path), shards.ENV_WAIT: "0.3"})
    assert (s.index, s.count, s.wait_s) == (0, 2, 0.3) and s.leader
    monkeypatch.setenv(shards.ENV_SHARD, "2/3")
    monkeypatch.setenv(shards.ENV_DIR, str(tmp_path))
    monkeypatch.delenv(shards.ENV_WAIT, raising=False)
    s = shards.current()
    assert (s.index, s.count, s.root) == (2, 3, str(tmp_path))


@pytest.mark.parametrize("spec", ["3/3", "4/3", "x/2", "1/0", "0/0", "1", "1/", "/3", "-1/3", "1/3/4", " 1/3"])
def test_current_refuses_a_malformed_shard_spec_naming_the_variable(tmp_path, spec):
    with pytest.raises(shards.ShardError) as e:
        shards.current({shards.ENV_SHARD: spec, shards.ENV_DIR: str(tmp_path)})
    assert "TRAINYARD_SHARD=" + repr(spec) in str(e.value)


def test_current_refuses_a_shard_without_its_directory():
    for env in ({shards.ENV_SHARD: "1/3"}, {shards.ENV_SHARD: "1/3", shards.ENV_DIR: ""}):
        with pytest.raises(shards.ShardError) as e:
            shards.current(env)
        assert "TRAINYARD_SHARD_DIR=''" in str(e.value) and "TRAINYARD_SHARD=" in str(e.value)


def test_current_refuses_a_wait_that_is_not_a_number(tmp_path):
    with pytest.raises(shards.ShardError) as e:
        shards.current({shards.ENV_SHARD: "1/3", shards.ENV_DIR: str(tmp_path), shards.ENV_WAIT: "soon"})
    assert "TRAINYARD_SHARD_WAIT_S='soon'" in str(e.value)


@pytest.mark.parametrize("wait", ["nan", "inf", "-inf", "0", "-5"])
def test_current_refuses_a_wait_that_would_never_end_or_never_wait(tmp_path, wait):
    with pytest.raises(shards.ShardError) as e:
        shards.current({shards.ENV_SHARD: "1/3", shards.ENV_DIR: str(tmp_path), shards.ENV_WAIT: wait})
    assert shards.ENV_WAIT in str(e.value)


def test_a_trailing_newline_is_not_a_shard(tmp_path):
    with pytest.raises(shards.ShardError):
        shards.current({shards.ENV_SHARD: "1/3\n", shards.ENV_DIR: str(tmp_path)})


def test_a_value_that_is_not_json_is_a_shard_error_and_leaves_no_file(tmp_path):
    write_plan(tmp_path)
    with pytest.raises(shards.ShardError, match="must be JSON"):
        shards.union({"a": {1, 2}}, "step-x", shards.Shard(0, 3, str(tmp_path), 0.3))
    left = [f for _, _, files in os.walk(tmp_path) for f in files if f != shards.PLAN]
    assert left == []


def test_a_shard_that_writes_the_step_and_ends_between_the_two_reads_still_counts(tmp_path, monkeypatch):
    """The waiting shard reads the step file (not there yet), the other shard writes it and ends, then the waiting
    shard sees the end: it must read the file again, not drop the value (every shard gets the same union)."""
    write_plan(tmp_path)
    for i in (1, 2):
        shards.write_json(os.path.join(str(tmp_path), "exchange", "s", f"{i}.json"), {"value": [f"v{i}"]})
    shards.mark_ended(str(tmp_path), 2, 0)
    real = shards.read_json
    missed = []

    def late(path):
        if path.endswith(os.path.join("s", "2.json")) and not missed:
            missed.append(path)  # the first read comes before shard 2 wrote it
            return None
        return real(path)

    monkeypatch.setattr(shards, "read_json", late)
    got = shards.union(["v0"], "s", shards.Shard(0, 3, str(tmp_path), 2.0))
    assert missed and got == ["v0", "v1", "v2"]


# split(): contiguous shards of the nodes in rank order.


def test_split_is_contiguous_in_rank_order_sizes_within_one_and_every_node_once():
    for n in range(1, 40):
        nodes = [f"n{i:03d}" for i in range(n)]
        for per_shard in range(1, 12):
            for max_shards in (1, 2, 3, 7, 100):
                plan = shards.split(nodes, per_shard, max_shards)
                assert [x for s in plan for x in s] == nodes  # contiguous, rank order, every node exactly once
                assert all(plan) and len(plan) <= max_shards
                sizes = [len(s) for s in plan]
                assert max(sizes) - min(sizes) <= 1
                assert len(plan) == min(max_shards, -(-n // per_shard))


def test_split_examples_and_the_cap():
    nodes = [f"n{i}" for i in range(10)]
    assert shards.split(nodes, 4, 8) == [nodes[0:4], nodes[4:7], nodes[7:10]]
    assert shards.split(nodes, 2, 3) == [nodes[0:4], nodes[4:7], nodes[7:10]]  # capped at 3, not 5
    assert shards.split(nodes, 5, 8) == [nodes[0:5], nodes[5:10]]
    assert shards.split(nodes, 1, 100) == [[x] for x in nodes]
    assert shards.split(nodes, 3, 0) == [nodes]  # max_shards below 1 counts as 1
    assert shards.split(iter(nodes), 5, 8) == [nodes[0:5], nodes[5:10]]


def test_split_one_shard_when_per_shard_is_zero_or_the_nodes_fit():
    nodes = [f"n{i}" for i in range(10)]
    assert shards.split(nodes, 0, 8) == [nodes]
    assert shards.split(nodes, -1, 8) == [nodes]
    assert shards.split(nodes, 10, 8) == [nodes]
    assert shards.split(nodes, 128, 8) == [nodes]
    assert shards.split([], 4, 8) == [[]]


# merge(): the union of the shards' values in shard order.


def test_merge_concatenates_lists_in_shard_order_and_skips_none():
    assert shards.merge([["a", "b"], None, ["c"], []]) == ["a", "b", "c"]
    assert shards.merge([[1], [2], [3]]) == [1, 2, 3]
    assert shards.merge([None, ["x"]]) == ["x"]


def test_merge_merges_maps_later_shards_last():
    assert shards.merge([{"n1": 1}, None, {"n3": 3, "n4": 4}]) == {"n1": 1, "n3": 3, "n4": 4}
    assert list(shards.merge([{"b": 1}, {"a": 2}])) == ["b", "a"]
    assert shards.merge([{"k": 1}, {"k": 2}]) == {"k": 2}


def test_merge_of_nothing_is_none():
    assert shards.merge([None, None]) is None
    assert shards.merge([]) is None


def test_merge_refuses_mixed_types_naming_the_step_and_the_types():
    for values in ([["a"], {"b": 1}], [["a"], "b"], [1, 2], [{"a": 1}, None, ["b"]]):
        with pytest.raises(shards.ShardError) as e:
            shards.merge(values, "net-facts")
        assert "step net-facts" in str(e.value)
    with pytest.raises(shards.ShardError, match=r"\(dict, list\)"):
        shards.merge([["a"], {"b": 1}], "s")


# exchange() and union(): K shards as K threads over one shard directory.


def test_every_shard_gets_the_same_union_in_shard_order(tmp_path):
    write_plan(tmp_path)
    out = run_shards(tmp_path, {2: ["n5", "n6"], 0: ["n1", "n2"], 1: ["n3", "n4"]}, "hosts")
    assert out == {i: ["n1", "n2", "n3", "n4", "n5", "n6"] for i in range(3)}
    maps = run_shards(tmp_path, {i: {n: i for n in PLAN[i]} for i in range(3)}, "facts")
    assert all(maps[i] == {"n1": 0, "n2": 0, "n3": 1, "n4": 1, "n5": 2, "n6": 2} for i in range(3))
    assert all(list(maps[i]) == ["n1", "n2", "n3", "n4", "n5", "n6"] for i in range(3))
    # Each shard's value lies in exchange/<step>/<i>.json, written whole (write then rename).
    assert shards.read_json(str(tmp_path / "exchange" / "hosts" / "1.json")) == {"value": ["n3", "n4"]}
    assert sorted(os.listdir(tmp_path / "exchange" / "facts")) == ["0.json", "1.json", "2.json"]
    assert tmp_files(tmp_path) == []


def test_exchange_gives_the_values_by_shard_index(tmp_path):
    write_plan(tmp_path)
    out = run_shards(tmp_path, {0: ["a"], 1: None, 2: {"x": 1}}, "raw",
                     fn=lambda shard, value: shards.exchange(shard, "raw", value))
    assert out == {i: [["a"], None, {"x": 1}] for i in range(3)}


def test_an_ended_shard_adds_nothing_and_blocks_no_one(tmp_path):
    write_plan(tmp_path)
    shards.mark_ended(str(tmp_path), 1, 2, "exited")
    assert shards.ended(shards.Shard(0, 3, str(tmp_path)), 1) == {"rc": 2, "reason": "exited"}
    assert shards.ended(shards.Shard(0, 3, str(tmp_path)), 2) is None
    start = time.monotonic()
    out = run_shards(tmp_path, {0: ["n1", "n2"], 2: ["n5", "n6"]}, "hosts", wait_s=5.0)
    assert time.monotonic() - start < 2.0  # did not wait for shard 1
    assert out == {0: ["n1", "n2", "n5", "n6"], 2: ["n1", "n2", "n5", "n6"]}


def test_a_shard_that_wrote_the_step_before_it_ended_still_counts(tmp_path):
    write_plan(tmp_path)
    shards.write_json(str(tmp_path / "exchange" / "hosts" / "1.json"), {"value": ["n3", "n4"]})
    shards.mark_ended(str(tmp_path), 1, 0, "exited")
    out = run_shards(tmp_path, {0: ["n1", "n2"], 2: ["n5", "n6"]}, "hosts")
    assert out == {0: ["n1", "n2", "n3", "n4", "n5", "n6"], 2: ["n1", "n2", "n3", "n4", "n5", "n6"]}


def test_a_missing_shard_fails_the_step_after_wait_s_naming_it_its_nodes_and_log(tmp_path):
    write_plan(tmp_path)
    start = time.monotonic()
    out = run_shards(tmp_path, {0: ["n1", "n2"], 1: ["n3", "n4"]}, "net-port", wait_s=0.3)
    took = time.monotonic() - start
    assert took >= 0.3, "the step waits wait_s for the missing shard"
    for i in (0, 1):
        assert isinstance(out[i], shards.ShardError)
        msg = str(out[i])
        assert msg.startswith("step net-port: shard 2 (nodes n5..n6, log %s)" % os.path.join(str(tmp_path), "2.log"))
        assert "within 0.3 s" in msg and "TRAINYARD_SHARD_WAIT_S" in msg
        assert "shard 0 " not in msg and "shard 1 " not in msg
    assert tmp_files(tmp_path) == []


def test_every_missing_shard_is_named(tmp_path):
    write_plan(tmp_path, [["n1", "n2"], ["n3"], []])
    with pytest.raises(shards.ShardError) as e:
        shards.union(["n1", "n2"], "alone", shards.Shard(0, 3, str(tmp_path), 0.1))
    msg = str(e.value)
    assert "shard 1 (nodes n3, log %s)" % os.path.join(str(tmp_path), "1.log") in msg
    assert "shard 2 (nodes no nodes, log %s)" % os.path.join(str(tmp_path), "2.log") in msg


@pytest.mark.parametrize("step", ["", "../up", "a/b", "x y", "-lead", ".hidden", "a" * 122, "é"])
def test_a_bad_step_name_is_refused_before_anything_is_written(tmp_path, step):
    with pytest.raises(shards.ShardError, match="step name"):
        shards.union(["n1"], step, shards.Shard(0, 1, str(tmp_path), 0.1))
    assert not (tmp_path / "exchange").exists()


def test_good_step_names_pass(tmp_path):
    for step in ("a", "nccl-check-round-3", "x.who", "A_b.c-9", "a" * 121):
        assert shards.union(["n1"], step, shards.Shard(0, 1, str(tmp_path), 0.1)) == ["n1"]


def test_union_is_the_identity_outside_a_sharded_run(monkeypatch):
    monkeypatch.delenv(shards.ENV_SHARD, raising=False)
    value = {"n1": [1, 2]}
    assert shards.union(value, "anything") is value
    assert shards.union(None, "anything") is None
    assert shards.union(["a"], "not a step name/..") == ["a"]  # nothing is written, nothing is checked


def test_union_reads_the_shard_from_the_environment(tmp_path, monkeypatch):
    write_plan(tmp_path)
    shards.write_json(str(tmp_path / "exchange" / "s" / "0.json"), {"value": ["n1", "n2"]})
    shards.mark_ended(str(tmp_path), 2, 1)
    monkeypatch.setenv(shards.ENV_SHARD, "1/3")
    monkeypatch.setenv(shards.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(shards.ENV_WAIT, "0.3")
    assert shards.union(["n3", "n4"], "s") == ["n1", "n2", "n3", "n4"]


def test_write_json_writes_then_renames(tmp_path):
    path = str(tmp_path / "a" / "b" / "v.json")
    shards.write_json(path, {"value": [1]})
    shards.write_json(path, {"value": [2]})
    assert shards.read_json(path) == {"value": [2]}
    assert os.listdir(tmp_path / "a" / "b") == ["v.json"]
    assert shards.read_json(str(tmp_path / "none.json")) is None


# lead() and once(): what a run does once.


def test_lead_is_the_lowest_shard_that_reaches_the_step(tmp_path, monkeypatch):
    write_plan(tmp_path)
    out = run_shards(tmp_path, {i: None for i in range(3)}, "report",
                     fn=lambda shard, _: shards.lead("report", shard))
    assert out == {0: True, 1: False, 2: False}
    shards.mark_ended(str(tmp_path), 0, 1)
    out = run_shards(tmp_path, {1: None, 2: None}, "report2", fn=lambda shard, _: shards.lead("report2", shard))
    assert out == {1: True, 2: False}
    monkeypatch.delenv(shards.ENV_SHARD, raising=False)
    assert shards.lead("report") is True


def test_once_computes_on_the_leader_and_hands_its_answer_to_every_shard(tmp_path, monkeypatch):
    write_plan(tmp_path)
    calls = []

    def answer(shard, _):
        return shards.once("stamp", lambda: calls.append(shard.index) or {"by": shard.index}, shard)

    out = run_shards(tmp_path, {i: None for i in range(3)}, "stamp", fn=answer)
    assert out == {i: {"by": 0} for i in range(3)} and calls == [0]
    monkeypatch.delenv(shards.ENV_SHARD, raising=False)
    assert shards.once("stamp", lambda: 7) == 7


# local_hosts(): the hosts this process runs.


def test_local_hosts_are_all_hosts_unsharded(monkeypatch):
    monkeypatch.delenv(shards.ENV_SHARD, raising=False)
    assert shards.local_hosts(("n3", "n1", "n2")) == ["n3", "n1", "n2"]


def test_local_hosts_are_the_plans_nodes_of_this_shard_in_the_order_given(tmp_path):
    write_plan(tmp_path)
    shard = shards.Shard(1, 3, str(tmp_path))
    assert shards.local_hosts(["n6", "n4", "n1", "n3", "x"], shard) == ["n4", "n3"]
    assert shards.local_hosts(["n1", "n2"], shard) == []
    assert shards.local_hosts(["n5", "n6"], shards.Shard(2, 3, str(tmp_path))) == ["n5", "n6"]
    assert shard.nodes() == ["n3", "n4"] and shard.nodes(0) == ["n1", "n2"] and shard.nodes(7) == []


def test_local_hosts_without_a_plan_names_the_plan_file(tmp_path):
    with pytest.raises(shards.ShardError) as e:
        shards.local_hosts(["n1"], shards.Shard(1, 3, str(tmp_path)))
    assert "shard 1/3" in str(e.value) and os.path.join(str(tmp_path), shards.PLAN) in str(e.value)


# retire(): a shard with no node left in the node plays (every one left out by the exclusion).


def test_a_node_step_does_not_wait_for_a_retired_shard(tmp_path):
    write_plan(tmp_path)
    shards.retire(shards.Shard(1, 3, str(tmp_path)), "every node of this shard was left out")
    out = run_shards(tmp_path, {0: ["n1", "n2"], 2: ["n5", "n6"]}, "network-facts", wait_s=3.0)
    assert out == {0: ["n1", "n2", "n5", "n6"], 2: ["n1", "n2", "n5", "n6"]}


def test_a_controller_step_waits_for_a_retired_shard_and_counts_its_values(tmp_path):
    write_plan(tmp_path)
    shards.retire(shards.Shard(1, 3, str(tmp_path)), "every node of this shard was left out")
    step = "report-records"
    out = run_shards(tmp_path, {0: {"n1": 1}, 1: {"n3": 3}, 2: {"n5": 5}}, step,
                     fn=lambda shard, v: shards.union(v, step, shard, every_shard=True))
    assert out == {i: {"n1": 1, "n3": 3, "n5": 5} for i in range(3)}
    # Without the retired shard's value a controller step waits for it (here until wait_s, naming it).
    out = run_shards(tmp_path, {0: {"n1": 1}, 2: {"n5": 5}}, "report-plans", wait_s=0.3,
                     fn=lambda shard, v: shards.union(v, "report-plans", shard, every_shard=True))
    assert all(isinstance(out[i], shards.ShardError) and "shard 1 (nodes n3..n4" in str(out[i]) for i in (0, 2))


def test_a_retired_shard_0_still_leads_a_controller_step_for_every_shard(tmp_path):
    write_plan(tmp_path)
    shards.retire(shards.Shard(0, 3, str(tmp_path)), "every node of this shard was left out")
    out = run_shards(tmp_path, {i: None for i in range(3)}, "report-files",
                     fn=lambda shard, _: shards.lead("report-files", shard))
    assert out == {0: True, 1: False, 2: False}


def test_retire_if_none_left_retires_only_a_shard_without_a_kept_node(tmp_path, monkeypatch):
    write_plan(tmp_path)
    kept = {"n1": {}, "n2": {}, "n4": {}}
    assert [shards.retire_if_none_left(kept, shards.Shard(i, 3, str(tmp_path))) for i in range(3)] == [False, False, True]
    assert shards.retired(shards.Shard(0, 3, str(tmp_path)), 2) == {"reason": "every node of this shard was left out"}
    assert shards.retired(shards.Shard(0, 3, str(tmp_path)), 1) is None
    monkeypatch.delenv(shards.ENV_SHARD, raising=False)
    assert shards.retire_if_none_left([]) is False, "unsharded: nothing to retire"


# decide(): whether this process splits (the split play's action and the validate play read the same answer).


def test_decide_splits_above_per_shard_nodes_into_at_most_max_shards(monkeypatch):
    monkeypatch.delenv(shards.ENV_SHARD, raising=False)
    nodes = ["n%d" % i for i in range(1, 7)]
    assert shards.decide(nodes, 2, 2, ["ansible-playbook", "site.yml"]) == ([nodes[:3], nodes[3:]], "")
    plan, why = shards.decide(nodes, 2, 0, ["ansible-playbook", "site.yml"], cores=4)
    assert len(plan) == 2 and why == "", "max_shards 0: half the cores"


def test_decide_keeps_one_process_and_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv(shards.ENV_SHARD, raising=False)
    nodes = ["n%d" % i for i in range(1, 7)]
    plan, why = shards.decide(nodes, 0, 4, ["ansible-playbook"])
    assert plan == [nodes] and why == "6 node(s) in one ansible-playbook process (cluster_shard_nodes 0)"
    plan, why = shards.decide(nodes, 6, 4, ["ansible-playbook"])
    assert plan == [nodes] and "one ansible-playbook process" in why
    plan, why = shards.decide(nodes, 2, 4, ["ansible-playbook", "site.yml", "--limit", "n1"])
    assert len(plan) == 3 and "--limit" in why, "the plan it would have had, and why not"
    env = {shards.ENV_SHARD: "0/2", shards.ENV_DIR: str(tmp_path)}
    assert shards.decide(nodes, 2, 4, ["ansible-playbook"], environ=env)[1].startswith("a shard of a sharded run")
