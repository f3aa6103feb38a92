#!/usr/bin/python
# -*- coding: utf-8 -*-
# trainyard: the controller's half of playbooks/collect.yml: store every node's evidence and conclude from it.
from __future__ import annotations

DOCUMENTATION = r"""
module: collect_bundle
short_description: Store the nodes' job evidence under runs/<id>/ and say what went wrong, naming node, rank and fix
description:
  - Runs on the controller. Writes each node's files (results of M(job_collect)) into C(<run_dir>/nodes/<host>/).
  - Runs PyTorch's own flight-recorder analyzer (C(python -m torch.distributed.flight_recorder.fr_trace)) on every
    rank's dump and names the rank(s) that never joined a collective, the collective, its sequence number and
    sizes. Dumps are loaded with a restricted unpickler (plain data only) and written again before the analyzer
    reads them, so a dump the job could have tampered with never runs code on the controller.
  - Names the first failing rank from the torchrun logs, Xid / ECC / slowdown findings per GPU and rank, OOM kills
    and segfaults, stragglers (per-rank compute time of the progress files) and the nodes that could not be
    reached. Writes C(collect.json) and C(collect.md); returns the summary for the health page's job section.
options:
  run_dir: {description: The run directory (created)., type: path, required: true}
  hosts: {description: Every trainer in node-rank order., type: list, elements: str, required: true}
  results:
    description: "{host: the job_collect result, or {unreachable: true, msg: ...} / {failed: true, msg: ...}}."
    type: dict
    required: true
  nproc_per_node: {description: Ranks per node., type: int, required: true}
  python: {description: The Python that runs the analyzer (needs torch)., type: str, default: python3}
  analyzer_timeout: {description: Seconds the analyzer may run., type: int, default: 300}
  straggler_ratio: {description: Compute-time ratio that names a straggler node., type: float, default: 1.3}
  stall_s: {description: Seconds without progress that make a running job hung., type: int, default: 300}
  node_max_bytes:
    description: The most bytes of files stored for one node (the node caps them too, M(job_collect)); files past it
      are listed as left out, not written.
    type: int
    default: 268435456
attributes:
  check_mode: {support: none, details: It writes only the run directory on the controller.}
  diff_mode: {support: none}
  idempotent: {support: none}
author: trainyard
"""

EXAMPLES = r"""
- name: Store and analyse
  collect_bundle:
    run_dir: "{{ cluster_run_dir }}"
    hosts: "{{ cluster_model.hosts_by_rank }}"
    results: "{{ results_by_host }}"
    nproc_per_node: "{{ cluster_model.nproc_per_node }}"
  delegate_to: localhost
"""

RETURN = r"""
job:
  description: "The job section: lines (what went wrong, each naming node, rank and fix), nodes (per-node table),
    flight_recorder, first_failure, hardware, stragglers, unreachable, files (per node, links relative to run_dir)."
  returned: always
  type: dict
records:
  description: "{host: [check records]} (nvidia_driver.xid, .ecc, .throttle, job.*) for the report."
  returned: always
  type: dict
"""

import base64
import io
import json
import os
import pickle
import pickletools
import re
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils.gpu_health import health_records, other_kernel_events
from ansible_collections.trainyard.core.plugins.module_utils.job_collect import (
    fr_lines, normalize_fr_dump, parse_fr_report, progress_summary,
)
from ansible_collections.trainyard.core.plugins.module_utils import jobtree
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$")


