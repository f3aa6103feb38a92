#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module slurm_job: the Slurm launch backend (prepare each node, submit, status, cancel one job)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_job
short_description: Run the validated torchrun job under Slurm (prepare, submit, status, cancel this job only)
description:
  - "C(state=prepared), on every node: writes this node's task spec C(<state_root>/<job>/slurm/node.json) (0600: the
    torchrun argv built from the cluster model exactly as torchrun_launch builds it, the environment of the env files
    and C(env), the resume point) and the runner C(<state_root>/<job>/slurm/slurm_node.py). Host-only: nothing there
    is mounted into the training container."
  - "C(state=submitted), on the head: C(sbatch) of the runner (one task per node on exactly I(nodes), I(exclude)
    excluded; C(srun) runs each node's torchrun in the training container through C(docker exec): pyxis/enroot are
    not used). The job id goes to C(<state_root>/<job>/slurm.json). A recorded job that Slurm still holds is left
    alone (C(changed=false)); a recorded job that ended is replaced by a new submission. Two submitters at once: the
    second waits on a lock in the host-only C(slurm/) directory until the first has written its record, then finds
    that job (one submission)."
  - "C(state=status), on every node: Slurm's state of the recorded job (C(squeue), then C(scontrol show job)) and this
    node's own log C(<state_root>/<job>/job-rw/slurm.log): running / finished / failed with torchrun's first failure
    (rank, exit code, signal), in the shape torchrun_launch's status returns."
  - "C(state=cancelled), on the head: C(scancel) of the recorded job id only, then waits until Slurm no longer runs
    it and removes the record (a recorded job that already ended: only the record is removed). Another job of
    Slurm, whoever submitted it, is never touched."
  - "C(state=collected), read-only, on every node: the Slurm files of the job for collect.yml, in job_collect's
    I(files) shape: the record C(slurm.json) and the batch output C(slurm-<id>.out) (on the head), and Slurm's own
    view C(scontrol show job). Read without following links, each capped at I(file_max_bytes)."
  - Every command is an argument list; nothing is run through a shell.
version_added: "1.1.0"
author: trainyard
extends_documentation_fragment: [trainyard.core.attributes.job]
attributes:
  check_mode:
    support: full
    description: prepared and submitted report what they would write and run; status reads only.
  diff_mode:
    support: none
  idempotent:
    support: full
    description: prepared rewrites identical files; submitted leaves a job Slurm still holds alone.
options:
  state:
    description: What to do (see the description).
    type: str
    choices: [prepared, submitted, status, cancelled, collected]
    default: status
  nnodes:
    description: Number of nodes (C(cluster_model.nnodes)). Required for C(prepared).
    type: int
  nproc_per_node:
    description: Ranks per node. Required for C(prepared).
    type: int
  node_rank:
    description: This node's rank (C(cluster_model.node_rank)). Required for C(prepared).
    type: int
  master_addr:
    description: The head's data address (C(cluster_model.master_addr)).
    type: str
  master_port:
    description: Rendezvous port.
    type: int
    default: 29500
  rdzv_id:
    description: Rendezvous id.
    type: str
    default: ""
  max_restarts:
    description: torchrun C(--max_restarts).
    type: int
    default: 0
  torchrun:
    description: torchrun as an argument list, inside the container.
    type: list
    elements: str
    default: [torchrun]
  extra_torchrun_args:
    description: More torchrun options, before the entry point.
    type: list
    elements: str
    default: []
  entrypoint:
    description: The training script. Required for C(prepared).
    type: str
  args:
    description: The entry point's arguments.
    type: list
    elements: str
    default: []
  env_files:
    description: Node-local env files (KEY=value lines, for example the rendered C(nccl.env)), read on the node.
    type: list
    elements: path
    default: []
  env:
    description: More environment variables (after the env files).
    type: dict
    default: {}
  secret_env_file:
    description: Host-only secrets file; docker reads it on the node (C(docker exec --env-file)); values never shown.
    type: path
    default: ""
  resume_from:
    description: Checkpoint to resume from (C(TRAINYARD_RESUME_FROM) and I(resume_arg)); empty starts fresh.
    type: str
    default: ""
  resume_arg:
    description: Entry point flag that receives the checkpoint path too.
    type: str
    default: ""
  chdir:
    description: Working directory inside the container.
    type: str
    default: ""
  container:
    description: The training container (role container). Required for C(prepared).
    type: str
  docker:
    description: The docker CLI on the node.
    type: str
    default: docker
  python:
    description: The node's Python that runs the runner (the sbatch script's interpreter).
    type: str
    default: /usr/bin/python3
  nodes:
    description: Slurm node names of the job, in node-rank order. Required for C(submitted).
    type: list
    elements: str
    default: []
  exclude:
    description: Slurm node names never to allocate (the nodes the inventory excluded).
    type: list
    elements: str
    default: []
  partition:
    description: Slurm partition; empty takes the default partition.
    type: str
    default: ""
  time_limit:
    description: sbatch C(--time); empty takes the partition's.
    type: str
    default: ""
  sbatch_args:
    description: More sbatch options (C(--account=...), C(--qos=...)).
    type: list
    elements: str
    default: []
  srun_args:
    description: More srun options for the job step.
    type: list
    elements: str
    default: []
  job_id:
    description: For C(status) on a node that did not submit; empty reads the node's own C(slurm.json).
    type: str
    default: ""
  stop_timeout:
    description: Seconds C(cancelled) waits for Slurm to end the job.
    type: int
    default: 90
  marker:
    description: C(status) returns the first line of this node's log matching this regex as I(marker_line) (the
      launch waits for the rendezvous or first-step marker with it); empty matches nothing.
    type: str
    default: ""
  file_max_bytes:
    description: C(collected) reads at most this many bytes of each file (the last ones).
    type: int
    default: 1048576
  log:
    description: This node's log of the job (the torchrun backend's, so collect and progress read it as theirs).
    type: path
  log_lines:
    description: Lines of the node's log returned with a failure.
    type: int
    default: 30
