"""The filters of a sharded run (filter_plugins/shard_filters.py): the identity outside one, the exchange through
real files under tmp_path inside one (TRAINYARD_SHARD / TRAINYARD_SHARD_DIR), and a malformed TRAINYARD_SHARD as a
filter error."""

import os

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.trainyard.core.plugins.plugin_utils import shards
from helpers import load

sf = load("filter_plugins/shard_filters.py", "shard_filters")
F = sf.FilterModule().filters()
PLAN = [["n1", "n2"], ["n3", "n4"]]


@pytest.fixture
def unsharded(monkeypatch):
    for name in (shards.ENV_SHARD, shards.ENV_DIR, shards.ENV_WAIT):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def shard_of(tmp_path, monkeypatch):
    """This process as shard index of a 2-shard run whose directory (with its plan) is tmp_path."""
    shards.write_json(os.path.join(str(tmp_path), shards.PLAN), {"shards": PLAN})

    def as_shard(index, count=2):
        monkeypatch.setenv(shards.ENV_SHARD, "%d/%d" % (index, count))
        monkeypatch.setenv(shards.ENV_DIR, str(tmp_path))
        monkeypatch.setenv(shards.ENV_WAIT, "0.3")
        return str(tmp_path)

    return as_shard


def test_the_filters_are_registered():
    assert {"trainyard_shard_union", "trainyard_shard_hosts", "trainyard_shard_leader"} <= set(F)
    assert F["trainyard_shard_union"] is sf.shard_union and F["trainyard_shard_hosts"] is sf.shard_hosts
    assert F["trainyard_shard_leader"] is sf.shard_leader


def test_unsharded_every_filter_is_the_identity(unsharded, tmp_path):
    value = {"n1": {"port": 1}}
    assert F["trainyard_shard_union"](value, "network-port") is value
    assert F["trainyard_shard_union"](["n2", "n1"], "hosts") == ["n2", "n1"]
    assert F["trainyard_shard_hosts"](["n3", "n1", "n2"]) == ["n3", "n1", "n2"]
    assert F["trainyard_shard_leader"]("report") is True
    assert F["trainyard_sharded"]() is False
    assert not os.listdir(tmp_path)


def test_sharded_union_is_every_shards_value_in_shard_order(shard_of):
    root = shard_of(1)
    shards.write_json(os.path.join(root, "exchange", "hosts", "0.json"), {"value": ["n1", "n2"]})
    assert F["trainyard_shard_union"](["n3", "n4"], "hosts") == ["n1", "n2", "n3", "n4"]
    assert shards.read_json(os.path.join(root, "exchange", "hosts", "1.json")) == {"value": ["n3", "n4"]}
    root = shard_of(0)
    shards.write_json(os.path.join(root, "exchange", "facts", "1.json"), {"value": {"n3": 3}})
    assert F["trainyard_shard_union"]({"n1": 1}, "facts") == {"n1": 1, "n3": 3}
    assert F["trainyard_sharded"]() is True


def test_sharded_union_skips_an_ended_shard(shard_of):
    root = shard_of(0)
    shards.mark_ended(root, 1, 2, "exited")
    assert F["trainyard_shard_union"](["n1", "n2"], "hosts") == ["n1", "n2"]


def test_sharded_union_failures_are_filter_errors(shard_of):
    root = shard_of(0)
    with pytest.raises(AnsibleFilterError) as e:
        F["trainyard_shard_union"](["n1", "n2"], "hosts")
    assert "shard 1 (nodes n3..n4, log %s)" % os.path.join(root, "1.log") in str(e.value)
    with pytest.raises(AnsibleFilterError, match="step name"):
        F["trainyard_shard_union"](["n1"], "no/slash")
    shards.write_json(os.path.join(root, "exchange", "mixed", "1.json"), {"value": {"n3": 3}})
    with pytest.raises(AnsibleFilterError, match="step mixed"):
        F["trainyard_shard_union"](["n1"], "mixed")


def test_sharded_hosts_are_this_shards_nodes_in_the_order_given(shard_of):
    shard_of(1)
    assert F["trainyard_shard_hosts"](["n4", "n1", "n3", "n2"]) == ["n4", "n3"]
    shard_of(0)
    assert F["trainyard_shard_hosts"](["n4", "n1", "n3", "n2"]) == ["n1", "n2"]


def test_sharded_hosts_without_a_plan_is_a_filter_error(tmp_path, monkeypatch):
    monkeypatch.setenv(shards.ENV_SHARD, "0/2")
    monkeypatch.setenv(shards.ENV_DIR, str(tmp_path))
    with pytest.raises(AnsibleFilterError, match="shard plan"):
        F["trainyard_shard_hosts"](["n1"])


def test_sharded_leader_is_the_lowest_shard_that_reaches_the_step(shard_of):
    root = shard_of(0)
    shards.write_json(os.path.join(root, "exchange", "report.who", "1.json"), {"value": [1]})
    assert F["trainyard_shard_leader"]("report") is True
    shard_of(1)
    assert F["trainyard_shard_leader"]("report") is False
    shards.mark_ended(root, 0, 1, "exited")
    assert F["trainyard_shard_leader"]("summary") is True


@pytest.mark.parametrize("spec", ["3/3", "x/2", "1/0"])
def test_a_malformed_shard_is_a_filter_error(tmp_path, monkeypatch, spec):
    monkeypatch.setenv(shards.ENV_SHARD, spec)
    monkeypatch.setenv(shards.ENV_DIR, str(tmp_path))
    for call in (lambda: F["trainyard_shard_union"](["n1"], "hosts"), lambda: F["trainyard_shard_hosts"](["n1"]),
                 lambda: F["trainyard_shard_leader"]("report"), lambda: F["trainyard_sharded"]()):
        with pytest.raises(AnsibleFilterError) as e:
            call()
        assert "TRAINYARD_SHARD=%r" % spec in str(e.value)
    assert not os.listdir(tmp_path)


def test_a_shard_without_its_directory_or_a_bad_wait_is_a_filter_error(tmp_path, monkeypatch):
    monkeypatch.setenv(shards.ENV_SHARD, "0/2")
    monkeypatch.delenv(shards.ENV_DIR, raising=False)
    with pytest.raises(AnsibleFilterError, match="TRAINYARD_SHARD_DIR"):
        F["trainyard_shard_union"](["n1"], "hosts")
    monkeypatch.setenv(shards.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(shards.ENV_WAIT, "later")
    with pytest.raises(AnsibleFilterError, match="TRAINYARD_SHARD_WAIT_S='later'"):
        F["trainyard_shard_hosts"](["n1"])


def test_shard_splits_is_the_split_plays_decision(unsharded, shard_of, monkeypatch):
    nodes = ["n%d" % i for i in range(1, 5)]
    monkeypatch.setattr("sys.argv", ["ansible-playbook", "site.yml"])
    assert F["trainyard_shard_splits"](nodes, 2, 2) is True
    assert F["trainyard_shard_splits"](nodes, "2", "2") is True, "inventory values may be strings"
    assert F["trainyard_shard_splits"](nodes, 0, 2) is False
    assert F["trainyard_shard_splits"](nodes, "x", 2) is False, "a bad value: the validate play names it"
    monkeypatch.setattr("sys.argv", ["ansible-playbook", "site.yml", "-l", "n1"])
    assert F["trainyard_shard_splits"](nodes, 2, 2) is False
    monkeypatch.setattr("sys.argv", ["ansible-playbook", "site.yml"])
    shard_of(0)
    assert F["trainyard_shard_splits"](nodes, 2, 2) is False, "a child never splits again"
