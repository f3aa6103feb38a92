# -*- coding: utf-8 -*-
"""Filters of playbooks/recover.yml: which checkpoint shards survive and what to copy (module_utils/recover.py), how
the new head converts the checkpoint, what the survivors resume from and recover.json (plugin_utils/recover_convert.py)."""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.module_utils import recover as rc
from ansible_collections.trainyard.core.plugins.plugin_utils import recover_convert


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


def shard_sources(plan):
    """[{src, files}] of the files to copy onto the head, one item per node they are copied from (one pack each)."""
    out = {}
    for c in (plan or {}).get("copy", []):
        out.setdefault(c["src"], []).extend(f for f in c["files"] if f not in out.get(c["src"], []))
    return [{"src": src, "files": files} for src, files in out.items()]


def recover_weights(listings, profile, finetuning_type, name, survivors, output_roots):
    """module_utils/recover.py weights_resume as a filter; {failed: true, msg} instead of raising, for an assert."""
    try:
        return dict(rc.weights_resume(profile, finetuning_type, name, dict(listings or {}), list(survivors),
                                      dict(output_roots or {})), failed=False, msg="")
    except rc.RecoverError as exc:
        return {"key": "", "paths": {}, "detail": "", "failed": True, "msg": str(exc)}


class FilterModule:
    def filters(self):
        return {"trainyard_shard_plan": shard_plan, "trainyard_shard_sources": shard_sources,
                "trainyard_recover_weights": recover_weights,
                "trainyard_recover_full_problem": rc.full_resume_problem,
                "trainyard_recover_section": rc.report_section,
                "trainyard_recover_convert_command": recover_convert.convert_command,
                "trainyard_recover_resume_line": recover_convert.resume_line,
                "trainyard_recover_record": recover_convert.recover_record}
