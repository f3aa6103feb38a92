"""The action trainyard_shards decides whether a run splits (docs/sharding.md): one process at or below
cluster_shard_nodes, with 0, as a shard itself, with --limit or a password prompt (a warning says why); bad numbers
are refused naming the variables. The split itself (real children) runs in tests/integration/test_sharding.py."""

import sys

import pytest
from ansible.errors import AnsibleActionFail

from helpers import load

TS = load("action_plugins/trainyard_shards.py", "trainyard_shards_action")
NODES = [f"n{i}" for i in range(1, 9)]


def decide(args):
    return object.__new__(TS.ActionModule).decide(dict({"nodes": NODES, "run_dir": "/nonexistent/run",
                                                        "run_id": "r1"}, **args), {})


@pytest.fixture(autouse=True)
def unsharded(monkeypatch):
    monkeypatch.delenv("TRAINYARD_SHARD", raising=False)


@pytest.mark.parametrize("args", [{"per_shard": 0}, {"per_shard": 8}, {"per_shard": 100}, {"per_shard": 2,
                                                                                               "max_shards": 1}])
def test_one_process_at_or_below_the_threshold_or_with_one_shard(args):
    out = decide(args)
    assert out["sharded"] is False and "8 node(s) in one ansible-playbook process" in out["msg"]


def test_a_shard_never_splits_again(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINYARD_SHARD", "0/2")
    monkeypatch.setenv("TRAINYARD_SHARD_DIR", str(tmp_path))
    out = decide({"per_shard": 2, "max_shards": 4})
    assert out["sharded"] is False and "a shard of a sharded run" in out["msg"]


@pytest.mark.parametrize("argv, why", [(["ansible-playbook", "site.yml", "--limit", "n1,n2"], "--limit"),
                                       (["ansible-playbook", "site.yml", "-ln1"], "--limit"),
                                       (["ansible-playbook", "site.yml", "-K"], "-K asks for a password")])
def test_a_limit_or_a_prompt_keeps_one_process_and_says_why(monkeypatch, argv, why):
    monkeypatch.setattr(sys, "argv", argv)
    warned = []
    monkeypatch.setattr(TS.display, "warning", warned.append)
    out = decide({"per_shard": 2, "max_shards": 4})
    assert out["sharded"] is False and why in out["msg"]
    assert len(warned) == 1 and "Not splitting the run over 4 processes" in warned[0] and why in warned[0]


@pytest.mark.parametrize("args", [{"per_shard": "many"}, {"max_shards": "x"}, {"wait_s": None}, {"per_shard": -1},
                                  {"wait_s": 0}])
def test_bad_numbers_are_refused_naming_the_variables(args):
    with pytest.raises(AnsibleActionFail, match="cluster_shard"):
        decide(args)


@pytest.mark.parametrize("args", [{"per_shard": 0}, {"per_shard": 8}])
def test_a_run_the_validate_play_expected_to_split_stops_when_it_does_not(args):
    with pytest.raises(AnsibleActionFail) as e:
        decide(dict(args, expected=True))
    assert "the validate play decided to split this run" in str(e.value) and "Nothing was changed" in str(e.value)
    assert decide(dict(args, expected=False))["sharded"] is False
