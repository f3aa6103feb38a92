"""plugin_utils/did_you_mean.py: the one typo hint, and that every message that offers one gets it from there."""

from __future__ import annotations

import pytest

from ansible_collections.trainyard.core.plugins.plugin_utils import did_you_mean as dym


def test_distance_threshold():
    assert dym.max_distance("NCCL_ALGO") == 1 and dym.max_distance("NCCL_SOCKET_IFNAME") == 2
    assert dym.nearest("NCCL_ALGX", ["NCCL_ALGO"]) == "NCCL_ALGO"
    assert dym.nearest("NCCL_AXGX", ["NCCL_ALGO"]) is None
    assert dym.distance("NCLL", "NCCL") == 1


@pytest.mark.parametrize("name,known,hint", [
    ("nccl_debug", ["NCCL_DEBUG", "NCCL_ALGO"], "NCCL_DEBUG"),             # case only
    ("max_clock_skew", ["docker", "max_clock_skew_s"], "max_clock_skew_s"),  # a dropped unit suffix
    ("trainers", ["trainer", "all"], "trainer"),
    ("lora_targte", ["lora_target", "lora_rank"], "lora_target"),        # a transposition
    ("sorce", ["source", "target"], "source"),
    ("dockr", ["auto", "required", "skip"], None),
    ("MYLAB_SEED", ["NCCL_ALGO", "SLURM_JOB_ID"], None),
    ("x", [], None),
])
def test_nearest(name, known, hint):
    assert dym.nearest(name, known) == hint


def test_the_closest_wins_and_ties_go_to_sorted_order():
    assert dym.nearest("abcd", ["abxd", "abcde"]) == "abcde"  # both 1 edit: sorted order
    assert dym.nearest("abcdefghijklmnopq", ["abcdefghijklmnopqxy", "abcdefghijklmnopqx"]) == \
        "abcdefghijklmnopqx"


def test_the_callers_name_the_same_hint():
    from ansible_collections.trainyard.core.plugins.plugin_utils import cluster_model, nccl_vars

    assert nccl_vars.suggest("NCCL_SOCKET_IFNAM") == dym.nearest("NCCL_SOCKET_IFNAM", nccl_vars.KNOWN)
    assert cluster_model._did_you_mean("max_clock_skew", ["docker", "max_clock_skew_s"]) == \
        "did you mean 'max_clock_skew_s'?"
    assert cluster_model._did_you_mean("zzz", ["docker"]) == "no similar name exists"
