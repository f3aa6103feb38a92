# -*- coding: utf-8 -*-
"""Filters of playbooks/recover.yml: which checkpoint shards survive and what to copy (module_utils/recover.py)."""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.module_utils import recover as rc


def shard_plan(listings, head, name, world_size, prefer=(), old_hosts=(), nproc_per_node=1):
    """listings: {host: checkpoint_shards result}. Only the nodes that hold the head's checkpoint (same name)
    count. Returns {missing, copy: [{rank, src, files}], on_head, world_size, message}."""
    same = {h: r for h, r in (listings or {}).items()
            if isinstance(r, dict) and r.get("name") == name and r.get("checkpoint")}
    found = {h: [int(x) for x in (r.get("shards") or {}).get("ranks", [])] for h, r in same.items()}
    # The world size that saved it: the caller's (read from the checkpoint itself), else the one the example
    # records in its shard names. Never guessed from the ranks found: a lost node's ranks would go unnoticed.
    world = int(world_size or (same.get(head, {}).get("shards") or {}).get("world_size") or 0)
    cov = rc.shard_coverage(found, world, head, list(prefer))
    for item in cov["copy"]:
        files = (same[item["src"]].get("shards") or {}).get("files") or {}
        item["files"] = list(files.get(str(item["rank"])) or files.get(item["rank"]) or [])
    cov["world_size"] = world
    cov["message"] = (rc.missing_message(same.get(head, {}).get("checkpoint") or name, cov["missing"], world,
                                         list(old_hosts), nproc_per_node) if cov["missing"] else "")
    return cov


def shard_copies(plan):
    """[{src, file}] of every file to copy onto the head, one item per file."""
    return [{"src": c["src"], "file": f, "rank": c["rank"]} for c in (plan or {}).get("copy", []) for f in c["files"]]


class FilterModule:
    def filters(self):
        return {"trainyard_shard_plan": shard_plan, "trainyard_shard_copies": shard_copies}
