# -*- coding: utf-8 -*-
"""The janitor role's check (janitor.dry_run) from its dry run on the node (action janitor_check).

A pure function, run on the controller: the answer of the command module that ran the janitor as it runs
(``setpriv`` to janitor_user, ``--dry-run --json``) in, the record out.
"""

from __future__ import annotations

import json

SKIPPED = "not run: check mode and the script is not on the node yet"


def dry_run_record(run, root, python="python3", user="trainyard-janitor"):
    """janitor.dry_run from the command module's answer ({rc, stdout, stderr}); None: the dry run did not run (check
    mode, the script not on the node yet)."""
    fix = (f"{python} must be Python 3.8+ on the node, setpriv (util-linux) installed, and {root} readable by {user} "
           "with CAP_DAC_OVERRIDE")
    if run is None:
        return {"check": "janitor.dry_run", "status": "skip", "detail": SKIPPED, "fix": fix}
    rc = run.get("rc")
    if rc == 0:
        try:
            found = json.loads(run.get("stdout") or "")
            detail = (f"{root}: {found['checkpoints']} checkpoints, {len(found['deletions'])} files "
                      f"({found['total_bytes']} bytes) to free now, scan {found['scan_seconds']} s")
        except (ValueError, KeyError, TypeError) as exc:
            return {"check": "janitor.dry_run", "status": "fail", "fix": fix,
                    "detail": f"the dry run's output is not the janitor's JSON ({type(exc).__name__}: {exc})"[:300]}
        return {"check": "janitor.dry_run", "status": "pass", "detail": detail, "fix": ""}
    # Without stderr (the command could not start): the module's message, the exit code and what it ran.
    text = str(run.get("stderr") or "").strip() or (f"{run.get('msg') or 'failed'} (exit {rc})"
                                                    + (f": {run['cmd']}" if run.get("cmd") else ""))
    return {"check": "janitor.dry_run", "status": "fail", "detail": text if len(text) <= 300 else text[:297] + "...",
            "fix": fix}