def _latin1(text, encoding="latin1", errors="strict"):
    """What protocol 2 pickles bytes as (_codecs.encode(str, 'latin1')): as many bytes out as characters in."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise pickle.UnpicklingError("refused _codecs.encode other than of a str to latin1")
    return text.encode("latin1")


# The only callables a dump may name: none allocates more than its arguments already hold (bytes(N), bytearray(N),
# list(str), str.__mul__ ... are refused: a 50-byte pickle asked for bytes(10**12)).
# ('__builtin__' is how protocol 2 names builtins.)
_CALLABLES = {("builtins", "set"): set, ("builtins", "frozenset"): frozenset, ("_codecs", "encode"): _latin1,
              ("__builtin__", "set"): set, ("__builtin__", "frozenset"): frozenset}
# Opcodes that build class instances, call constructors or reach outside the stream: never in a dump.
_REFUSED_OPS = frozenset({"INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "BUILD", "EXT1", "EXT2", "EXT4", "PERSID",
                          "BINPERSID"})
# A flight-recorder dump holds at most a few thousand entries (TORCH_NCCL_TRACE_BUFFER_SIZE) of a few hundred
# objects each; its strings and bytes are held by the stream itself (dump_max_bytes caps the file).
FR_MAX_OPS = 2_000_000
FR_MAX_TEXT_BYTES = 64 << 20
# The top-level fields the analyzer and normalize_fr_dump read, with their types (module_utils/jobtree.py).
FR_SCHEMA = {"pg_config": dict, "pg_status": dict, "entries": list, "version": str, "rank": int}


class _PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: any class or function other than _CALLABLES is refused."""

    def find_class(self, module, name):
        if (module, name) in _CALLABLES:
            return _CALLABLES[(module, name)]
        raise pickle.UnpicklingError("refused %s.%s (a dump holds plain data only)" % (module, name))


def check_pickle(data, max_ops=FR_MAX_OPS, max_text=FR_MAX_TEXT_BYTES):
    """Scan the opcode stream before anything is built (pickletools: linear, allocates nothing the stream does not
    hold): at most max_ops objects and operations, max_text bytes of strings and bytes, no opcode that builds an
    instance or reaches outside the stream. UnpicklingError naming what is refused."""
    ops = text = 0
    try:
        for op, arg, _pos in pickletools.genops(data):
            ops += 1
            if ops > max_ops:
                raise pickle.UnpicklingError("more than %d objects and operations" % max_ops)
            if op.name in _REFUSED_OPS:
                raise pickle.UnpicklingError("refused opcode %s (a dump holds plain data only)" % op.name)
            if isinstance(arg, (str, bytes, bytearray)):
                text += len(arg)
                if text > max_text:
                    raise pickle.UnpicklingError("more than %d bytes of strings and bytes" % max_text)
    except pickle.UnpicklingError:
        raise
    except Exception as e:  # noqa: BLE001 - a malformed stream: pickletools raises ValueError and friends
        raise pickle.UnpicklingError("not a pickle: %s" % str(e)[:200]) from None


def load_plain(data):
    check_pickle(data)
    return _PlainUnpickler(io.BytesIO(data)).load()


def put(run_dir, rel, data):
    """Write data (bytes or str) to run_dir/rel through jobtree (directories made and entered without following a
    link, the file written to a fresh temporary file and renamed): the run directory holds what the job wrote."""
    parts = rel.split("/")
    root = jobtree.open_root(run_dir)
    try:
        fd, _made = jobtree.makedirs(root, "/".join(parts[:-1]) or ".", 0o755)
        try:
            jobtree.write_file(fd, parts[-1], data.encode() if isinstance(data, str) else data)
        finally:
            os.close(fd)
    finally:
        os.close(root)


def get(run_dir, rel, max_bytes):
    """At most max_bytes of run_dir/rel through jobtree (a regular file, no link followed); b"" when absent."""
    root = jobtree.open_root(run_dir)
    try:
        return jobtree.read_bytes(root, rel, max_bytes)
    except FileNotFoundError:
        return b""
    finally:
        os.close(root)


def write_node_files(run_dir, host, result, max_bytes=256 << 20, max_files=4096):
    """Store a node's files under nodes/<host>/: plain names only, at most max_bytes and max_files in all (what is
    past a cap is listed as skipped, not written)."""
    base = "nodes/" + host
    listing, total = [], 0
    files = result.get("files") if isinstance(result.get("files"), list) else []
    for f in files[:max_files]:
        f = f if isinstance(f, dict) else {}
        name = f.get("name", "")
        if not isinstance(name, str) or not _SAFE_NAME.match(name) or ".." in name:
            listing.append({"name": repr(name)[:80], "skipped": "refused: not a plain file name"})
            continue
        entry = {"name": name, "size": f.get("size"), "truncated": f.get("truncated"), "skipped": f.get("skipped")}
        content = f.get("content")
        if isinstance(content, str):
            # base64: 4 characters per 3 bytes, checked before anything is decoded
            if total + len(content) * 3 // 4 > max_bytes:
                entry["skipped"] = "left out: the node's files reached node_max_bytes (%d) on the controller" \
                    % max_bytes
                listing.append(entry)
                continue
            try:
                data = base64.b64decode(content, validate=True)
            except ValueError:
                entry["skipped"] = "refused: its content is not base64"
                listing.append(entry)
                continue
            total += len(data)
            put(run_dir, base + "/" + name, data)
            entry["path"] = base + "/" + name
        listing.append(entry)
    if len(files) > max_files:
        listing.append({"name": "(more)", "skipped": "left out: %d more files than %d" % (len(files) - max_files,
                                                                                          max_files)})
    put(run_dir, base + "/collect.json", json.dumps({k: v for k, v in result.items() if k != "files"}
                                                    | {"files": listing}, indent=1, default=str))
    return listing


