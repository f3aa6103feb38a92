# -*- coding: utf-8 -*-
"""Bad machines left out and remembered (docs/burn-in.md): the node failure policy and the record of machines that
failed a check, kept on the controller in ``<runs dir>/bad_machines.json`` (the parent of ``cluster_run_dir``).

A machine is known by what stays with it when a rented address is handed to someone else: its GPUs (UUIDs and
serial numbers, from nvidia-smi -q -x) and ``/etc/machine-id``, never its address or inventory name. Two
identities are the same machine when they share a GPU UUID, or when they share a machine id and one of them has no
GPU list (nvidia-smi failed on it).

Policy ``fail`` (the default): a failed check stops the run (the report fails, as before); a machine in the record
gets a warning. Policy ``exclude``: the nodes that failed a check in this run and the machines in the record are
left out, the others get a cluster model with contiguous ranks (module_utils/recover.py's plan_survivors, the rule
recover.yml uses), and the run stops when fewer than ``cluster_min_nodes`` remain. Either way every machine that
failed is written to the record; ``cluster_clear_bad_machines`` (an id, a node name, or ``all``) removes entries.

Pure (the file is read and written by the action ``node_exclusion``); unit-tested in tests/unit/test_bad_machines.py.
"""

from __future__ import annotations

import hashlib
import json

from ansible_collections.trainyard.core.plugins.module_utils import recover

SCHEMA = 1
POLICIES = ("fail", "exclude")


class BadMachinesError(ValueError):
    """The record or an option is unusable; the message names it and the fix."""


def identity(facts, machine_id=None):
    """{id, machine_id, gpu_uuids, gpu_serials} of one node from its nvidia_gpu_facts (None when nvidia-smi failed)
    and /etc/machine-id; None when neither says anything (the machine cannot be remembered)."""
    gpus = (facts or {}).get("gpus") or []
    uuids = sorted({str(g["uuid"]) for g in gpus if g.get("uuid")})
    serials = sorted({str(g["serial"]) for g in gpus if g.get("serial") not in (None, "", "N/A")})
    mid = str(machine_id or "").strip() or None
    if not uuids and not mid:
        return None
    key = json.dumps([mid, uuids, serials], separators=(",", ":"))
    return {"id": "m-" + hashlib.sha256(key.encode()).hexdigest()[:12], "machine_id": mid, "gpu_uuids": uuids,
            "gpu_serials": serials}


def same_machine(a, b):
    """Whether two identities (or record entries) are one machine."""
    if not a or not b:
        return False
    if a.get("id") == b.get("id"):
        return True
    if set(a.get("gpu_uuids") or []) & set(b.get("gpu_uuids") or []):
        return True
    return bool(a.get("machine_id") and a.get("machine_id") == b.get("machine_id")
                and not (a.get("gpu_uuids") and b.get("gpu_uuids")))


def load(text, path="bad_machines.json"):
    """The record from its file's text ('' or None: an empty record). Raises BadMachinesError naming the file."""
    if not (text or "").strip():
        return {"schema": SCHEMA, "machines": []}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadMachinesError("%s is not JSON (%s). Fix: move it aside or delete it (it only remembers machines that "
                               "failed; the next failing run writes it again)" % (path, exc)) from None
    if not isinstance(data, dict) or not isinstance(data.get("machines"), list) or \
            not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data["machines"]):
        raise BadMachinesError("%s is not a trainyard bad-machines record ({schema, machines: [{id, ...}]}). Fix: "
                               "move it aside or delete it" % path)
    return data


def dump(record):
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def clear(record, what, hosts_by_id=None):
    """(record without the entries `what` names, [removed ids]): 'all', an id, or a node name last seen with it."""
    what = str(what or "").strip()
    if not what:
        return record, []
    keep, gone = [], []
    for m in record["machines"]:
        if what == "all" or what == m["id"] or what == m.get("last_host"):
            gone.append(m["id"])
        else:
            keep.append(m)
    if not gone:
        known = ", ".join("%s (%s)" % (m["id"], m.get("last_host")) for m in record["machines"]) or "none"
        raise BadMachinesError("cluster_clear_bad_machines=%s names no machine of the record (known: %s). Fix: give "
                               "an id or node name from that list, or all" % (what, known))
    return dict(record, machines=keep), gone


def find(record, ident):
    """The record's entry for this identity, or None."""
    return next((m for m in record.get("machines") or [] if same_machine(m, ident)), None)


