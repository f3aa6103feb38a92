# -*- coding: utf-8 -*-
"""Recover on the surviving nodes: which nodes stay, their new ranks, and which checkpoint shards survive.

Pure functions (stdlib only), used by the action plugin ``recover_plan`` on the controller and by the module
``checkpoint_shards`` on the nodes; unit-tested in tests/unit/test_recover.py.

* ``plan_survivors`` drops the unreachable nodes and those that failed a preflight check, never more than
  ``cluster_min_nodes`` allows, keeps the survivors in their old rank order with contiguous ranks (the head
  moves to the first survivor when the old head is lost) and returns the new cluster model of every survivor.
* ``shard_ranks`` reads the rank of a checkpoint shard from its file name (DeepSpeed ZeRO and the bundled
  example's ``shard-rank<R>-of-<W>.pt``); ``list_shards`` lists them in one checkpoint directory;
  ``shard_coverage`` says which ranks' shards no surviving node holds and where each one can be copied from.

Every message is one line that names the node, the value and the fix.
"""

from __future__ import annotations

import os
import re

# DeepSpeed ZeRO shards (stage 1-3; bf16_ prefix for the bf16 optimizer) and model states; the example's shards.
DS_OPTIM_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
DS_MODEL_RE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
EXAMPLE_RE = re.compile(r"^shard-rank(\d+)-of-(\d+)\.pt$")
DS_TAG_RE = re.compile(r"^global_step(\d+)$")
MARKER = "trainer_state.json"
UNIVERSAL_EXAMPLE = "universal"      # the example's converted checkpoint: <checkpoint>/universal/
UNIVERSAL_DS_SUFFIX = "_universal"   # ds_to_universal output: <checkpoint>/global_stepN_universal/ + latest_universal
RESUME_MODES = ("full", "weights")


class RecoverError(Exception):
    """A condition recover cannot work around; str() is the one-line message for the user."""


# --------------------------------------------------------------------------------------------- survivors
def _reason(reach: dict, failed: dict, host: str) -> str:
    if reach.get(host):
        return "unreachable: %s" % reach[host]
    return "failed preflight: %s" % "; ".join(failed[host])


def _short(why):
    """The cause of an unreachable result without Ansible's wrapping ("ssh: connect to host ...: timed out")."""
    text = str(why or "no answer").strip()
    if "ssh: " in text:
        text = text[text.rindex("ssh: "):]
    return text.replace("Task failed: ", "")[:200]


