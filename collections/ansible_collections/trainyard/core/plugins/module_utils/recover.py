# -*- coding: utf-8 -*-
"""Recover on the surviving nodes: which nodes stay, their new ranks, and which checkpoint shards survive.

Pure functions (stdlib only), used by the action plugin ``recover_plan`` on the controller and by the module
``checkpoint_shards`` on the nodes; unit-tested in tests/unit/module_utils/test_recover.py.

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

from ansible_collections.trainyard.core.plugins.module_utils import jobtree

# DeepSpeed ZeRO shards (stage 1-3; bf16_ prefix for the bf16 optimizer) and model states; the example's shards.
DS_OPTIM_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
DS_MODEL_RE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
EXAMPLE_RE = re.compile(r"^shard-rank(\d+)-of-(\d+)\.pt$")
DS_TAG_RE = re.compile(r"^global_step(\d+)$")
MARKER = "trainer_state.json"
# What a weights-only resume loads from a checkpoint (the HF Trainer's and PEFT's file names): the adapter (LoRA) and
# the model (full or freeze fine-tuning; under ZeRO-3 only with stage3_gather_16bit_weights_on_model_save).
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
ADAPTER_CONFIG = "adapter_config.json"
MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
MODEL_CONFIG = "config.json"
OPTIMIZER_FILE = "optimizer.pt"   # the Trainer's optimizer state without DeepSpeed (one file, any world size)
UNIVERSAL_EXAMPLE = "universal"      # the example's converted checkpoint: <checkpoint>/universal/
UNIVERSAL_DS_SUFFIX = "_universal"   # ds_to_universal output: <checkpoint>/global_stepN_universal/ + latest_universal


class RecoverError(Exception):
    """A condition recover cannot work around; str() is the one-line message for the user."""


# --------------------------------------------------------------------------------------------- survivors
def _reason(reach: dict, failed: dict, host: str) -> str:
    if reach.get(host):
        return "unreachable: %s" % reach[host]
    return "failed preflight: %s" % "; ".join(failed[host])


def _dropped(reach: dict, failed: dict, host: str, rank: int) -> dict:
    """A dropped node: reason (one line), why (unreachable or preflight), detail, checks (the failed ones)."""
    unreachable = bool(reach.get(host))
    return {"host": host, "reason": _reason(reach, failed, host), "old_rank": rank,
            "why": "unreachable" if unreachable else "preflight",
            "detail": reach[host] if unreachable else "; ".join(failed[host]),
            "checks": [] if unreachable else [c.split(":", 1)[0].strip() for c in failed[host]]}


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
    dropped = [_dropped(unreachable, failed, h, i) for i, h in enumerate(hosts) if h in unreachable or h in failed]
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
        # preflight_check stamps every record with "run" (the fact cache may keep an earlier run's records).
        seen = r.get("run") or r.get("run_id")
        if run_id and seen and seen != run_id:
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


def _kind(fd, relpath):
    """'file', 'dir' or 'other' of fd/relpath, every directory on the way opened without following a link (a
    symlink anywhere is 'other' or None); None when absent (module_utils/jobtree.py)."""
    parts = relpath.split("/")
    try:
        dfd = jobtree.open_dir(fd, "/".join(parts[:-1]) or ".")
    except OSError:
        return None
    try:
        st = jobtree.stat_at(dfd, parts[-1])
    except OSError:
        return None
    finally:
        os.close(dfd)
    return jobtree.kind_of(st) if st is not None else None


# trainer_state.json holds the log history of the run: far below this; a larger one is not read for its world size.
STATE_MAX_BYTES = 64 << 20


def list_shards(checkpoint):
    """What one checkpoint directory holds: {format, ranks: [..], world_size, tag, files: {rank: [relative path]},
    complete (marker present), universal (already converted)}. Reads names only, never a file's content except
    the small trainer_state.json for the world size the example records. The job writes this tree and root reads
    it: everything through jobtree (no link followed, only regular files and directories, listings capped)."""
    out = {"path": checkpoint, "format": "", "ranks": [], "world_size": None, "tag": "", "files": {},
           "complete": False, "universal": False,
           "weights": {"adapter": False, "model": False, "optimizer": False}}
    try:
        fd = jobtree.open_root(checkpoint)
    except OSError:
        return out
    try:
        _list_shards(fd, out)
    finally:
        os.close(fd)
    return out


def _list_shards(fd, out):
    out["complete"] = _kind(fd, MARKER) == "file"
    plain = lambda names: any(_kind(fd, n) == "file" for n in names)  # noqa: E731
    out["weights"] = {"adapter": plain(ADAPTER_FILES) and plain([ADAPTER_CONFIG]),
                      "model": plain(MODEL_FILES) and plain([MODEL_CONFIG]), "optimizer": plain([OPTIMIZER_FILE])}
    try:
        entries = jobtree.listdir(fd)
    except OSError:
        return
    dirs = [n for n, kind in entries if kind == "dir" and DS_TAG_RE.match(n)]
    # The job writes these directories and root copies the shards between nodes: a symlink (or anything but a
    # plain file) is not a shard, so root never reads through it.
    where = [("", n) for n, kind in entries if kind == "file"]
    if dirs:
        tag = max(dirs, key=lambda n: int(DS_TAG_RE.match(n).group(1)))
        out["tag"] = tag
        try:
            where += [(tag + "/", n) for n, kind in jobtree.listdir(fd, tag) if kind == "file"]
        except OSError:
            pass
        out["universal"] = _kind(fd, tag + UNIVERSAL_DS_SUFFIX) == "dir"
    else:
        out["universal"] = _kind(fd, UNIVERSAL_EXAMPLE + "/" + MARKER) == "file"
    for prefix, name in where:
        found = shard_ranks(name)
        if not found:
            continue
        fmt, rank, world = found
        out["format"] = out["format"] or fmt
        out["files"].setdefault(rank, []).append(prefix + name)
        if world:
            out["world_size"] = world
    out["ranks"] = sorted(out["files"])
    if out["world_size"] is None and out["complete"]:
        try:
            state = jobtree.read_json(fd, MARKER, STATE_MAX_BYTES, expect={"world_size": int})
            if isinstance(state.get("world_size"), int):
                out["world_size"] = state["world_size"]
        except (OSError, ValueError):  # jobtree.BadRecord is both: torn, too deep, wrong types
            pass


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


# --------------------------------------------------------------------------------------------- resume
def weights_resume(profile, finetuning_type, name, listings, survivors, output_roots):
    """What a weights-only resume (launch_recover_resume: weights, chosen by the user) loads on every survivor.

    profile: train_args_profile; finetuning_type: train_args_finetuning_type (LLaMA-Factory); name: the
    checkpoint's directory name ("" when there is none); listings: {host: checkpoint_shards result};
    output_roots: {host: cluster_output_root}. Returns {key, paths: {host: checkpoint path}, detail}: key is the
    LLaMA-Factory option that loads the weights (adapter_name_or_path for LoRA, model_name_or_path for full and
    freeze), "" for the generic profile (its entry point reads TRAINYARD_RESUME_MODE). Raises RecoverError naming
    the node when a survivor's copy of the checkpoint lacks the weights.
    """
    if not name:
        return {"key": "", "paths": {}, "detail": "no complete checkpoint: the job starts from step 0"}
    paths = {h: "%s/%s" % (str(output_roots[h]).rstrip("/"), name) for h in survivors}
    if profile != "llamafactory":
        return {"key": "", "paths": paths,
                "detail": "weights only (TRAINYARD_RESUME_MODE=weights: the entry point loads the model and adapter "
                          "weights); the optimizer starts fresh"}
    lora = finetuning_type == "lora"
    kind, key = ("adapter", "adapter_name_or_path") if lora else ("model", "model_name_or_path")
    lacking = [h for h in survivors
               if (listings.get(h) or {}).get("name") != name
               or not ((listings.get(h) or {}).get("shards") or {}).get("weights", {}).get(kind)]
    if lacking:
        what = ("%s with %s" % (ADAPTER_FILES[0], ADAPTER_CONFIG) if lora else
                "%s with %s; under ZeRO-3 the Trainer saves it only with stage3_gather_16bit_weights_on_model_save "
                "(deepspeed_config_gather_16bit_weights_on_model_save: true)" % (MODEL_FILES[0], MODEL_CONFIG))
        raise RecoverError(
            "Cannot resume weights-only from %s: %s hold(s) no %s in it (%s). Fix: save the weights on every node "
            "(train_args_save_on_each_node: true) or keep cluster_output_root on shared storage; or resume with the "
            "optimizer state (launch_recover_resume: full)"
            % (name, ", ".join("%s (%s)" % (h, paths[h]) for h in lacking), kind, what))
    return {"key": key, "paths": paths,
            "detail": "weights only: %s=%s; the optimizer, the scheduler and the step counter start fresh"
                      % (key, paths[survivors[0]])}


def full_resume_problem(profile, listing):
    """The one-line refusal when the user asked for the optimizer state (launch_recover_resume: full) and the
    LLaMA-Factory checkpoint holds none to resume or convert: no ZeRO shards (global_stepN/) and no optimizer.pt
    (saved with save_only_model). "" when it can be resumed; the generic profile's entry point decides itself."""
    listing = listing or {}
    shards = listing.get("shards") or {}
    if (profile != "llamafactory" or not listing.get("checkpoint") or shards.get("format")
            or (shards.get("weights") or {}).get("optimizer")):
        return ""
    return ("Cannot resume %s with its optimizer state: it holds none (no DeepSpeed shards in global_stepN/, no %s; "
            "saved with save_only_model?), so there is nothing to convert. Fix: resume from its weights alone, "
            "explicitly: -e launch_recover_resume=weights (the optimizer starts fresh)"
            % (listing["checkpoint"], OPTIMIZER_FILE))