"""

EXAMPLES = r"""
- name: Write this node's task of the job
  slurm_job:
    state: prepared
    job: train
    nnodes: "{{ cluster_model.nnodes }}"
    nproc_per_node: "{{ cluster_model.nproc_per_node }}"
    node_rank: "{{ cluster_model.node_rank }}"
    master_addr: "{{ cluster_model.master_addr }}"
    entrypoint: /srv/code/ddp_train.py
    env_files: [/var/lib/trainyard/train/job-ro/nccl.env]
    container: trainyard-train

- name: Submit it
  slurm_job:
    state: submitted
    job: train
    nodes: [node1, node2, node3]
    exclude: [node4]
  run_once: true
  delegate_to: node1

- name: Cancel this job only
  slurm_job:
    state: cancelled
    job: train
"""

RETURN = r"""
job_id:
  description: Slurm's id of the job (submitted, status, cancelled).
  returned: when a job is recorded or submitted
  type: str
  sample: "42"
argv:
  description: The sbatch argv (submitted) or this node's docker exec argv with secret-looking values redacted (prepared).
  returned: submitted, prepared
  type: list
  elements: str
slurm_state:
  description: Slurm's state of the job (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...); empty when unknown.
  returned: status, cancelled, submitted
  type: str
files:
  description: C(collected) only; [{name, size, truncated, skipped, content (base64)}] as job_collect returns them.
  returned: collected
  type: list
  elements: dict
state:
  description: This node's state for status.yml (running, finished, failed, absent).
  returned: status
  type: str