def plan_survivors(hosts_by_rank, unreachable=None, failed=None, min_nodes=1, nproc_per_node=1, master_port=39500,
                   data_addresses=None, master_addr=""):
    """The new cluster model after dropping unreachable and failing nodes.

    hosts_by_rank: the inventory's trainers, rank 0 first (the full-size cluster model).
    unreachable: {host: why} of nodes that did not answer; failed: {host: [check: detail, ...]} of nodes with a
    failed preflight check (a node in both is dropped once, as unreachable).
    min_nodes: the fewest nodes the job may run on (cluster_min_nodes).
    data_addresses: {host: data-plane address}; master_addr: cluster_master_addr when the user set it (kept only
    while its head survives; the new head's data address otherwise).
    Raises RecoverError when fewer than min_nodes survive or min_nodes is out of range.
    """
    hosts = list(hosts_by_rank)
    unreachable = {h: _short(v) for h, v in (unreachable or {}).items() if h in hosts}
    failed = {h: [str(x) for x in (v or [])] or ["a check failed"] for h, v in (failed or {}).items()
              if h in hosts and h not in unreachable}
    data_addresses = dict(data_addresses or {})
    if isinstance(min_nodes, bool) or not isinstance(min_nodes, int) or not 1 <= min_nodes <= len(hosts):
        raise RecoverError("Stop if cluster_min_nodes is outside 1..%d (cluster_min_nodes = %r). Fix: set it to "
                           "the fewest nodes the job may run on, at most the %d trainers of the inventory"
                           % (len(hosts), min_nodes, len(hosts)))
    dropped = [{"host": h, "reason": _reason(unreachable, failed, h), "old_rank": i}
               for i, h in enumerate(hosts) if h in unreachable or h in failed]
    survivors = [h for h in hosts if h not in unreachable and h not in failed]
    if len(survivors) < min_nodes:
        why = ", ".join("%s (%s)" % (d["host"], d["reason"]) for d in dropped)
        raise RecoverError(
            "Not recovering: %d of %d nodes are healthy and cluster_min_nodes is %d; dropped would be %s. Fix: "
            "bring those nodes back (or replace them in the inventory) and rerun, or lower cluster_min_nodes "
            "(-e cluster_min_nodes=%d) to run on fewer nodes" % (len(survivors), len(hosts), min_nodes, why,
                                                                max(len(survivors), 1)))
    old_head = hosts[0]
    head = survivors[0]
    master = str(master_addr or "").strip() if head == old_head else ""
    master = master or str(data_addresses.get(head) or head)
    nnodes = len(survivors)
    nproc = int(nproc_per_node)
    models = {h: {"node_rank": i, "nnodes": nnodes, "nproc_per_node": nproc, "world_size": nnodes * nproc,
                  "head": head, "master_addr": master, "master_port": int(master_port),
                  "hosts_by_rank": list(survivors), "data_address": str(data_addresses.get(h) or h)}
              for i, h in enumerate(survivors)}
    rank_map = {h: i for i, h in enumerate(survivors)}
    summary = ("all %d nodes healthy: full size, world size %d" % (nnodes, nnodes * nproc) if not dropped else
               "recovering on %d of %d nodes (world size %d -> %d); dropped %s; ranks %s; head %s%s"
               % (nnodes, len(hosts), len(hosts) * nproc, nnodes * nproc,
                  ", ".join("%s (%s)" % (d["host"], d["reason"]) for d in dropped),
                  ", ".join("%s=%d" % (h, r) for h, r in rank_map.items()), head,
                  " (moved from %s)" % old_head if head != old_head else ""))
    return {"survivors": survivors, "dropped": dropped, "models": models, "head": head, "old_head": old_head,
            "head_moved": head != old_head, "rank_map": rank_map,
            "old_rank_map": {h: i for i, h in enumerate(hosts)}, "nnodes_before": len(hosts), "nnodes": nnodes,
            "world_size_before": len(hosts) * nproc, "world_size": nnodes * nproc, "summary": summary}


def failed_checks(records, run_id=""):
    """[check: detail] of the failed preflight records of this run (records of an earlier run are ignored)."""
    out = []
    for r in records or []:
        if not isinstance(r, dict) or r.get("status") != "fail":
            continue
        if run_id and r.get("run_id") and r.get("run_id") != run_id:
            continue
        detail = str(r.get("detail") or "").strip().splitlines()
        out.append("%s: %s" % (r.get("check", "?"), detail[0][:160] if detail else "failed"))
    return out


# --------------------------------------------------------------------------------------------- shards
def shard_ranks(name):
    """(format, rank, world or None) of a shard file name, or None. DeepSpeed model-state files count too."""
    m = EXAMPLE_RE.match(name)
    if m:
        return ("example", int(m.group(1)), int(m.group(2)))
    m = DS_OPTIM_RE.match(name) or DS_MODEL_RE.match(name)
    if m:
        return ("deepspeed", int(m.group(1)), None)
    return None


def _plain_file(root, relpath):
    """True when every component of root/relpath below root is a real directory or, last, a regular file."""
    import stat
    path = root
    parts = relpath.split("/")
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except OSError:
            return False
        want = stat.S_ISREG if i == len(parts) - 1 else stat.S_ISDIR
        if not want(st.st_mode):
            return False
    return True