def report_section(plan, mode, checkpoint="", converted=False, saved_world=0, weights=None, fmt=""):
    """The report's and health page's "recover" section, from recover_plan's result and the resume decided.

    Returns {summary, dropped: [{host, old_rank, why, detail, checks}], ranks: [{host, node_rank, old_rank, head}],
    head, old_head, head_moved, world_size_before, world_size, checkpoint, resume: {mode, how, optimizer, key,
    path, converted}}.
    """
    plan = plan or {}
    old = plan.get("old_rank_map") or {}
    head = plan.get("head", "")
    ranks = [{"host": h, "node_rank": r, "old_rank": old.get(h), "head": h == head}
             for h, r in sorted((plan.get("rank_map") or {}).items(), key=lambda x: x[1])]
    dropped = [{"host": d.get("host"), "old_rank": d.get("old_rank"),
                "why": d.get("why") or ("unreachable" if str(d.get("reason", "")).startswith("unreachable")
                                        else "preflight"),
                "detail": d.get("detail") or d.get("reason", ""), "checks": list(d.get("checks") or [])}
               for d in plan.get("dropped") or []]
    weights = weights or {}
    before, after = plan.get("world_size_before"), plan.get("world_size")
    if not checkpoint:
        how, optimizer = "no complete checkpoint on %s: the job starts from step 0" % head, ""
    elif mode == "weights":
        how, optimizer = weights.get("detail") or "weights only; the optimizer starts fresh", "fresh"
    elif converted:
        out = "universal/" if fmt == "example" else "global_stepN_universal/"
        how = ("universal conversion from world size %s to %s (%s: model, adapter and optimizer state)"
               % (saved_world, after, out))
        optimizer = "kept"
    else:
        how = ("as saved (world size %s unchanged)" % after if fmt
               else "as saved (no per-rank shards: loads at any world size)")
        optimizer = "kept"
    return {"summary": plan.get("summary", ""), "dropped": dropped, "ranks": ranks, "head": head,
            "old_head": plan.get("old_head", ""), "head_moved": bool(plan.get("head_moved")),
            "world_size_before": before, "world_size": after, "checkpoint": checkpoint,
            "resume": {"mode": mode, "how": how, "optimizer": optimizer, "converted": bool(converted),
                       "key": weights.get("key", "") if mode == "weights" else "",
                       "path": (weights.get("paths") or {}).get(head, checkpoint) if mode == "weights" else checkpoint}}
