"""playbooks/export.yml on the controller: hand a proven cluster to a Slurm run by someone else.

From what a run proved (its report.json records with status pass) and the command that ran (launch.json of the
torchrun backend or the Slurm task's node.json on the head), three texts:

* ``health(report, hosts, names)``: per Slurm node, the values the run proved (driver and fabric manager versions, data
  NIC and its MTU, InfiniBand rate where a check measured one, GPU count), what the prolog compares against;
* ``sbatch_script(...)``: an sbatch script running the same torchrun command on the same nodes, each node's rank
  from the cluster model, the environment of the rendered nccl.env; every value shell-quoted;
* the prolog itself is roles/launch/files/slurm_prolog.py (a standalone script the nodes run).

Pure functions; unit-tested in tests/unit/test_slurm_export.py.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Mapping

from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr

_DRIVER = re.compile(r"\bdriver (\d+\.\d+(?:\.\d+)?)")
_GPUS = re.compile(r"^(\d+) GPU\(s\)")
_FM = re.compile(r"\bfabric manager (\d+\.\d+(?:\.\d+)?)")
_IFACE = re.compile(r"^(\S+) \(holds")
_MTU = re.compile(r"\bMTU (\d+)\b")
_IB_RATE = re.compile(r"\b(\d+) Gb/sec\b")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ExportError(ValueError):
    """What the export cannot pin or render, with the fix."""


def _passed(report: Mapping, host: str) -> dict[str, Mapping]:
    return {r["check"]: r for r in report.get("records") or []
            if r.get("host") == host and r.get("status") == "pass" and isinstance(r.get("check"), str)}


def _first(rx: re.Pattern, text: Any) -> str | None:
    m = rx.search(str(text or ""))
    return m.group(1) if m else None


def _names(hosts: list[str], shown: int = 4) -> str:
    return ", ".join(hosts[:shown]) + (" and %d more" % (len(hosts) - shown) if len(hosts) > shown else "")


def health(report: Mapping, hosts: list[str], names: Mapping[str, str]) -> dict:
    """{"run_id", "nodes": {slurm name: {driver_version, fabricmanager_version, data_iface, data_mtu, ib_rate_gbps,
    gpu_count}}}: only values a passing check of this report recorded; a value no check proved is null, and the
    prolog does not compare it. A report without a record of one of these hosts is another cluster's (or this one's
    before a node was added): an error naming them and the fix."""
    checked = set(report.get("hosts") or []) | {r.get("host") for r in report.get("records") or []}
    unknown = [h for h in hosts if h not in checked]
    if unknown:
        others = sorted(str(h) for h in checked - set(hosts))
        raise ExportError(
            "report %s is not this cluster's: it has no record of %s%s. Run site.yml with this inventory (its report "
            "becomes runs/latest-<inventory directory>), or pass -e export_report=runs/<its run id>/report.json"
            % (report.get("run_id"), _names(unknown), " (it checked %s)" % _names(others) if others else ""))
    nodes = {}
    for host in hosts:
        rec = _passed(report, host)
        drift = lambda check, key: ((rec.get(check) or {}).get("data") or {}).get("drift", {}).get(key)  # noqa: E731
        gpus = _first(_GPUS, (rec.get("nvidia_driver.gpu_count") or {}).get("detail"))
        mtu = drift("network.mtu", "data_mtu") or _first(_MTU, (rec.get("network.mtu") or {}).get("detail"))
        ib = next((_first(_IB_RATE, r.get("detail")) for c, r in sorted(rec.items())
                   if c.startswith(("network.ib", "nccl_env.ib")) and _first(_IB_RATE, r.get("detail"))), None)
        nodes[names.get(host, host)] = {
            "driver_version": _first(_DRIVER, (rec.get("nvidia_driver.version") or {}).get("detail")),
            "fabricmanager_version": drift("fabricmanager.version", "fabricmanager")
            or _first(_FM, (rec.get("fabricmanager.version") or {}).get("detail")),
            "data_iface": drift("network.iface", "data_iface")
            or _first(_IFACE, (rec.get("network.iface") or {}).get("detail")),
            "data_mtu": int(mtu) if mtu is not None else None,
            "ib_rate_gbps": int(ib) if ib else None,
            "gpu_count": int(gpus) if gpus else None,
        }
    if not any(v for node in nodes.values() for v in node.values()):
        raise ExportError("report %s proves nothing to pin (no passing driver, fabric manager, network or GPU check "
                          "for %s): run site.yml, then export from its report" % (report.get("run_id"), ", ".join(hosts)))
    return {"run_id": report.get("run_id"), "nodes": nodes}


def env_from_text(text: str) -> dict[str, str]:
    """KEY=value lines of a rendered env file (nccl.env), read as docker --env-file reads them (module_utils/torchrun.py
    parse_env_file: a line it would read differently is an error naming it)."""
    env, problems = tr.parse_env_file(text or "", "nccl.env")
    if problems:
        raise ExportError("; ".join(problems))
    return env


def recorded_command(launch: Mapping | None, node: Mapping | None, head: str) -> list[str]:
    """The torchrun command that ran on the head: the torchrun backend's launch.json, else the Slurm task's node.json."""
    for record in (launch, node):
        if isinstance(record, Mapping):
            command = record.get("command") or record.get("argv")
            if isinstance(command, list) and command:
                return [str(a) for a in command]
    raise ExportError("no job was launched on the head %s (no launch.json or slurm/node.json): run site.yml first, "
                      "then export what it proved" % head)


def _with_rank(command: list[str], quote) -> str:
    """The command, quoted, with its --node_rank replaced by each node's "$rank" (from the cluster model)."""
    if not any(a.startswith("--node_rank=") for a in command):
        raise ExportError("the recorded command has no --node_rank (not a static rendezvous): %s" % command[:6])
    return " ".join('--node_rank="$rank"' if a.startswith("--node_rank=") else quote(a) for a in command)