def decide(hosts_by_rank, failed, identities, record, policy="fail", min_nodes=1, now="", run_id="",
           nproc_per_node=1, master_port=39500, data_addresses=None, master_addr=""):
    """The exclusion of one run.

    failed: {host: [check: detail, ...]} of this run's failed checks; identities: {host: identity() or None};
    record: load()'s dict. Returns {policy, excluded: [{host, id, reason, checks}], remembered: [{host, id,
    last_failed, checks}], kept, models (the kept nodes' cluster models, policy exclude), record (updated),
    unknown (failed nodes that cannot be remembered), summary, warnings}.
    Raises BadMachinesError for a bad policy, and when fewer than min_nodes would remain (naming them).
    """
    if policy not in POLICIES:
        raise BadMachinesError("cluster_node_failure_policy is %r. Fix: set it to fail (a failed check stops the run) "
                               "or exclude (leave the node out)" % (policy,))
    hosts = list(hosts_by_rank)
    failed = {h: list(v) for h, v in (failed or {}).items() if h in hosts and v}
    machines = [dict(m) for m in record.get("machines") or []]
    remembered, unknown = [], []
    for h in hosts:
        entry = find({"machines": machines}, identities.get(h))
        if entry is not None and h not in failed:
            remembered.append({"host": h, "id": entry["id"], "last_failed": entry.get("last_failed"),
                               "checks": entry.get("checks") or []})
    for h in hosts:
        if h not in failed:
            continue
        ident = identities.get(h)
        if ident is None:
            unknown.append(h)
            continue
        entry = find({"machines": machines}, ident)
        if entry is None:
            entry = {"id": ident["id"], "first_failed": now, "failures": 0}
            machines.append(entry)
        entry.update({k: ident[k] for k in ("machine_id", "gpu_uuids", "gpu_serials")})
        entry.update(last_host=h, last_failed=now, last_run=run_id, checks=failed[h][:8],
                     failures=int(entry.get("failures") or 0) + 1)
    out = {"policy": policy, "remembered": remembered, "unknown": unknown, "notes": [],
           "record": {"schema": SCHEMA, "machines": machines}, "excluded": [], "kept": hosts, "models": {}}
    for r in remembered:
        out["notes"].append("%s is machine %s, which failed %s on %s (%s)%s" % (
            r["host"], r["id"], "; ".join(r["checks"][:2]) or "a check", r["last_failed"] or "an earlier run",
            "left out (cluster_node_failure_policy: exclude)" if policy == "exclude" else
            "it passes now; watch it", " until cleared: -e cluster_clear_bad_machines=%s" % r["id"]))
    if policy == "fail":
        out["summary"] = ("no node left out (cluster_node_failure_policy: fail)%s"
                          % ("; %d node(s) failed a check" % len(failed) if failed else ""))
        return out
    drop = dict(failed)
    for r in remembered:
        drop[r["host"]] = ["remembered as bad machine %s (%s)" % (r["id"], "; ".join(r["checks"][:2]) or "failed")]
    try:
        plan = recover.plan_survivors(hosts, {}, drop, min_nodes, nproc_per_node, master_port, data_addresses,
                                      master_addr)
    except recover.RecoverError as exc:
        raise BadMachinesError(str(exc).replace("Not recovering", "Stop: not launching").replace(
            "cluster_min_nodes (-e", "cluster_min_nodes, or set cluster_node_failure_policy: fail to see every "
            "failure (-e")) from None
    ids = {h: (identities.get(h) or {}).get("id") for h in hosts}
    out["excluded"] = [{"host": h, "id": ids[h], "reason": "remembered" if h not in failed else "failed",
                        "checks": drop[h]} for h in hosts if h in drop]
    out["kept"] = plan["survivors"]
    out["models"] = plan["models"]
    out["summary"] = ("no node left out: every node passed and none is in the record" if not drop else
                      "left out %s; %s" % (", ".join("%s (%s)" % (e["host"], e["checks"][0]) for e in out["excluded"]),
                                          plan["summary"]))
    return out


def report_view(report, exclusion):
    """The preflight report with the exclusion: {exclusion} added; failures of left-out nodes no longer fail the run
    (they stay in records and move to excluded_failures), the remembered machines' lines join the warnings."""
    if not exclusion:
        return report
    out = dict(report)
    left = {e["host"] for e in exclusion.get("excluded") or []}
    out["exclusion"] = {k: exclusion.get(k) for k in ("policy", "excluded", "remembered", "kept", "unknown", "summary",
                                                      "notes", "record_path", "machines")}
    out["excluded_failures"] = [r for r in report.get("failures") or [] if r.get("host") in left]
    out["failures"] = [r for r in report.get("failures") or [] if r.get("host") not in left]
    out["failed"] = bool(out["failures"])
    return out
