# -*- coding: utf-8 -*-
"""Pure helpers of the Slurm launch backend (library/slurm_job.py): the sbatch argv, Slurm's answers parsed, a
node's state for status.yml. Unit-tested in tests/unit/test_slurm.py without a Slurm.

Host-only record (``<state_root>/<job>/slurm.json`` on the node that submitted, the head)::

    {"job": "train", "job_id": "42", "submitted_at": 1763800000.0, "nodes": ["n1", "n2"], "exclude": ["n3"],
     "argv": ["sbatch", "--parsable", ...], "version": 1}
"""

from __future__ import annotations

import json
import re

RECORD_FILE = "slurm.json"
SUBDIR = "slurm"
RUNNER_FILE = "slurm_node.py"
NODE_SPEC_FILE = "node.json"
BATCH_SPEC_FILE = "batch.json"
SUBMIT_LOCK_FILE = "submit.lock"  # slurm_job state=submitted holds it from reading the record to writing it
LOG_FILE = "slurm.log"
ENV_FILE = "job.env"
EXIT_LINE = re.compile(r"^trainyard: torchrun on this node exited with (-?\d+)$", re.M)
# Slurm job states (squeue %T / scontrol JobState) by what they mean for the job.
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING",
          "STAGE_OUT", "RESV_DEL_HOLD", "REQUEUE_FED", "REQUEUE_HOLD")
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_JOB_ID = re.compile(r"^\d+(_\d+)?$")


class SlurmError(ValueError):
    """An option that cannot make a valid submission."""


def check_nodes(option, names):
    bad = [n for n in names if not _NODE_NAME.match(str(n))]
    if bad:
        raise SlurmError("%s: %s not a Slurm node name (letters, digits, '_', '.', '-'); set launch_slurm_node_names "
                         "(inventory host: Slurm name) to the names sinfo -N shows" % (option, ", ".join(map(repr, bad))))
    return [str(n) for n in names]


def sbatch_argv(sbatch, job, nodes, exclude, output, script, batch_spec, partition="", time_limit="", extra=()):
    """sbatch for the job: one task per node on exactly `nodes` (the cluster model's hosts by rank), `exclude` named
    too (the nodes the inventory excluded: never allocated even if a partition default would add them)."""
    nodes = check_nodes("nodes", nodes)
    exclude = check_nodes("exclude", exclude)
    if not nodes:
        raise SlurmError("nodes is empty: the cluster model has no hosts")
    both = sorted(set(nodes) & set(exclude))
    if both:
        raise SlurmError("nodes %s are both in the job and excluded: fix the inventory's exclusion" % both)
    argv = [sbatch, "--parsable", "--job-name=trainyard-%s" % job, "--nodes=%d" % len(nodes),
            "--ntasks-per-node=1", "--nodelist=%s" % ",".join(nodes), "--output=%s" % output, "--chdir=/"]
    if exclude:
        argv.append("--exclude=%s" % ",".join(exclude))
    if partition:
        argv.append("--partition=%s" % partition)
    if time_limit:
        argv.append("--time=%s" % time_limit)
    argv += [str(a) for a in extra]
    return argv + [script, "batch", batch_spec]


def parse_job_id(out):
    """sbatch --parsable prints '<id>' or '<id>;<cluster>'."""
    first = (out or "").strip().splitlines()[-1:] or [""]
    job_id = first[0].split(";")[0].strip()
    if not _JOB_ID.match(job_id):
        raise SlurmError("sbatch gave no job id: %r" % (out or "")[-200:])
    return job_id


def valid_job_id(job_id):
    return bool(_JOB_ID.match(str(job_id or "")))


def parse_scontrol(text):
    """`scontrol show job -o <id>`: one line of Key=Value fields → dict (values may hold '=', never blanks,
    except Command/WorkDir/StdOut paths, which are taken to the next key)."""
    out = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9:/_]*)=(\S*)", (text or "").strip()):
        out[m.group(1)] = m.group(2)
    return out


def parse_squeue(text):
    """`squeue -h -o '%i|%T|%R'` lines → {id: (state, reason)}."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            out[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return out


def is_active(slurm_state):
    words = str(slurm_state or "").split()
    return bool(words) and words[0].rstrip("+") in ACTIVE


def node_exit(log_text):
    """The exit code the runner recorded for this node's torchrun, or None while it runs (or never started)."""
    found = EXIT_LINE.findall(log_text or "")
    return int(found[-1]) if found else None


def this_job_log(text, job_id):
    """The part of a node's log that Slurm job job_id wrote (from its runner's header line on), or "" before that
    runner wrote it: until the runner rotates the log, the file still holds the previous job's lines (a relaunch after
    a killed rank), which are not this job's failure."""
    i = (text or "").rfind("trainyard: slurm job %s step " % job_id)
    return text[i:] if i >= 0 else ""


def node_state(slurm_state, exit_code, failure):
    """This node's state for status.yml (running / finished / failed / absent) from Slurm's job state, the exit code
    the runner recorded on this node and torchrun's first failure in its log."""
    st = str(slurm_state or "").split()[0].rstrip("+") if slurm_state else ""
    if not st:
        return "absent"
    if exit_code is not None:
        return "finished" if exit_code == 0 and not failure else "failed"
    if st in ACTIVE:
        return "failed" if failure else "running"
    return "finished" if st == "COMPLETED" else "failed"


def env_file_text(env):
    """The job's environment as docker --env-file reads it (KEY=value, literal); a value docker cannot carry on one
    line is an error naming the variable."""
    bad = sorted(k for k, v in env.items() if "\n" in str(v) or "\r" in str(v) or "\0" in str(v))
    if bad:
        raise SlurmError("environment variable(s) %s hold a line break, which docker --env-file cannot carry: make "
                         "each value one line (launch_env, the env files)" % ", ".join(bad))
    return "".join("%s=%s\n" % (k, env[k]) for k in sorted(env))


def workers(stats):
    """How many rank processes torchrun started: stats are (pid, ppid) of the job's processes on the node (its token
    holders); torchrun is the holder whose parent is not one, its ranks its direct children."""
    pids = set(pid for pid, _ in stats)
    roots = set(pid for pid, ppid in stats if ppid not in pids)
    return len([pid for pid, ppid in stats if ppid in roots])


def record(job, job_id, submitted_at, nodes, exclude, argv):
    return {"job": job, "job_id": str(job_id), "submitted_at": submitted_at, "nodes": list(nodes),
            "exclude": list(exclude), "argv": list(argv), "version": 1}


def parse_record(text):
    data = json.loads(text)
    if not isinstance(data, dict) or not valid_job_id(data.get("job_id")):
        raise ValueError("no job_id")
    return data