def sbatch_script(job: str, hosts_by_rank: list[str], names: Mapping[str, str], exclude: list[str],
                  command: list[str], container: str, env: Mapping[str, str], run_id: str,
                  partition: str = "", time_limit: str = "", docker: str = "docker") -> str:
    """The sbatch script: one task per node on the cluster model's nodes, each running its rank's torchrun in the
    training container through docker exec, with the rendered environment."""
    bad = sorted(k for k in env if not _ENV_NAME.match(str(k)))
    if bad:
        raise ExportError("environment names %s are not variable names: fix the env file" % bad)
    if any("\n" in str(v) for v in env.values()):
        raise ExportError("an environment value holds a line break: make each value one line")
    q = shlex.quote
    nodes = [names.get(h, h) for h in hosts_by_rank]
    lines = ["#!/bin/bash",
             "# Generated by trainyard playbooks/export.yml from run %s: the command and environment that run" % run_id,
             "# validated, on the nodes it proved. One task per node; each runs its rank's torchrun in the training",
             "# container (%s) through docker exec (no pyxis/enroot: docs/slurm.md)." % container,
             "#SBATCH --job-name=%s" % q("trainyard-%s" % job),
             "#SBATCH --nodes=%d" % len(nodes),
             "#SBATCH --ntasks-per-node=1",
             "#SBATCH --nodelist=%s" % q(",".join(nodes))]
    if exclude:
        lines.append("#SBATCH --exclude=%s" % q(",".join(exclude)))
    if partition:
        lines.append("#SBATCH --partition=%s" % q(partition))
    if time_limit:
        lines.append("#SBATCH --time=%s" % q(time_limit))
    lines += ["set -euo pipefail", "", "# The environment the run rendered (nccl.env, launch_env)."]
    lines += ["export %s=%s" % (k, q(str(env[k]))) for k in sorted(env)]
    lines += ["", "task() {", '  local rank', '  case "$SLURMD_NODENAME" in']
    lines += ["    %s) rank=%d ;;" % (q(n), i) for i, n in enumerate(nodes)]
    lines += ['    *) echo "trainyard: node $SLURMD_NODENAME is not in the validated cluster" >&2; return 1 ;;',
              "  esac"]
    env_args = " ".join("-e %s" % k for k in sorted(env))
    # docker exec's client does not pass Slurm's SIGTERM on: the task ends the job's processes by their token.
    lines += ['  local token="TRAINYARD_LAUNCH_ID=slurm-$SLURM_JOB_ID"',
              '  trap \'for p in /proc/[0-9]*; do grep -qzx "$token" "$p/environ" 2>/dev/null && '
              'kill -TERM "${p#/proc/}"; done; exit 143\' TERM INT',
              '  %s exec %s -e "$token" %s %s &' % (q(docker), env_args, q(container), _with_rank(command, q)),
              '  wait "$!"', "}", "",
              'srun --ntasks-per-node=1 --nodes=%d --kill-on-bad-exit=1 bash -c "$(declare -f task); task"'
              % len(nodes), ""]
    return "\n".join(lines)
