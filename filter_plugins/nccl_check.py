"""Filters of the nccl_check role: the benchmark's result line, and the role's records (plugin_utils/allreduce_checks.py)."""

from __future__ import annotations

import json

from ansible_collections.trainyard.core.plugins.plugin_utils.allreduce_checks import inter_node_record, intra_node_record

PREFIX = "trainyard-allreduce: "


def allreduce_result(registered):
    """Parse a registered benchmark run into {ok, busbw_gbps, algbw_gbps, backend, world_size, error}.

    Skipped runs give {ok: False, skipped: True}. A run that printed no result line is not ok, with the
    last lines of its output as the error.
    """
    registered = registered or {}
    if registered.get("skipped"):
        return {"ok": False, "skipped": True, "error": "skipped"}
    stdout = registered.get("stdout") or ""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PREFIX):
            try:
                data = json.loads(line[len(PREFIX):])
            except ValueError:
                break
            data["ok"] = registered.get("rc", 0) == 0
            data.setdefault("error", "" if data["ok"] else f"exit code {registered.get('rc')}")
            return data
    rc = registered.get("rc")
    tail = (registered.get("stderr") or stdout or "").strip().splitlines()[-6:]
    reason = "timed out (hang)" if rc in (124, 137) else f"exit code {rc}"
    return {"ok": False, "error": f"{reason}: " + " | ".join(tail) if tail else reason}


class FilterModule:
    def filters(self):
        return {"trainyard_allreduce_result": allreduce_result,
                "trainyard_allreduce_inter_record": inter_node_record,
                "trainyard_allreduce_intra_record": intra_node_record}