def list_shards(checkpoint):
    """What one checkpoint directory holds: {format, ranks: [..], world_size, tag, files: {rank: [relative path]},
    complete (marker present), universal (already converted)}. Reads names only, never a file's content except
    the small trainer_state.json for the world size the example records."""
    out = {"path": checkpoint, "format": "", "ranks": [], "world_size": None, "tag": "", "files": {},
           "complete": os.path.isfile(os.path.join(checkpoint, MARKER)), "universal": False}
    if not os.path.isdir(checkpoint):
        return out
    names = sorted(os.listdir(checkpoint))
    dirs = [n for n in names if DS_TAG_RE.match(n) and os.path.isdir(os.path.join(checkpoint, n))]
    where = [("", n) for n in names]
    if dirs:
        tag = max(dirs, key=lambda n: int(DS_TAG_RE.match(n).group(1)))
        out["tag"] = tag
        where += [(tag + "/", n) for n in sorted(os.listdir(os.path.join(checkpoint, tag)))]
        out["universal"] = os.path.isdir(os.path.join(checkpoint, tag + UNIVERSAL_DS_SUFFIX))
    else:
        out["universal"] = os.path.isfile(os.path.join(checkpoint, UNIVERSAL_EXAMPLE, MARKER))
    for prefix, name in where:
        found = shard_ranks(name)
        # The job writes these directories and root copies the shards between nodes: a symlink (or anything but a
        # plain file, or one inside a symlinked tag directory) is not a shard, so root never reads through it.
        if not found or not _plain_file(checkpoint, prefix + name):
            continue
        fmt, rank, world = found
        out["format"] = out["format"] or fmt
        out["files"].setdefault(rank, []).append(prefix + name)
        if world:
            out["world_size"] = world
    out["ranks"] = sorted(out["files"])
    if out["world_size"] is None and out["complete"]:
        try:
            import json
            with open(os.path.join(checkpoint, MARKER)) as f:
                state = json.load(f)
            if isinstance(state.get("world_size"), int):
                out["world_size"] = state["world_size"]
        except (OSError, ValueError, AttributeError):
            pass
    return out


def shard_coverage(found, world_size, head, prefer=()):
    """Which ranks' shards are on no reachable node, and where to copy the others from.

    found: {host: [ranks whose shard files it holds]}; world_size: the ranks the checkpoint was saved by;
    head: the node that converts (it gets every shard); prefer: hosts to copy from first (the survivors).
    Returns {missing: [ranks], copy: [{rank, src}] (shards the head lacks), on_head: [ranks]}.
    """
    world_size = int(world_size)
    on_head = sorted(r for r in found.get(head, []) if 0 <= r < world_size)
    order = [h for h in prefer if h in found and h != head] + sorted(h for h in found if h != head
                                                                     and h not in prefer)
    copy, missing = [], []
    for rank in range(world_size):
        if rank in on_head:
            continue
        src = next((h for h in order if rank in found.get(h, [])), None)
        if src is None:
            missing.append(rank)
        else:
            copy.append({"rank": rank, "src": src})
    return {"missing": missing, "copy": copy, "on_head": on_head}


def missing_message(checkpoint, missing, world_size, old_rank_hosts, nproc_per_node=1):
    """The one-line failure when shards are lost: which ranks, which node held them, and the three ways on."""
    nproc = max(int(nproc_per_node), 1)
    holders = sorted({old_rank_hosts[r // nproc] for r in missing if r // nproc < len(old_rank_hosts)})
    return ("Cannot convert %s for the smaller world size: the shards of rank(s) %s of %d are on no reachable node "
            "(they were saved on %s). Fix: bring %s back and rerun recover; or resume weights-only (model and adapter "
            "weights, fresh optimizer: -e launch_recover_resume=weights); or keep the shards on shared storage or a second "
            "node (docs/recover.md)" % (checkpoint, ", ".join(map(str, missing)), int(world_size),
                                         ", ".join(holders) or "the lost node(s)", " and ".join(holders) or "them"))
