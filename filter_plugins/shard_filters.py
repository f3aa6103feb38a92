"""Filters of a run split over several ansible-playbook processes (docs/sharding.md, plugin_utils/shards.py).

Outside a sharded run each one is the identity (every host, the value unchanged, the leader): a one-process run
reads hostvars as before.
"""

from __future__ import annotations

import sys

from ansible.errors import AnsibleFilterError
from ansible_collections.trainyard.core.plugins.plugin_utils import shards


def _shard():
    try:
        return shards.current()
    except shards.ShardError as e:
        raise AnsibleFilterError(str(e)) from None


def shard_union(value, step, every_shard=False):
    """A cross-node step's values of this shard's nodes (a list in rank order, or a map by node) -> every shard's,
    in rank order. Give each call site its own step name (a loop: the item in the name). every_shard: a step of a
    play on the controller (every child runs it, a retired shard too, plugin_utils/shards.py exchange)."""
    try:
        return shards.union(value, step, _shard(), every_shard=bool(every_shard))
    except shards.ShardError as e:
        raise AnsibleFilterError(str(e)) from None


def shard_hosts(hosts):
    """The hosts this process runs (its shard's) among hosts, in their order."""
    try:
        return shards.local_hosts(hosts, _shard())
    except shards.ShardError as e:
        raise AnsibleFilterError(str(e)) from None


def shard_splits(nodes, per_shard, max_shards):
    """Whether this process will split nodes over child processes (plugin_utils/shards.py decide): the split play of
    site.yml decides the same way later, from the same values."""
    try:
        return not shards.decide(list(nodes), int(per_shard), int(max_shards), sys.argv)[1]
    except (TypeError, ValueError):
        return False  # the validate play names the bad value; the split play stops on it


def shard_active(_=None):
    """Whether this process is one shard of a sharded run."""
    return _shard() is not None


def shard_leader(step):
    """Whether this process does what a run does once at step (the lowest-index shard that reaches it, or the one
    process of an unsharded run). Give each call site its own step name."""
    try:
        return shards.lead(step, _shard())
    except shards.ShardError as e:
        raise AnsibleFilterError(str(e)) from None


class FilterModule:
    def filters(self):
        return {"trainyard_shard_union": shard_union, "trainyard_shard_hosts": shard_hosts,
                "trainyard_shard_leader": shard_leader, "trainyard_sharded": shard_active,
                "trainyard_shard_splits": shard_splits}