workers:
  description: Rank processes torchrun runs on this node now (the job's processes, found by its launch token).
  returned: status
  type: int
failure:
  description: torchrun's first failure in this node's log (rank, local_rank, exitcode, signal, traceback), or null.
  returned: status
  type: dict
marker_line:
  description: The first line of this node's log matching I(marker), or null.
  returned: status
  type: str
log:
  description: This node's log of the job.
  returned: always
  type: str
"""

import base64
import contextlib
import fcntl
import inspect
import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg
from ansible_collections.trainyard.core.plugins.module_utils import slurm as sl
from ansible_collections.trainyard.core.plugins.module_utils import slurm_node as runner
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr

# The tail of a node's log read back (the job writes it: read without following links, capped).
LOG_MAX_BYTES = 2 * 1024 * 1024


class SlurmJob(object):
    def __init__(self, module):
        self.m = module
        self.p = module.params
        try:
            self.job = tr.validate_job_name(self.p["job"])
        except tr.LaunchError as e:
            module.fail_json(msg=str(e))
        lay = tr.job_layout(self.p["state_root"], self.job)
        self.dir, self.rw = lay["dir"], lay["rw"]
        self.sub = os.path.join(self.dir, sl.SUBDIR)
        self.record_path = os.path.join(self.dir, sl.RECORD_FILE)
        self.log = self.p["log"] or os.path.join(self.rw, sl.LOG_FILE)
        self.script = os.path.join(self.sub, sl.RUNNER_FILE)
        self.node_spec = os.path.join(self.sub, sl.NODE_SPEC_FILE)
        self.result = {"changed": False, "job": self.job, "log": self.log}

    def fail(self, msg, **kw):
        kw.update(self.result)
        self.m.fail_json(msg=msg, **kw)

    def run(self, argv):
        rc, out, err = self.m.run_command(argv)
        return rc, out, err

    # ---------------------------------------------------------------- prepared
    def prepared(self):
        p = self.p
        for name in ("nnodes", "nproc_per_node", "node_rank", "entrypoint", "container"):
            if p[name] in (None, ""):
                self.fail("state=prepared needs %s (the launch role passes it from the cluster model)" % name)
        try:
            command = tr.build_command(p["nnodes"], p["nproc_per_node"], p["node_rank"], p["master_addr"],
                                       p["master_port"], p["entrypoint"], p["args"], rdzv_id=p["rdzv_id"],
                                       max_restarts=p["max_restarts"], torchrun=p["torchrun"],
                                       extra_torchrun_args=p["extra_torchrun_args"],
                                       resume_path=p["resume_from"] or None, resume_arg=p["resume_arg"])
            extra = tr.validate_env(p["env"])
        except tr.LaunchError as e:
            self.fail(str(e))
        file_envs = []
        for path in p["env_files"]:
            try:
                with open(path) as f:
                    env, problems = tr.parse_env_file(f.read(), path)
            except (IOError, OSError) as e:
                self.fail("env file %s is unreadable (%s): run the render play (site.yml) first" % (path, e))
            if problems:
                self.fail("; ".join(problems))
            file_envs.append(env)
        env = tr.merge_env(file_envs, extra, p["resume_from"] or None)
        try:
            env_text = sl.env_file_text(env)
        except sl.SlurmError as e:
            self.fail(str(e))
        env_path = os.path.join(self.sub, sl.ENV_FILE)
        spec = {"job": self.job, "node_rank": p["node_rank"], "container": p["container"], "docker": p["docker"],
                "argv": command, "env_file": env_path, "secret_env_file": p["secret_env_file"] or "",
                "chdir": p["chdir"], "log": self.log}
        shown = runner.docker_argv(spec, "slurm-<job id>")
        self.result.update(argv=shown, command_line=tr.shell_quote(shown), resume_from=p["resume_from"],
                           node_rank=p["node_rank"], env=tr.redact_env(env))
        text = json.dumps(spec, indent=2, sort_keys=True) + "\n"
        source = "#!%s\n%s" % (p["python"], inspect.getsource(runner))
        if self.differs(self.node_spec, text) or self.differs(self.script, source) or self.differs(env_path, env_text):
            self.result["changed"] = True
            if not self.m.check_mode:
                for d, mode in ((self.dir, 0o750), (self.sub, 0o700), (self.rw, 0o755)):
                    if not os.path.isdir(d):
                        os.makedirs(d, mode)
                tr.write_atomic(env_path, env_text, 0o600)
                tr.write_atomic(self.node_spec, text, 0o600)
                tr.write_atomic(self.script, source, 0o700)
        return self.result

    @staticmethod
    def differs(path, text):
        try:
            with open(path) as f:
                return f.read() != text
        except (IOError, OSError):
            return True

    # ---------------------------------------------------------------- Slurm's view
    def load_record(self):
        if not os.path.exists(self.record_path):
            return None
        try:
            with open(self.record_path) as f:
                return sl.parse_record(f.read())
        except (IOError, OSError, ValueError) as e:
            self.fail("%s is unreadable (%s): check `squeue --name trainyard-%s`, scancel that job by its id, then "
                      "remove the file" % (self.record_path, e, self.job))

    def slurm_state(self, job_id):
        """(state, reason): squeue while Slurm holds the job, else scontrol show job (kept MinJobAge after the end),
        else sacct where accounting runs; ('', why) when none knows it."""
        rc, out, err = self.run(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%R"])
        if rc == 0:
            row = sl.parse_squeue(out).get(job_id)
            if row:
                return row
        rc, out, err = self.run(["scontrol", "show", "job", "-o", job_id])
        if rc == 0 and out.strip():
            info = sl.parse_scontrol(out)
            if info.get("JobState"):
                return info["JobState"], info.get("Reason", "")
        rc, out2, err2 = self.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])
        if rc == 0 and out2.strip():
            return out2.split()[0], ""
        return "", (err or err2 or "Slurm does not know job %s" % job_id).strip()[-200:]

    # ---------------------------------------------------------------- submitted
    @contextlib.contextmanager
    def submit_lock(self):
        """Held from reading the record to writing it: a second submitter (another shard, another controller) waits
        here and then finds the first one's job, instead of submitting a second. A lock file in the host-only
        directory of the task (never job-writable), opened without following a link; the kernel drops it when the
        module ends, however it ends."""
        if self.m.check_mode:
            yield
            return
        if not os.path.isdir(self.sub):
            self.fail("%s is missing: run slurm_job state=prepared on every node first" % self.script)
        fd = os.open(os.path.join(self.sub, sl.SUBMIT_LOCK_FILE),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def submitted(self):
        with self.submit_lock():
            return self._submitted()

    def _submitted(self):
        p = self.p
        rec = self.load_record()
        if rec:
            state, reason = self.slurm_state(rec["job_id"])
            if sl.is_active(state):
                self.result.update(job_id=rec["job_id"], slurm_state=state, argv=rec["argv"],
                                   msg="job %s is Slurm job %s (%s): left alone" % (self.job, rec["job_id"], state))
                return self.result
        batch_spec = os.path.join(self.sub, sl.BATCH_SPEC_FILE)
        try:
            argv = sl.sbatch_argv("sbatch", self.job, p["nodes"], p["exclude"],
                                  os.path.join(self.sub, "slurm-%j.out"), self.script, batch_spec,
                                  p["partition"], p["time_limit"], p["sbatch_args"])
        except sl.SlurmError as e:
            self.fail(str(e))
        self.result.update(changed=True, argv=argv, command_line=tr.shell_quote(argv))
        if self.m.check_mode:
            return self.result
        if not os.path.exists(self.script):
            self.fail("%s is missing: run slurm_job state=prepared on every node first" % self.script)
        batch = {"nnodes": len(p["nodes"]), "script": self.script, "node_spec": self.node_spec,
                 "python": p["python"], "srun_args": p["srun_args"]}
        tr.write_atomic(batch_spec, json.dumps(batch, indent=2, sort_keys=True) + "\n", 0o600)
        rc, out, err = self.run(argv)
        if rc != 0:
            self.fail("sbatch failed (rc %d): %s" % (rc, (err or out).strip()[-500:]), cmd=argv)
        try:
            job_id = sl.parse_job_id(out)
        except sl.SlurmError as e:
            self.fail(str(e), cmd=argv)
        tr.write_atomic(self.record_path, json.dumps(sl.record(self.job, job_id, time.time(), p["nodes"],
                                                               p["exclude"], argv), indent=2) + "\n", 0o600)
        state, reason = self.slurm_state(job_id)
        self.result.update(job_id=job_id, slurm_state=state, msg="job %s submitted as Slurm job %s" % (self.job, job_id))
        return self.result

    # ---------------------------------------------------------------- status
    def status(self):
        job_id = self.p["job_id"]
        if not job_id:
            rec = self.load_record()
            job_id = rec["job_id"] if rec else ""
        if not job_id:
            self.result.update(state="absent", slurm_state="", node_rank=None, last_log_line="",
                               msg="no Slurm job of %s recorded" % self.job)
            return self.result
        if not sl.valid_job_id(job_id):
            self.fail("job_id %r is not a Slurm job id" % job_id)
        slurm_state, reason = self.slurm_state(job_id)
        text = tr.read_untrusted(self.log, limit=LOG_MAX_BYTES, tail=True).decode("utf-8", "replace") \
            if os.path.exists(self.log) else ""
        text = sl.this_job_log(text, job_id)
        failure = tr.root_cause(text)
        spec = {}
        try:
            with open(self.node_spec) as f:
                spec = json.load(f)
        except (IOError, OSError, ValueError):
            pass
        if failure is not None:
            failure["node_rank"] = spec.get("node_rank")
            failure["sort_key"] = [k if k != float("inf") else 1e18 for k in tr.failure_sort_key(failure)]
        try:
            marker = tr.find_marker(text, tr.validate_regex("marker", self.p["marker"]) or "")
        except tr.LaunchError as e:
            self.fail(str(e))
        exit_code = sl.node_exit(text)
        stats = [pg.read_stat(pid) for pid in runner.token_holders("slurm-%s" % job_id)]
        workers = sl.workers([(st.pid, st.ppid) for st in stats if st is not None])
        state = sl.node_state(slurm_state or "UNKNOWN", exit_code, failure)
        self.result.update(job_id=job_id, slurm_state=slurm_state, slurm_reason=reason, state=state,
                           node_rank=spec.get("node_rank"), failure=failure, exit={"exitcode": exit_code},
                           last_log_line=tr.last_line(text), marker_line=marker, pid=None, workers=workers)
        if state != "running" or failure:
            self.result["log_tail"] = tr.failure_tail(text, self.p["log_lines"]) if failure else \
                tr.log_tail(text, self.p["log_lines"])
        return self.result

    # ---------------------------------------------------------------- cancelled
    def cancelled(self):
        rec = self.load_record()
        if not rec:
            self.result.update(msg="no Slurm job of %s recorded: nothing to cancel" % self.job)
            return self.result
        job_id = rec["job_id"]
        state, reason = self.slurm_state(job_id)
        self.result.update(job_id=job_id, slurm_state=state, changed=True)
        if not sl.is_active(state):
            self.result["msg"] = "Slurm job %s of %s is %s: nothing to cancel, record removed" % (
                job_id, self.job, state or "gone")
            if not self.m.check_mode:
                os.unlink(self.record_path)
            return self.result
        if self.m.check_mode:
            return self.result
        rc, out, err = self.run(["scancel", job_id])
        if rc != 0:
            self.fail("scancel %s failed (rc %d): %s" % (job_id, rc, (err or out).strip()[-300:]))
        deadline = time.monotonic() + self.p["stop_timeout"]
        while time.monotonic() < deadline:
            state, reason = self.slurm_state(job_id)
            if not sl.is_active(state):
                break
            time.sleep(1)
        self.result.update(slurm_state=state, msg="Slurm job %s of %s cancelled (%s)" % (job_id, self.job, state))
        if sl.is_active(state):
            self.fail("Slurm job %s is still %s %d s after scancel: see `scontrol show job %s` and the slurmd log "
                      "of its nodes" % (job_id, state, self.p["stop_timeout"], job_id))
        os.unlink(self.record_path)  # the job is over: the next launch submits afresh, the next reset has nothing to do
        return self.result


    # ---------------------------------------------------------------- collected
    def collected(self):
        files = []
        cap = self.p["file_max_bytes"]

        def add(name, data, skipped=""):
            entry = {"name": name, "size": len(data or b""), "truncated": len(data or b"") > cap,
                     "skipped": "" if data is not None else skipped}
            if data is not None:
                entry["content"] = base64.b64encode(data[-cap:]).decode("ascii")
            files.append(entry)

        rec = self.load_record() if os.path.exists(self.record_path) else None
        if rec:
            with open(self.record_path, "rb") as f:
                add("slurm/" + sl.RECORD_FILE, f.read(cap + 1))
            out = os.path.join(self.sub, "slurm-%s.out" % rec["job_id"])
            data = tr.read_untrusted(out, limit=cap + 1, tail=True)
            add("slurm/slurm-%s.out" % rec["job_id"], data if data or os.path.exists(out) else None,
                "no batch output at %s" % out)
            rc, text, err = self.run(["scontrol", "show", "job", rec["job_id"]])
            add("slurm/scontrol-show-job.txt", (text if rc == 0 else err or "").encode("utf-8", "replace"))
            self.result["job_id"] = rec["job_id"]
        self.result["files"] = files
        return self.result


def main():
    module = AnsibleModule(
        argument_spec=pg.job_args(**tr.command_options(
            state=dict(type="str", default="status", choices=["prepared", "submitted", "status", "cancelled"]),
            env_files=dict(type="list", elements="path", default=[]),
            env=dict(type="dict", default={}),
            secret_env_file=dict(type="path", default=""),
            resume_from=dict(type="str", default=""),
            resume_arg=dict(type="str", default=""),
            chdir=dict(type="str", default=""),
            container=dict(type="str"),
            docker=dict(type="str", default="docker"),
            python=dict(type="str", default="/usr/bin/python3"),
            nodes=dict(type="list", elements="str", default=[]),
            exclude=dict(type="list", elements="str", default=[]),
            partition=dict(type="str", default=""),
            time_limit=dict(type="str", default=""),
            sbatch_args=dict(type="list", elements="str", default=[]),
            srun_args=dict(type="list", elements="str", default=[]),
            job_id=dict(type="str", default=""),
            stop_timeout=dict(type="int", default=90),
            marker=dict(type="str", default=""),
            file_max_bytes=dict(type="int", default=1 << 20),
            log=dict(type="path"),
            log_lines=dict(type="int", default=30),
        )),
        supports_check_mode=True,
    )
    job = SlurmJob(module)
    module.exit_json(**getattr(job, module.params["state"])())


if __name__ == "__main__":
    main()