def analyse_dumps(run_dir, dumps, world_size, python, timeout):
    """dumps: {global rank: bytes}. Runs the analyzer; returns {status, problems, output, note}."""
    if not dumps:
        return {"status": "skip", "problems": [], "output": "",
                "note": "no flight-recorder dump on any node (NCCL dumps on a collective timeout with "
                        "TORCH_NCCL_DUMP_ON_TIMEOUT=1; gloo never dumps; a job that did not time out has none)"}
    work = os.path.join(run_dir, "flight_recorder")
    refused, fixed, have = [], [], []
    for rank, data in sorted(dumps.items()):
        try:
            dump = jobtree.check_types(load_plain(data), FR_SCHEMA)
        except Exception as e:  # noqa: BLE001 - any unreadable or refused dump is reported, never raised
            refused.append("rank %s: %s" % (rank, str(e)[:200]))
            continue
        dump, changed = normalize_fr_dump(dump)
        if changed:
            fixed.append(rank)
        put(run_dir, "flight_recorder/rank_%d" % rank, pickle.dumps(dump))
        have.append(rank)
    have = sorted(have)
    argv = [python, "-m", "torch.distributed.flight_recorder.fr_trace", work, "-p", "rank_"]
    note = []
    if world_size and len(have) < world_size:
        argv.append("--allow-incomplete-ranks")
        note.append("dumps of ranks %s only (of %d): the analyzer ran with --allow-incomplete-ranks"
                    % (have, world_size))
    if refused:
        note.append("dumps refused: " + "; ".join(refused))
    if fixed:
        note.append("ranks %s: gloo-style dumps (empty default group name) renamed for the analyzer" % fixed)
    if not have:
        return {"status": "skip", "problems": [], "output": "", "note": "; ".join(note)}
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                           cwd=work)
        output, rc = p.stdout, p.returncode
    except (OSError, subprocess.TimeoutExpired) as e:
        output, rc = str(e), None
    put(run_dir, "flight_recorder.txt", "$ %s\n%s" % (" ".join(argv), output))
    if rc != 0:
        why = "No module named" in output and "torch is not installed for %s on the controller" % python or \
            "the analyzer failed (exit %s): %s" % (rc, output.strip().splitlines()[-1:] or "")
        return {"status": "skip", "problems": [], "output": output, "note": "; ".join(note + [why])}
    return {"status": "ok", "problems": parse_fr_report(output), "output": output, "note": "; ".join(note),
            "ranks": have}


def _rec(check, status, detail, fix=""):
    return {"check": check, "status": status, "detail": detail, "fix": fix, "data": {}}


def job_records(records, hosts, nproc, first, problems, prog):
    """job.failure, job.hang and job.straggler records on the nodes they name (pass on the others)."""
    missing = {}
    for pr in problems:
        for r in pr.get("missing_ranks") or []:
            missing.setdefault(r // max(nproc, 1), []).append((r, pr))
    slow = {s["host"]: s for s in prog["stragglers"]}
    for node_rank, host in enumerate(hosts):
        if host not in records:
            continue
        recs = records[host]
        if first and first.get("node") == host:
            recs.append(_rec("job.failure", "fail", "first failure: rank %s (local rank %s), exit code %s%s: %s" % (
                first.get("rank"), first.get("local_rank"), first.get("exitcode"),
                " (%s)" % first["signal"] if first.get("signal") else "",
                (first.get("traceback") or "").strip().splitlines()[-1:] or ""),
                "read nodes/%s/torchrun.log; then reset.yml and site.yml" % host))
        else:
            recs.append(_rec("job.failure", "pass", "no failure named first on this node"))
        if node_rank in missing:
            recs.append(_rec("job.hang", "fail", "; ".join(
                "rank %d never joined %s (sequence number %s, input sizes %s)" % (
                    r, pr.get("op"), pr.get("seq"), pr.get("input_sizes")) for r, pr in missing[node_rank]),
                "find why this rank skipped the collective: its stack (status.yml), log tail and kernel events"))
        elif problems:
            recs.append(_rec("job.hang", "pass", "every rank of this node joined"))
        else:
            recs.append(_rec("job.hang", "skip", "no flight-recorder finding (no dump, or nothing missing)"))
        if host in slow:
            recs.append(_rec("job.straggler", "warn", slow[host]["text"], slow[host]["fix"]))
        elif prog["reporting"]:
            recs.append(_rec("job.straggler", "pass", "compute time in line with the other nodes"))
        else:
            recs.append(_rec("job.straggler", "skip", "no progress files (the entry point writes none)"))


def main():
    m = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path", required=True),
            hosts=dict(type="list", elements="str", required=True),
            results=dict(type="dict", required=True),
            nproc_per_node=dict(type="int", required=True),
            python=dict(type="str", default="python3"),
            analyzer_timeout=dict(type="int", default=300),
            straggler_ratio=dict(type="float", default=1.3),
            stall_s=dict(type="int", default=300),
            node_max_bytes=dict(type="int", default=256 << 20),
        ),
        supports_check_mode=False,
    )
    p = m.params
    run_dir, hosts, nproc = p["run_dir"], p["hosts"], p["nproc_per_node"]
    os.makedirs(run_dir, exist_ok=True)
    world = len(hosts) * nproc
    now = time.time()
    lines, fixes, records, nodes, unreachable, failures, dumps = [], [], {}, [], [], [], {}
    hardware, other = [], []
    progress_in = {}
    files = {}
    for node_rank, host in enumerate(hosts):
        res = p["results"].get(host) or {"unreachable": True, "msg": "no result"}
        if res.get("unreachable") or res.get("failed") or "files" not in res:
            why = (res.get("msg") or "no result").strip().splitlines()[0][:300] if res.get("msg") else "no result"
            unreachable.append({"host": host, "node_rank": node_rank, "why": why})
            lines.append("%s (node rank %d, ranks %d-%d): not collected: %s" % (
                host, node_rank, node_rank * nproc, node_rank * nproc + nproc - 1, why))
            fixes.append("%s: make it reachable (ssh, disk, load) and run collect.yml again; the other nodes' "
                         "evidence is in this run" % host)
            nodes.append({"host": host, "node_rank": node_rank, "state": "unreachable"})
            continue
        files[host] = write_node_files(run_dir, host, res, p["node_max_bytes"])
        left = {str(x.get("name")): x for x in res.get("left_out") or [] if isinstance(x, dict)}
        left.update((f["name"], {"name": f["name"], "why": f["skipped"]}) for f in files[host]
                    if str(f.get("skipped")).startswith(("left out", "refused")))
        left = list(left.values())
        if left:
            lines.append("%s: %d item(s) of its evidence left out by the caps: %s" % (
                host, len(left), "; ".join("%s (%s)" % (str(x.get("name"))[:80], str(x.get("why"))[:160])
                                           for x in left[:8])))
            fixes.append("%s: look at what the job wrote there (a job that plants files fills no bundle); raise "
                         "launch_collect_files_max / launch_collect_node_max_bytes if the files are genuine" % host)
        opts = {"node_rank": node_rank, "nproc_per_node": nproc, "since": (res.get("kernel") or {}).get("since")}
        recs = health_records(host, res, opts)
        records[host] = recs
        for r in recs:
            if r["status"] in ("fail", "warn"):
                hardware.append(dict(r, host=host))
        other.extend(other_kernel_events(host, (res.get("kernel") or {}).get("events"), opts))
        text = get(run_dir, "nodes/%s/torchrun.log" % host, p["node_max_bytes"]).decode("utf-8", "replace")
        for f in tr.parse_failures(text):
            f["node"], f["node_rank"] = host, node_rank
            failures.append(f)
        for n in res.get("dumps") or []:
            if not (isinstance(n, str) and n.startswith("rank_") and n[5:].isdigit()):
                continue
            data = get(run_dir, "nodes/%s/flight_recorder/%s" % (host, n), p["node_max_bytes"])
            if data:
                dumps[int(n[5:])] = data
        progress_in[host] = {"node_rank": node_rank, "ranks": res.get("progress") or []}
        st = res.get("state") or {}
        nodes.append({"host": host, "node_rank": node_rank, "state": "collected",
                      "started_at": st.get("started_at"), "limits": res.get("container_limits") or {},
                      "container": (res.get("container_state") or {}).get("Status")})

    first = tr.first_failure(failures) if failures else None
    if first:
        lines.append("first failure: %s (node rank %s), rank %s (local rank %s), exit code %s%s" % (
            first.get("node"), first.get("node_rank"), first.get("rank"), first.get("local_rank"),
            first.get("exitcode"), " (%s)" % first["signal"] if first.get("signal") else ""))
        fixes.append("read that rank's traceback in nodes/%s/torchrun.log and the node's kernel events below; "
                     "then reset.yml and site.yml (resumes from the latest checkpoint)" % first.get("node"))
    fr = analyse_dumps(run_dir, dumps, world, p["python"], p["analyzer_timeout"])
    fr_text = fr_lines(fr["problems"], lambda nr: hosts[nr] if 0 <= nr < len(hosts) else "?", nproc)
    for t in fr_text:
        lines.append("hang: " + t)
    if fr_text:
        fixes.append("find why the named rank skipped or never reached that collective (its stack in "
                     "nodes/<host>/stacks/, its log tail, its node's kernel events): a rank-dependent branch around "
                     "a collective, an exception swallowed on that rank, or its GPU or node failing")
    for r in hardware:
        lines.append("%s: %s %s: %s" % (r["host"], r["check"], r["status"].upper(), r["detail"]))
        fixes.append(r["fix"])
    for o in other:
        lines.append(o["text"])
        fixes.append("%s: %s" % (o["node"], o["fix"]))
    prog = progress_summary(progress_in, now, p["stall_s"], p["straggler_ratio"])
    for s in prog["stragglers"]:
        lines.append(s["text"])
        fixes.append(s["fix"])
    for n in nodes:
        pn = next((x for x in prog["nodes"] if x["host"] == n["host"]), None)
        if pn:
            n.update({k: pn[k] for k in ("last_step", "steps_total", "steps_per_s", "eta_s", "compute_s", "age_s",
                                          "ranks")})
    job_records(records, hosts, nproc, first, fr["problems"], prog)
    if not lines:
        lines.append("nothing wrong found: no failed rank, no hang dump, no GPU fault, no straggler on %d nodes"
                     % len(hosts))
    job = {"generated": now, "lines": lines, "fixes": list(dict.fromkeys(x for x in fixes if x)), "nodes": nodes,
           "unreachable": unreachable, "first_failure": first, "flight_recorder": {
               k: fr.get(k) for k in ("status", "problems", "note", "ranks")}, "hardware": hardware,
           "kernel_events": other, "stragglers": prog["stragglers"], "stalled": prog["stalled"], "files": files}
    put(run_dir, "collect.json", json.dumps(job, indent=1, default=str))
    md = ["# Job diagnosis", "", "## What went wrong", ""] + ["- " + x for x in lines] + ["", "## Fixes", ""]
    md += ["- " + x for x in job["fixes"]] + ["", "## Nodes", "", "| node | rank | state | last step | steps/s | "
                                              "compute s/step | files |", "|---|---|---|---|---|---|---|"]
    for n in nodes:
        got = [f["path"] for f in files.get(n["host"], []) if f.get("path")]
        md.append("| %s | %s | %s | %s | %s | %s | %d files in nodes/%s/ |" % (
            n["host"], n["node_rank"], n["state"], n.get("last_step", ""),
            "%.2f" % n["steps_per_s"] if n.get("steps_per_s") else "", "%.3f" % n["compute_s"]
            if n.get("compute_s") is not None else "", len(got), n["host"]))
    if fr.get("output"):
        md += ["", "## Flight recorder (PyTorch's analyzer)", "", "```", fr["output"].strip()[-6000:], "```"]
    if fr.get("note"):
        md += ["", fr["note"]]
    put(run_dir, "collect.md", "\n".join(md) + "\n")
    m.exit_json(changed=False, job=job, records=records, lines=lines)


if __name__ == "__main__":
    main()
