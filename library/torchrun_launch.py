#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module torchrun_launch: start, stop and inspect one node's torchrun agent of a multi-node job."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: torchrun_launch
short_description: Start, stop or inspect this node's torchrun agent of a multi-node training job
description:
  - Builds the torchrun command from typed parameters (node count, processes per node, this node's rank, the
    rendezvous endpoint) and starts it detached in a session of its own, so it outlives the Ansible connection.
    Output goes to a node-local log; C(<state_root>/<job>/launch.json) records PID, process group, start time,
    command and sidecars.
  - "Runtime C(host) runs torchrun on the node; runtime C(docker) runs it inside the long-lived training
    container (which must use C(pid_mode=host)) through C(docker exec -d) and a small launcher written into the
    job's read-only directory C(<state_root>/<job>/job-ro) (the container mounts it read-only; C(job-rw) is the
    only part it may write: the log and the launcher's pid and exit records, which are read back as untrusted
    data). C(<state_root>/<job>) itself holds the host-only state (C(launch.json), sidecar records) and is never
    mounted. Either way the job's processes are tracked by PID plus start time and a launch token in
    their environment, never by name."
  - Idempotent. The same job with the same command already running is left alone (C(changed=false)); another
    job holding the node, or this job running with a different command, makes the task fail and say how to stop
    it. Stopping sends SIGTERM to every process of the job and its sidecars, SIGKILL after C(stop_timeout).
  - C(state=status) reports running/finished/failed, the last log line, and torchrun's first observed failure
    (rank, exit code, signal) with the log tail.
  - "Fail fast across nodes (C(nnodes) > 1, not elastic): the launcher joins, as a plain client, the store the head's
    torchrun serves at C(master_addr:master_port). A node whose torchrun fails records its root cause there; every
    other node's launcher then stops its own torchrun within seconds (also when the head's store has been gone for
    5 s), and its exit record (C(peer_stop)) says why; C(state=status) returns it under C(exit)."
version_added: "1.0.0"
author: trainyard
extends_documentation_fragment: [trainyard.core.attributes.job]
options:
  state:
    description: C(started) launches (or leaves a matching running job alone), C(stopped) ends the job, C(status) only reports.
    type: str
    choices: [started, stopped, status]
    default: started
  nnodes:
    description: Number of nodes (C(cluster_model.nnodes)). Required for C(state=started).
    type: int
  nproc_per_node:
    description: Processes (ranks) per node (C(cluster_model.nproc_per_node)). Required for C(state=started).
    type: int
  node_rank:
    description: This node's rank (C(cluster_model.node_rank)). Required for C(state=started).
    type: int
  master_addr:
    description: Rendezvous host, the head's data address (C(cluster_model.master_addr)).
    type: str
  master_port:
    description: Rendezvous port.
    type: int
    default: 29500
  rdzv_backend:
    description: C(static) takes node ranks from C(node_rank); C(c10d) lets torchrun assign them.
    type: str
    choices: [static, c10d]
    default: static
  rdzv_id:
    description: Rendezvous id (C(--rdzv_id)); empty leaves torchrun's default.
    type: str
    default: ""
  min_nnodes:
    description:
      - torchrun's elastic mode (C(rdzv_backend=c10d) only) C(--nnodes=min_nnodes:nnodes); 0 keeps a fixed size.
      - "Elastic restarts the ranks from the entry point's start (restart is not resume): the job must load its own
        checkpoint, and a ZeRO checkpoint of another world size needs the conversion C(playbooks/recover.yml) does."
    type: int
    default: 0
  max_restarts:
    description: torchrun C(--max_restarts). 0 fails the job at the first rank failure; a job that resumes from its checkpoints may raise it.
    type: int
    default: 0
  torchrun:
    description: The torchrun executable as an argument list (for example C([python3, -m, torch.distributed.run])).
    type: list
    elements: str
    default: [torchrun]
  extra_torchrun_args:
    description: More torchrun options, placed before the entry point.
    type: list
    elements: str
    default: []
  entrypoint:
    description: The training script (C(train_args_entrypoint)). Required for C(state=started).
    type: str
  args:
    description: The entry point's arguments (C(train_args_argv)).
    type: list
    elements: str
    default: []
  env_files:
    description: Node-local env files (KEY=value lines) applied in order, for example the rendered C(nccl.env).
    type: list
    elements: path
    default: []
  env:
    description: More environment variables for the job (applied after the env files).
    type: dict
    default: {}
  secret_env_file:
    description:
      - Host-only file of secrets for the job (C(KEY=value) lines, taken literally), mode 0600 or stricter; the
        launch role's start writes it from C(launch_secret_env) (ansible-vault values) in the same task
        (I(write_secret_env)).
      - Its variables reach the job's environment (runtime C(host) through the launcher, runtime C(docker)
        through C(docker exec --env-file), so the file never needs to be inside the container). Their values
        never appear in the result, the launch spec, C(launch.json) or the log lines this module writes; only
        their names are returned (I(secret_env)). Changing a value does not make the running job another job.
      - With I(secret_env_mode=file) the values reach the job as files instead (see there).
    type: path
  release_lock:
    description:
      - "The node's cluster lock to give back once the start is confirmed (I(confirm)), C({path, token})
        (C(cluster_lock_dir) and the run's token): the launch is the node's last change of the run, so the release
        needs no round trip of its own. C(lock_released) says whether it was given back. A lock of another run is
        never touched; check mode, a failed start and a failed confirmation release nothing."
    type: dict
    default: {}
  write_secret_env:
    description:
      - The action's, not the module's (the module never sees it); with I(state=started) and I(secret_env_file), write
        that file first in the same task, from the launch role's C(launch_secret_env) (C(KEY=value) lines, 0600, in its
        directory made 0700), read by the action itself so that no value is in a task argument, a result or the
        node's log. The result says C(secret_env_file_changed).
    type: bool
    default: false
  secret_env_mode:
    description:
      - "C(env): the variables of I(secret_env_file) go into the job's environment, where any process of the job
        and anyone with the job's uid (or root) can read them in C(/proc/PID/environ), every child process
        inherits them and tools that dump the environment show them."
      - "C(file): each variable becomes a file C(<secrets_dir>/<NAME>) (mode 0400, owner I(secrets_uid), in a 0500
        directory of that owner, rewritten on each start); the job gets C(TRAINYARD_SECRETS_DIR=<secrets_dir>) (the
        path, no value) and reads C($TRAINYARD_SECRETS_DIR/<NAME>). No value enters any environment. Runtime
        C(docker) needs the container to mount I(secrets_dir) read-only at the same path (checked before the start)."
    type: str
    choices: [env, file]
    default: env
  stale_secret_env_file:
    description:
      - The secrets file an earlier launch of this job was given, removed (a directory there with what is below it,
        as C(ansible.builtin.file) C(state=absent) would; a link is removed, never followed) when I(state=started)
        and I(secret_env_file) is empty (the job has no secrets now); ignored otherwise. In check mode it is only
        reported (C(stale_secret_env_file_removed), C(changed)).
      - Done before the start is judged, so it happens also where the job already runs with this command.
    type: path
    default: ""
  secrets_dir:
    description: Directory of the secret files for I(secret_env_mode=file); default C(secrets/) beside I(secret_env_file).
      Its parent must exist (the launch role's host-only 0700 directory on the /run tmpfs). A start without secret
      files and a stop empty it (it stays, as the container mounts it).
    type: path
  secrets_uid:
    description:
      - Owner (uid; the gid is the same unless the container's user names one) of the secret files, the uid the job
        runs as.
      - C(-1) (the default) takes the training container's user (C(docker inspect), C(Config.User) as C(uid:gid)) with
        runtime docker, root (0) with runtime host or a container whose user is root or a name.
    type: int
    default: -1
  first_launch_env:
    description:
      - Variables for this node's first launch of the job only (no state file from an earlier launch), applied
        after the env files and before C(env). The launch role passes NCCL_DEBUG=INFO here under
        C(nccl_env_debug=auto), so the first start logs NCCL's choices while the env file stays the same.
      - Not part of the job's identity (a later run sees the same job running).
    type: dict
    default: {}
  chdir:
    description: Working directory of the job (on the node, or inside the container).
    type: path
  log:
    description: Node-local log of the job. Default C(<state_root>/<job>/job-rw/torchrun.log). Rotated on each start (.1 .. .5).
    type: path
  runtime:
    description: Where torchrun runs.
    type: str
    choices: [host, docker]
    default: host
  container:
    description: Training container for C(runtime=docker).
    type: str
    default: ""
  container_python:
    description: Python inside the container that runs the launcher.
    type: str
    default: python3
  docker:
    description: docker CLI on the node.
    type: str
    default: docker
  sidecars:
    description:
      - Helper processes started on the host (not in the container) with the job, each in its own session,
        recorded in the state file, reported by status and stopped with the job (for example the checkpoint janitor).
      - Each item is C({name, argv}); output goes to C(<state_root>/<job>/<name>.log) (host-only). A sidecar that
        must not run as root drops its privileges itself (the janitor runs under C(setpriv)).
    type: list
    elements: dict
    default: []
  wait_for:
    description:
      - C(none) returns once started. C(rendezvous) waits until this node's agent passed the rendezvous (its
        C(nproc_per_node) worker processes exist, or C(rendezvous_marker) appears in the log).
        C(first_step) waits for C(first_step_marker) in the log.
      - Fails with the log tail when the job dies or C(wait_timeout) passes.
    type: str
    choices: [none, rendezvous, first_step]
    default: none
  wait_timeout:
    description: Seconds to wait for C(wait_for).
    type: int
    default: 300
  confirm:
    description:
      - "C(state=started): confirm the launch in the same task. Fail, naming the node rank, the job's state, its log
        and the log's tail, unless the job now runs or finished (any state in check mode) with I(node_rank) (a job
        left running with another rank fails too); else C(msg) says where the job runs: node rank, state, pid,
        resume point, log. The action plugin of the same name puts the node's name before a failure and shows C(msg)
        without C(-v)."
    type: bool
    default: false
  first_step_marker:
    description: Regex of the log line the entry point prints after its first optimizer step.
    type: str
    default: "trainyard: first step done"
  rendezvous_marker:
    description: Optional regex of a log line that proves the rendezvous completed.
    type: str
    default: ""
  resume_from:
    description:
      - Checkpoint the entry point resumes from. Empty starts fresh; C(auto) takes the latest complete checkpoint
        under C(output_root) (module_utils/checkpoints.py); anything else is used as the path.
      - The entry point receives it as C(TRAINYARD_RESUME_FROM) and, with C(resume_arg), as an argument.
    type: str
    default: ""
  output_root:
    description: Output root searched by C(resume_from=auto).
    type: path
  resume_arg:
    description: Entry point flag for the resume path (for example C(--resume_from_checkpoint)); ending in C(=) joins flag and path.
    type: str
    default: ""
  rerun_finished:
    description: Start again when the last run of the same command finished successfully (default leaves it finished).
    type: bool
    default: false
  stop_timeout:
    description: Seconds between SIGTERM and SIGKILL when stopping.
    type: int
    default: 30
  log_lines:
    description: Lines of log tail returned on failure and by status.
    type: int
    default: 30
attributes:
  check_mode:
    support: full
    details:
      - Returns the exact command and environment; starts and stops nothing.
      - With C(state=started), C(plan) says what the run would do (start, leave running, relaunch, leave finished,
        or stop here because the job runs with another command) and from which checkpoint it would resume; an
        env file the run has not rendered yet is named in C(plan.env_files_pending) instead of failing.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: A matching running (or finished) job is left alone.
notes:
  - With C(runtime=docker) the container must run with C(pid_mode=host) and mount C(<state_root>/<job>/job-ro)
    (read-only) and C(<state_root>/<job>/job-rw) at the same paths (role container does).
  - Nothing is found or killed by process name; a decoy process named torchrun is never touched.
"""

EXAMPLES = r"""
- name: Start torchrun on every node (ranks from the cluster model)
  torchrun_launch:
    job: train
    state_root: /var/lib/trainyard
    nnodes: "{{ cluster_model.nnodes }}"
    nproc_per_node: "{{ cluster_model.nproc_per_node }}"
    node_rank: "{{ cluster_model.node_rank }}"
    master_addr: "{{ cluster_model.master_addr }}"
    master_port: "{{ cluster_model.master_port }}"
    entrypoint: /srv/code/ddp_train.py
    args: [--steps, "100", --output-root, /srv/outputs]
    env_files: [/var/lib/trainyard/train/job-ro/nccl.env]
    runtime: docker
    container: trainyard-train
    resume_from: auto
    output_root: /srv/outputs
    wait_for: rendezvous

- name: Job status
  torchrun_launch:
    job: train
    state: status
  register: job

- name: Stop the job (every process of it, nothing else)
  torchrun_launch:
    job: train
    state: stopped
"""

RETURN = r"""
state:
  description: Job state on this node after the task (running, finished, failed, stopped, absent).
  returned: always
  type: str
cgroup_tracking:
  description: "Runtime docker: C(pass) when the training container's id and init were recorded, so stop and reset
    find every process in its cgroup; C(skip: <why>) when not (a warning too)."
  returned: on a start with runtime docker
  type: str
lock_released:
  description: This call gave back the node's cluster lock (I(release_lock)).
  returned: state=started
  type: bool
stale_secret_env_file_removed:
  description: I(stale_secret_env_file) was there and is removed (in check mode, would be).
  returned: state=started with stale_secret_env_file and no secret_env_file
  type: bool
secrets_dir:
  description: The directory of the job's secret files (I(secret_env_mode=file)); names only inside, never a value here.
  returned: on a start with secret_env_mode=file and secrets
  type: str
secrets_mount:
  description: "Runtime docker with I(secret_env_mode=file): C(pass) when the container mounts I(secrets_dir)
    read-only; C(skip: ...) in check mode."
  returned: on a start with secret_env_mode=file, runtime docker and secrets
  type: str
pid:
  description: PID of the job's session leader (the launcher; torchrun is its child).
  returned: when a job is known
  type: int
pgid:
  description: Process group (and session) of the job.
  returned: when a job is known
  type: int
node_rank:
  description: This node's rank.
  returned: when a job is known
  type: int
command:
  description: The torchrun command as an argument list.
  returned: when a job is known or would be started
  type: list
  elements: str
command_line:
  description: The same command quoted for a shell (display only).
  returned: when a command is known
  type: str
env:
  description:
    - Environment added for the job (env files, then C(env), then the resume path); in check mode and on start.
    - Values of names that look secret (token, secret, password, key, credential, auth, ...) show as C(********).
  returned: state=started
  type: dict
secret_env:
  description: Names (never values) of the variables from I(secret_env_file).
  returned: state=started with secret_env_file
  type: list
  elements: str
log:
  description: Node-local log path.
  returned: always
  type: str
log_tail:
  description: Last lines of the log.
  returned: on failure and with state=status
  type: str
last_log_line:
  description: Last non-empty log line.
  returned: state=status
  type: str
latest_checkpoint:
  description: Latest complete checkpoint under C(output_root) ("" when none); state=status with output_root.
  returned: state=status and output_root given
  type: str
failure:
  description:
    - The failure on this node that most likely caused the others (rank, local_rank, exitcode, signal, pid, time,
      host, traceback, node_rank, sort_key). A rank killed by a signal comes before an error of its own, which
      comes before a communication error or a SIGTERM from torchrun's teardown; then the earliest time.
  returned: when the log reports one
  type: dict
resume_from:
  description: Checkpoint passed to the entry point ("" when none).
  returned: state=started
  type: str
processes:
  description: Live processes of the job (pid, comm, ppid, pgrp).
  returned: state=status
  type: list
sidecars:
  description: Sidecars with pid and whether they run.
  returned: when a job is known
  type: list
plan:
  description:
    - Check mode, C(state=started) - what the run would do on this node. C(action) is C(start) (no earlier launch),
      C(relaunch) (the earlier launch ended; C(reason) says how, and whether the command fingerprint changed),
      C(leave_running) (the same job runs), C(leave_finished) (it finished with this command), or C(blocked) (the
      job runs with another command, so the run stops there; C(reason) says how to stop it). C(resume_from) is the
      checkpoint it would resume from ("" from scratch); C(summary) is one line of all that.
  returned: check mode with state=started
  type: dict
stopped:
  description: PIDs that got SIGTERM / SIGKILL.
  returned: state=stopped
  type: dict
"""

import inspect
import json
import os
import sys
import time
import uuid

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils import cluster_lock
from ansible_collections.trainyard.core.plugins.module_utils import launcher as launcher_script
from ansible_collections.trainyard.core.plugins.module_utils import failfast as failfast_script
from ansible_collections.trainyard.core.plugins.module_utils import jobtree as jt
from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
from ansible_collections.trainyard.core.plugins.module_utils.checkpoints import (
    ensure_deepspeed_latest, latest_complete_checkpoint,
)

PID_FILE_WAIT = 20.0
SECRETS_DIR_ENV = "TRAINYARD_SECRETS_DIR"


def container_user_ids(user):
    """(uid, gid) of a container's Config.User: "uid:gid" or "uid" numeric; root for "", "root" or a name (the
    engine would look a name up in the image's passwd, which the host cannot read)."""
    uid, _sep, gid = user.partition(":")
    if not uid.isdigit():
        return 0, 0
    return int(uid), int(gid) if gid.isdigit() else int(uid)


def write_secret_files(path, values, uid, gid):
    """Write ``values`` ({NAME: value}) as files ``path/NAME`` (0400, owner uid:gid) in the directory ``path`` (0500,
    same owner), created if missing; entries of names not in ``values`` are removed. Everything goes through
    descriptors: the parent and the directory are opened with O_NOFOLLOW|O_DIRECTORY, each file is created
    exclusively (O_CREAT|O_EXCL|O_NOFOLLOW) under a temporary name, fchown/fchmod-ed, then renamed over the name, so
    a planted link is replaced and never followed. Names must be environment variable names."""
    for name in values:
        if not name or "/" in name or name.startswith("."):
            raise ValueError("secret name %r cannot name a file" % (name,))
    parent, base = os.path.split(os.path.normpath(path))
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    pfd = os.open(parent, flags)
    try:
        try:
            os.mkdir(base, 0o700, dir_fd=pfd)
        except FileExistsError:
            pass
        dfd = os.open(base, flags, dir_fd=pfd)
    finally:
        os.close(pfd)
    try:
        os.fchmod(dfd, 0o700)  # root writes; the job's uid gets r-x at the end
        os.fchown(dfd, 0, 0)
        for entry in os.listdir(dfd):
            if entry not in values:
                os.unlink(entry, dir_fd=dfd)
        for name, value in sorted(values.items()):
            tmp = ".%s.%s.tmp" % (name, os.urandom(4).hex())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400, dir_fd=dfd)
            try:
                data = value.encode("utf-8")
                while data:
                    data = data[os.write(fd, data):]
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o400)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fchown(dfd, uid, gid)
        os.fchmod(dfd, 0o500)
    finally:
        os.close(dfd)


def read_text(path, limit=2 * 1024 * 1024):
    """The last ``limit`` bytes of a log the job writes (untrusted: no symlink followed, regular files only)."""
    return tr.read_untrusted(path, limit, tail=True).decode("utf-8", "replace")


def read_json(path):
    """A record the job's launcher wrote (untrusted: size-capped, no symlink followed, a JSON object or None)."""
    return tr.read_untrusted_json(path)


class Launch(object):
    def __init__(self, module):
        self.m = module
        p = module.params
        self.p = p
        try:
            self.job = tr.validate_job_name(p["job"])
        except tr.LaunchError as e:
            module.fail_json(msg=str(e))
        self.root = p["state_root"]
        lay = tr.job_layout(self.root, self.job)
        # Host-only control state (never mounted into the container); the job's read-only and writable parts.
        self.dir, self.ro_dir, self.rw_dir = lay["dir"], lay["ro"], lay["rw"]
        self.state_path = os.path.join(self.dir, tr.STATE_FILE)
        self.log = p["log"] or os.path.join(self.rw_dir, "torchrun.log")
        self.result = {"changed": False, "log": self.log, "job": self.job}

    # ------------------------------------------------------------------ helpers
    def load_state(self):
        """This job's launch record (tr.read_state, the reader the host probe uses too), None where there is none."""
        try:
            return tr.read_state(self.root, self.job)
        except (IOError, OSError, ValueError) as e:
            self.m.fail_json(msg="%s is unreadable (%s). Remove it after checking no job of %s runs "
                                 "(ansible-playbook reset.yml)." % (self.state_path, e, self.job), **self.result)

    def job_procs(self, state):
        """The job's processes without its sidecars (procgroup.job_procs: find_job's rule, as job_reset's)."""
        return pg.job_procs(state)

    def sidecar_procs(self, sc):
        if not sc.get("pid"):
            return []
        return pg.job_processes(sc["pid"], sc.get("start_ticks"), sc.get("token"))

    def all_procs(self, state):
        """Every process of the job and its sidecars: what stop ends (procgroup.find_job, as job_reset)."""
        return pg.find_job([state])

    def container_identity(self):
        """The training container's id and its init process (PID + start time) from the engine, recorded in
        launch.json so that stop and reset find every process in the container's cgroup (procgroup.find_job).
        Returns ({container_id, container_init_pid, container_init_ticks}, None) or ({}, why not)."""
        rc, out, err = self.m.run_command([self.p["docker"], "inspect", "--format", "{{.Id}} {{.State.Pid}}",
                                           self.p["container"]])
        parts = out.split() if rc == 0 else []
        if len(parts) != 2 or not pg.valid_container_id(parts[0]) or not parts[1].isdigit():
            return {}, "docker inspect %s gave no id and PID (rc %d): %s" % (
                self.p["container"], rc, (err or out).strip()[-200:])
        cid, pid = parts[0], int(parts[1])
        st = pg.read_stat(pid)
        if st is None:
            return {}, "the container's init (PID %d) is not visible in /proc: is pid_mode host?" % pid
        if not pg.in_container_cgroup(pg.read_cgroup(pid), cid):
            return {}, "the container's init (PID %d) does not name the container in /proc/%d/cgroup (%s)" % (
                pid, pid, ", ".join(pg.read_cgroup(pid) or [])[:200])
        return {"container_id": cid, "container_init_pid": pid, "container_init_ticks": st.start_ticks}, None

    def describe(self, state, extra=None):
        procs = self.job_procs(state)
        alive = bool(procs)
        exit_info = read_json(state.get("exit_file") or os.path.join(self.rw_dir, tr.EXIT_FILE))
        if exit_info is not None and exit_info.get("token") != state.get("token"):
            exit_info = None
        text = read_text(state.get("log") or self.log)
        failure = tr.root_cause(text)
        if failure is not None:
            failure["node_rank"] = state.get("node_rank")
            # What the status play orders nodes' failures by (module_utils/torchrun.py failure_sort_key).
            failure["sort_key"] = [k if k != float("inf") else 1e18 for k in tr.failure_sort_key(failure)]
        status = tr.job_status(alive, exit_info, failure)
        out = {
            "state": status, "pid": state["pid"], "pgid": state["pgid"], "node_rank": state.get("node_rank"),
            "command": state["command"], "command_line": tr.shell_quote(state["command"]),
            "log": state.get("log") or self.log, "started_at": state.get("started_at"),
            "resume_from": state.get("resume_from", ""), "runtime": state.get("runtime"),
            "container": state.get("container", ""),
            "processes": [{"pid": p.pid, "comm": p.comm, "ppid": p.ppid, "pgrp": p.pgrp} for p in procs],
            "workers": len([p for p in procs if state.get("torchrun_pid") and p.ppid == state["torchrun_pid"]]),
            "sidecars": [{"name": sc.get("name"), "pid": sc.get("pid"), "argv": sc.get("argv", []),
                          "running": bool(self.sidecar_procs(sc)), "log": sc.get("log")}
                         for sc in state.get("sidecars", [])],
            "last_log_line": tr.last_line(text), "exit": exit_info, "failure": failure,
        }
        if status != "running" or failure:
            out["log_tail"] = tr.failure_tail(text, self.p["log_lines"]) if failure else \
                tr.log_tail(text, self.p["log_lines"])
        if extra:
            out.update(extra)
        return out

    def other_jobs(self):
        """Other jobs of this state root with live processes: [(job, state, procs)]."""
        out = []
        try:
            names = sorted(os.listdir(self.root))
        except OSError:
            return out
        for name in names:
            if name == self.job:
                continue
            path = os.path.join(self.root, name, tr.STATE_FILE)
            if not os.path.isfile(path):
                continue
            try:
                with open(path) as f:
                    st = tr.parse_state(f.read())
            except (IOError, OSError, ValueError):
                continue
            procs = self.job_procs(st)
            if procs:
                out.append((st.get("job", name), st, procs))
        return out

    # ------------------------------------------------------------------ status
    def status(self):
        if self.p["output_root"]:
            self.result["latest_checkpoint"] = self.latest_checkpoint() or ""
        state = self.load_state()
        if state is None:
            self.result.update(state="absent", msg="no job %s on this node (%s missing)" % (self.job, self.state_path))
            self.m.exit_json(**self.result)
        self.result.update(self.describe(state))
        self.m.exit_json(**self.result)

    # ------------------------------------------------------------------ stop
    def stop(self, state=None, exit_module=True):
        state = state if state is not None else self.load_state()
        if state is None:
            self.result.update(state="absent", msg="no job %s on this node" % self.job)
            if not self.m.check_mode:
                self.clear_secrets()
            if exit_module:
                self.m.exit_json(**self.result)
            return self.result
        procs = self.all_procs(state)
        self.result.update({"pid": state["pid"], "pgid": state["pgid"], "node_rank": state.get("node_rank"),
                            "command": state["command"]})
        if self.m.check_mode:
            self.result.update(changed=bool(procs), state="stopped",
                               would_stop=[{"pid": p.pid, "comm": p.comm} for p in procs])
            if exit_module:
                self.m.exit_json(**self.result)
            return self.result
        outcome = {"terminated": [], "killed": [], "remaining": []}
        t0 = time.monotonic()
        if procs:
            outcome = pg.terminate(lambda: self.all_procs(state), grace=float(self.p["stop_timeout"]))
        outcome["seconds"] = round(time.monotonic() - t0, 2)
        if outcome["remaining"]:
            self.m.fail_json(msg="processes of job %s survived SIGKILL: %s" % (self.job, outcome["remaining"]),
                             stopped=outcome, **self.result)
        for name in (tr.STATE_FILE, tr.PID_FILE, tr.SPEC_FILE):
            try:
                os.unlink(os.path.join(self.dir, name))
            except OSError:
                pass
        self.clear_secrets()
        self.result.update(changed=bool(procs), state="stopped", stopped=outcome)
        if exit_module:
            self.m.exit_json(**self.result)
        return self.result

    # ------------------------------------------------------------------ start
    def resolve_resume(self):
        value = (self.p["resume_from"] or "").strip()
        if not value:
            return None
        if value != "auto":
            return value
        if not self.p["output_root"]:
            self.m.fail_json(msg="resume_from=auto needs output_root (cluster_output_root)", **self.result)
        return self.latest_checkpoint()

    def latest_checkpoint(self):
        return latest_complete_checkpoint(self.p["output_root"])

    def base_command(self):
        p = self.p
        for key in ("nnodes", "nproc_per_node", "node_rank", "master_addr", "entrypoint"):
            if p[key] is None or p[key] == "":
                self.m.fail_json(msg="state=started needs %s" % key, **self.result)
        try:
            return tr.build_command(
                p["nnodes"], p["nproc_per_node"], p["node_rank"], p["master_addr"], p["master_port"],
                p["entrypoint"], p["args"], rdzv_backend=p["rdzv_backend"], rdzv_id=p["rdzv_id"],
                max_restarts=p["max_restarts"], torchrun=p["torchrun"], extra_torchrun_args=p["extra_torchrun_args"],
                min_nnodes=p["min_nnodes"])
        except tr.LaunchError as e:
            self.m.fail_json(msg=str(e), **self.result)

    def file_envs(self):
        envs = []
        for path in self.p["env_files"]:
            if self.m.check_mode and not os.path.exists(path):
                # Check mode: the render play would write it before the launch; the plan names it.
                self.result.setdefault("env_files_pending", []).append(path)
                continue
            try:
                with open(path) as f:
                    env, problems = tr.parse_env_file(f.read(), path)
            except (IOError, OSError) as e:
                self.m.fail_json(msg="env file %s cannot be read (%s): render it first (role nccl_env)" % (path, e),
                                 **self.result)
            if problems:
                self.m.fail_json(msg="env file %s: %s" % (path, "; ".join(problems[:5])), **self.result)
            envs.append(env)
        return envs

    def secret_names(self):
        """Check secret_env_file (present, owner-only, KEY=value lines) and return its names; its values are
        added to the module's no_log values, so no output of this module can show them."""
        path = self.p["secret_env_file"]
        if not path:
            return []
        if self.m.check_mode and not os.path.exists(path):
            self.result["secret_env"] = None  # check mode: the role has not written it yet
            return []
        try:
            st = os.stat(path)
            with open(path) as f:
                text = f.read()
        except (IOError, OSError) as e:
            self.m.fail_json(msg="secret_env_file %s cannot be read (%s): the launch role writes it from "
                                 "launch_secret_env; run site.yml" % (path, e.strerror or e), **self.result)
        except UnicodeDecodeError:
            self.m.fail_json(msg="secret_env_file %s is not UTF-8 text: write KEY=value lines" % path,
                             **self.result)
        if st.st_mode & 0o077:
            self.m.fail_json(msg="secret_env_file %s is readable by group or others (mode %04o): chmod 600 %s "
                                 "(the launch role writes it 0600)" % (path, st.st_mode & 0o7777, path),
                             **self.result)
        env, problems = tr.parse_secret_env(text, "secret_env_file %s" % path)
        self.m.no_log_values.update(v for v in env.values() if v)
        if problems:
            self.m.fail_json(msg="; ".join(problems[:5]), **self.result)
        self.result["secret_env"] = sorted(env)
        self.secret_values = env  # for secret_env_mode=file: written to files, never into a result
        return sorted(env)

    def secrets_dir(self):
        if self.p["secrets_dir"]:
            return self.p["secrets_dir"]
        return os.path.join(os.path.dirname(self.p["secret_env_file"]), "secrets") if self.p["secret_env_file"] else ""

    def remove_stale_secret_env_file(self, path):
        """The secrets file of an earlier launch, when the job has none now: unlinked relative to its directory's
        descriptor (a link goes, its target stays; a directory goes with what is below it, as file state=absent)."""
        removed = False
        try:
            parent = jt.open_root(os.path.dirname(path))
        except FileNotFoundError:
            parent = None  # no directory, no file
        except OSError as e:
            self.m.fail_json(msg="stale_secret_env_file %s: cannot open its directory (%s)" % (path, e.strerror or e),
                             **self.result)
        if parent is not None:
            try:
                removed = jt.stat_at(parent, os.path.basename(path)) is not None
                if removed and not self.m.check_mode:
                    jt.remove_tree(parent, os.path.basename(path))
            except OSError as e:
                self.m.fail_json(msg="stale_secret_env_file %s: cannot remove it (%s)" % (path, e.strerror or e),
                                 **self.result)
            finally:
                os.close(parent)
        self.result["stale_secret_env_file_removed"] = removed
        if removed:
            self.result["changed"] = True

    def clear_secrets(self):
        """Empty the secrets directory of an earlier launch (the directory stays: a container mounts it, and a
        directory made anew would not be the one it sees)."""
        path = self.secrets_dir()
        if path and os.path.isdir(path) and not os.path.islink(path):
            try:
                write_secret_files(path, {}, 0, 0)
            except OSError as e:
                self.m.warn("cannot empty the secrets directory %s: %s" % (path, e.strerror or e))

    def check_secrets_mount(self):
        """secret_env_mode=file with runtime docker: the container must mount the secrets directory (read-only, same
        path); checked before anything is started or stopped."""
        want = self.secrets_dir()
        if self.m.check_mode:
            # The container role of the same run may (re)create the container with the mount: nothing to judge yet.
            self.result["secrets_mount"] = "skip: not checked in check mode"
            return
        rc, out, err = self.m.run_command([self.p["docker"], "inspect", "--format", "{{json .Mounts}}",
                                           self.p["container"]])
        try:
            mounts = json.loads(out) if rc == 0 else None
        except ValueError:
            mounts = None
        if not isinstance(mounts, list):
            self.m.fail_json(msg="secret_env_mode=file: cannot read the mounts of container %s (rc %d): %s. Is the "
                                 "training container running (role container)?" % (
                                     self.p["container"], rc, (err or out).strip()[-300:]), **self.result)
        for mt in mounts:
            if isinstance(mt, dict) and mt.get("Source") == want and mt.get("Destination") == want:
                if mt.get("RW"):
                    self.m.fail_json(msg="secret_env_mode=file: container %s mounts %s read-write; mount it "
                                         "read-only (container_mounts_extra: [{source: %s, read_only: true}])"
                                         % (self.p["container"], want, want), **self.result)
                self.result["secrets_mount"] = "pass"
                return
        self.m.fail_json(msg="secret_env_mode=file: container %s does not mount %s, so the job cannot read its "
                             "secrets; add container_mounts_extra: [{source: %s, read_only: true}] and rerun site.yml "
                             "(the container is recreated)" % (self.p["container"], want, want), **self.result)

    def secrets_owner(self):
        """(uid, gid) of the secret files: secrets_uid when given, else the training container's numeric user."""
        uid = int(self.p["secrets_uid"])
        if uid >= 0:
            return uid, uid
        if self.p["runtime"] != "docker":
            return 0, 0
        rc, out, _err = self.m.run_command([self.p["docker"], "inspect", "--format", "{{.Config.User}}",
                                            self.p["container"]])
        return container_user_ids(out.strip() if rc == 0 else "")

    def place_secrets(self):
        """secret_env_mode=file: one 0400 file per secret in a 0500 directory owned by secrets_uid, written through
        directory descriptors (no link followed, created exclusively, fchown/fchmod on the descriptors); files of
        secrets no longer given are removed. Returns the directory."""
        path = self.secrets_dir()
        uid, gid = self.secrets_owner()
        try:
            write_secret_files(path, getattr(self, "secret_values", {}), uid, gid)
        except (OSError, ValueError) as e:
            self.m.fail_json(msg="secret_env_mode=file: cannot write the secret files into %s: %s; its parent must "
                                 "be the launch role's host-only directory (launch_secret_env_file's)" % (
                                     path, getattr(e, "strerror", None) or e), **self.result)
        return path

    def stop_hint(self, job):
        return ("stop it with `ansible-playbook reset.yml -e reset_confirm=true` (with cluster_job_name=%s), or a "
                "task `torchrun_launch: {job: %s, state: stopped}`" % (job, job))

    def wait_pid_file(self, path, proc_gone):
        deadline = time.monotonic() + PID_FILE_WAIT
        while time.monotonic() < deadline:
            data = read_json(path)
            if data:
                return data
            if proc_gone():
                break
            time.sleep(0.05)
        return read_json(path)

    def spawn(self, name, argv, env, env_files, log, runtime, chdir, resume, token, prefix):
        """Write the spec and start the launcher; returns its pid record, checked against /proc.

        The torchrun launcher (docker runtime) runs in the container: its spec sits in the read-only directory,
        its pid and exit records in the job-writable one, and the pid record is only believed once the host sees
        that PID alive, started at the recorded time and carrying this launch's token, which the host put into
        the launcher's own environment (docker exec -e / the host's spawn). Host sidecars keep all three files
        in the host-only directory."""
        in_container = runtime == "docker"
        spec_dir = self.ro_dir if in_container else self.dir
        rec_dir = self.rw_dir if in_container else self.dir
        spec_path = os.path.join(spec_dir, prefix + tr.SPEC_FILE)
        pid_path = os.path.join(rec_dir, prefix + tr.PID_FILE)
        exit_path = os.path.join(rec_dir, prefix + tr.EXIT_FILE)
        for path in (pid_path, exit_path):
            try:
                os.unlink(path)
            except OSError:
                pass
        secret_file = self.p["secret_env_file"] if name == "torchrun" and self.p["secret_env_mode"] == "env" else ""
        spec = {"name": name, "argv": argv, "env": env, "env_files": env_files, "log": log, "chdir": chdir or "",
                "token": token, "pid_file": pid_path, "exit_file": exit_path, "resume_from": resume or ""}
        if name == "torchrun":
            spec["failfast"] = self.failfast_spec()
        if secret_file and runtime != "docker":
            spec["secret_env_file"] = secret_file  # the path; the launcher reads the values
        # In the container's read-only directory: 0640 with that directory's group, which role container makes the
        # gid of container_user, so the launcher, run as that user, reads it and other users of the node do not.
        tr.write_atomic(spec_path, json.dumps(spec, indent=2) + "\n", 0o640 if in_container else 0o600,
                        gid=os.stat(spec_dir).st_gid if in_container else None)
        launcher = os.path.join(self.ro_dir, tr.LAUNCHER_FILE)
        if in_container:
            # docker reads the secrets on the host: the file never has to be visible inside the container.
            secret_args = ["--env-file", secret_file] if secret_file else []
            cmd = [self.p["docker"], "exec"] + secret_args + ["-d", "-e", "%s=%s" % (tr.TOKEN_ENV, token),
                                                              self.p["container"], self.p["container_python"],
                                                              launcher, spec_path]
            rc, out, err = self.m.run_command(cmd)
            if rc != 0:
                self.m.fail_json(msg="docker exec into %s failed (rc %d): %s. Is the training container running "
                                     "(role container)?" % (self.p["container"], rc, (err or out).strip()[-500:]),
                                 cmd=cmd, **self.result)
            gone = (lambda: False)
        else:
            penv = dict(os.environ)
            penv[tr.TOKEN_ENV] = token
            pid, ticks = pg.start_detached([sys.executable, launcher, spec_path], log_path=log, env=penv)
            gone = (lambda: not pg.is_alive(pid, ticks))
        data = self.wait_pid_file(pid_path, gone)
        if not data:
            self.m.fail_json(msg="%s did not start: no %s after %.0f s" % (name, pid_path, PID_FILE_WAIT),
                             log_tail=tr.log_tail(read_text(log), self.p["log_lines"]), **self.result)
        try:
            checked = tr.check_pid_record(data, token, pg.read_stat, pg.read_environ)
        except ValueError as e:
            self.m.fail_json(msg="%s: the pid record %s does not match the launcher the host started (%s); nothing "
                                 "was recorded. Something in the job wrote it: check the training image, then "
                                 "ansible-playbook reset.yml" % (name, pid_path, e), **self.result)
        return checked, exit_path

    def failfast_spec(self):
        """The launcher's cross-node fail-fast settings (module_utils/failfast.py): the head's store, this node's
        rank, the job's private key prefix; None for a single node."""
        p = self.p
        return failfast_script.spec_for(p["nnodes"], p["node_rank"], p["master_addr"], p["master_port"], self.job,
                                        p["rdzv_id"], grace_s=min(float(p["stop_timeout"]), 5.0),
                                        min_nnodes=p["min_nnodes"])

    def check_plan(self, action, reason, resume=""):
        """Check mode: what the run would do on this node (result key plan)."""
        words = {"start": "start job %s (first launch on this node)" % self.job,
                 "relaunch": "relaunch job %s (%s)" % (self.job, reason),
                 "leave_running": "leave job %s running (%s)" % (self.job, reason),
                 "leave_finished": "leave job %s finished (%s)" % (self.job, reason),
                 "blocked": "stop here: %s" % reason}[action]
        if action in ("start", "relaunch"):
            words += ", resume from %s" % resume if resume else ", from scratch (no complete checkpoint)"
        plan = {"action": action, "reason": reason, "resume_from": resume or "", "summary": words,
                "env_files_pending": list(self.result.get("env_files_pending") or [])}
        self.result.update(plan=plan)
        return plan

    def start(self):
        p = self.p
        if p["runtime"] == "docker" and not p["container"]:
            self.m.fail_json(msg="runtime=docker needs container (the training container's name)", **self.result)
        for sc in p["sidecars"]:
            if not isinstance(sc, dict) or not sc.get("name") or not isinstance(sc.get("argv"), list) \
                    or not sc["argv"]:
                self.m.fail_json(msg="sidecars: each item needs name and a non-empty argv list, got %r" % (sc,),
                                 **self.result)
        base = self.base_command()
        # Everything the start depends on is checked before anything is started or stopped.
        try:
            for sc in p["sidecars"]:
                tr.validate_sidecar_name(sc["name"])
            tr.validate_regex("first_step_marker", p["first_step_marker"])
            tr.validate_regex("rendezvous_marker", p["rendezvous_marker"])
            extra_env = tr.validate_env(p["env"])
        except tr.LaunchError as e:
            self.m.fail_json(msg=str(e), **self.result)
        self.m.no_log_values.update(v for k, v in extra_env.items() if tr.looks_secret(k) and v)
        if p["stale_secret_env_file"] and not p["secret_env_file"]:
            self.remove_stale_secret_env_file(p["stale_secret_env_file"])
        secret_names = self.secret_names()
        if p["secret_env_mode"] == "file" and secret_names:
            extra_env[SECRETS_DIR_ENV] = self.secrets_dir()  # the path only; the job reads the files
            if p["runtime"] == "docker":
                self.check_secrets_mount()
        fp_env = dict(extra_env, **dict((k, "<secret>") for k in secret_names))  # names, not values
        fp = tr.fingerprint(base, fp_env, p["env_files"], p["chdir"], p["runtime"], p["container"])
        fp_parts = tr.fingerprint_parts(fp_env, p["env_files"], p["chdir"], p["runtime"], p["container"])

        for other, st, procs in self.other_jobs():
            self.m.fail_json(msg="job %s (pid %s, started %s, %d processes) holds this node; %s"
                                 % (other, st["pid"], time.strftime("%Y-%m-%d %H:%M:%S",
                                                                    time.localtime(st.get("started_at", 0))),
                                    len(procs), self.stop_hint(other)), holder=other, **self.result)

        state = self.load_state()
        if state is not None:
            running = self.job_procs(state)
            if running:
                if state.get("fingerprint") == fp:
                    self.result.update(self.describe(state))
                    if self.m.check_mode:
                        self.check_plan("leave_running", "pid %s, same command" % state["pid"],
                                        state.get("resume_from", ""))
                    return self.finish_wait(state)
                if self.m.check_mode:
                    self.check_plan("blocked", "job %s runs with another command (fingerprint changed); %s"
                                    % (self.job, self.stop_hint(self.job)))
                changes = tr.fingerprint_changes(state.get("fingerprint_parts"), fp_parts)
                if state["command"] != base:
                    changes.insert(0, "command")
                self.m.fail_json(
                    msg="job %s already runs on this node (pid %s) with a different command or environment%s:\n"
                        "  running: %s\n  wanted:  %s\n%s" % (
                            self.job, state["pid"], " (changed: %s)" % "; ".join(changes) if changes else "",
                            tr.shell_quote(state["command"]), tr.shell_quote(base), self.stop_hint(self.job)),
                    running_command=state["command"], wanted_command=base, changes=changes, **self.result)
            prev = self.describe(state)
            if prev["state"] == "finished" and state.get("fingerprint") == fp and not p["rerun_finished"]:
                self.result.update(prev, msg="job %s already finished with this command (rerun_finished=false)"
                                   % self.job)
                if self.m.check_mode:
                    self.check_plan("leave_finished", "same command, rerun_finished=false")
                return self.result

        resume = self.resolve_resume()
        command = list(base) + tr.resume_args(resume, p["resume_arg"])
        file_envs = self.file_envs()
        if state is None and p["first_launch_env"]:
            try:
                file_envs.append(tr.validate_env(p["first_launch_env"]))
            except tr.LaunchError as e:
                self.m.fail_json(msg="first_launch_env: %s" % e, **self.result)
            self.result["first_launch_env"] = sorted(p["first_launch_env"])
        token = uuid.uuid4().hex
        env = tr.merge_env(file_envs, extra_env, resume)
        self.result.update(command=command, command_line=tr.shell_quote(command), env=tr.redact_env(env),
                           resume_from=resume or "", node_rank=p["node_rank"], runtime=p["runtime"])
        if self.m.check_mode:
            self.result.update(changed=True, state="started",
                               sidecars=[{"name": s["name"], "argv": s["argv"]} for s in p["sidecars"]])
            if state is None:
                self.check_plan("start", "no earlier launch", resume)
            else:
                self.check_plan("relaunch", "the earlier launch %s%s" % (
                    prev["state"], "; the command fingerprint changed" if state.get("fingerprint") != fp
                    else ", same command"), resume)
            return self.result

        # DeepSpeed tags its checkpoints on global rank 0's node only: give this node's copy its tag to resume from.
        if resume:
            try:
                tag = ensure_deepspeed_latest(resume)
            except OSError as e:
                self.m.fail_json(msg="cannot write DeepSpeed's latest tag into %s: %s" % (resume, e), **self.result)
            if tag:
                self.result["deepspeed_latest_written"] = tag

        # Leftovers of the previous launch of this job (a sidecar still running after the job died).
        if state is not None and self.all_procs(state):
            pg.terminate(lambda: self.all_procs(state), grace=float(p["stop_timeout"]))
        if p["secret_env_mode"] == "file" and secret_names:
            self.result["secrets_dir"] = self.place_secrets()
        else:
            self.clear_secrets()

        # The host-only directory is 0750; the container's read-only and read-write directories stay readable
        # for an image that runs as another user.
        for d, mode in ((self.dir, 0o750), (self.ro_dir, 0o755), (self.rw_dir, 0o755)):
            try:
                os.makedirs(d, mode)
            except OSError:
                if not os.path.isdir(d) or os.path.islink(d):
                    self.m.fail_json(msg="cannot create the directory %s" % d, **self.result)
        # 0750 whoever made it first (the container role's mkdir -p of the mount sources below it makes it 0755):
        # it holds launch.json with the launch token. Set on the directory's own descriptor, never through a link.
        try:
            parent = jt.open_root(os.path.dirname(self.dir))
            try:
                fd, _created = jt.mkdir(parent, os.path.basename(self.dir), 0o750, enforce_mode=True)
                os.close(fd)
            finally:
                os.close(parent)
        except OSError as e:
            self.m.fail_json(msg="cannot make %s 0750: %s" % (self.dir, e), **self.result)
        log_dir = os.path.dirname(self.log)
        if log_dir and not os.path.isdir(log_dir):
            os.makedirs(log_dir, 0o755)
        for src, dst in tr.rotated_names(self.log):
            try:
                os.rename(src, dst)  # renames the entry itself: a planted symlink moves, nothing is followed
            except FileNotFoundError:
                pass
            except OSError as e:
                self.m.fail_json(msg="cannot rotate the log %s to %s: %s; remove what is in the way"
                                     % (src, dst, e.strerror), **self.result)
        # launcher.py's own text (AnsiballZ ships it inside this module's payload, beside the other module utils).
        tr.write_atomic(os.path.join(self.ro_dir, tr.LAUNCHER_FILE), inspect.getsource(launcher_script), 0o755)
        cgroup = {}
        if p["runtime"] == "docker":
            cgroup, why = self.container_identity()
            # Without the cgroup record the job is found by the launcher (subreaper), descendants and token only.
            self.result["cgroup_tracking"] = "pass" if cgroup else "skip: %s" % why
            if why:
                self.m.warn("job %s: processes are not tracked by the container's cgroup (%s); a process that leaves "
                            "the launcher's tree without the token may survive a stop" % (self.job, why))
        tr.write_atomic(os.path.join(self.ro_dir, failfast_script.FILE), inspect.getsource(failfast_script), 0o644)
        started_at = time.time()
        data, exit_path = self.spawn("torchrun", command, env, list(p["env_files"]), self.log, p["runtime"],
                                     p["chdir"], resume, token, "")
        sidecars = []
        for sc in p["sidecars"]:
            sc_token = "%s-%s" % (token, sc["name"])
            sc_log = os.path.join(self.dir, "%s.log" % sc["name"])
            sdata, _ = self.spawn(sc["name"], [str(a) for a in sc["argv"]], {}, [], sc_log, "host", None, None,
                                  sc_token, "sidecar-%s." % sc["name"])
            sidecars.append({"name": sc["name"], "pid": sdata["pid"], "pgid": sdata["pgid"],
                             "start_ticks": sdata["start_ticks"], "argv": [str(a) for a in sc["argv"]],
                             "token": sc_token, "log": sc_log})
        new_state = tr.make_state(
            self.job, p["runtime"], p["container"], data["pid"], data["pgid"], data["start_ticks"], started_at,
            command, p["env_files"], self.log, p["node_rank"], p["master_port"], resume, sidecars, token, fp,
            exit_path, torchrun_pid=data.get("child_pid"))
        # What finds the job's processes (procgroup.find_job) and its ranks (procgroup.job_ranks) besides the above.
        new_state.update(cgroup, torchrun_start_ticks=data.get("child_start_ticks"),
                         nproc_per_node=int(p["nproc_per_node"]), fingerprint_parts=fp_parts)
        tr.write_atomic(self.state_path, tr.dumps_state(new_state), 0o640)
        self.result.update(changed=True)
        self.result.update(self.describe(new_state, {"env": tr.redact_env(env)}))
        return self.finish_wait(new_state)

    def finish_wait(self, state):
        mode = self.p["wait_for"]
        if mode == "none":
            return self.result
        deadline = time.monotonic() + self.p["wait_timeout"]
        pattern = self.p["first_step_marker"] if mode == "first_step" else self.p["rendezvous_marker"]
        started = time.monotonic()
        while True:
            text = read_text(state["log"])
            if pattern and tr.find_marker(text, pattern):
                break
            procs = self.job_procs(state)
            if mode == "rendezvous" and state.get("torchrun_pid"):
                workers = [q for q in procs if q.ppid == state["torchrun_pid"]]
                if len(workers) >= int(self.p["nproc_per_node"] or 1):
                    break
            if not procs:
                d = self.describe(state)
                self.result.update(d)
                if d["state"] == "finished":
                    # Ended cleanly while we looked (a short job, or one left running that was in its last
                    # seconds): it went through its rendezvous and every step; nothing to wait for.
                    break
                self.m.fail_json(msg="job %s on node rank %s ended before %s: %s" % (
                    self.job, state.get("node_rank"), mode, self.failure_words(d)), **self.result)
            if time.monotonic() >= deadline:
                d = self.describe(state)
                self.result.update(d, log_tail=tr.log_tail(text, self.p["log_lines"]))
                self.m.fail_json(msg="job %s on node rank %s: no %s within %d s (still running; other nodes "
                                     "missing at the rendezvous?)" % (self.job, state.get("node_rank"), mode,
                                                                      self.p["wait_timeout"]), **self.result)
            time.sleep(0.2)
        self.result.update(self.describe(state))
        self.result.update(waited_s=round(time.monotonic() - started, 2))
        return self.result

    def confirm(self, r):
        """The launch's confirmation (confirm=true): fail unless the job runs or finished with this node's rank, else
        say where it runs (msg)."""
        want = int(self.p["node_rank"])
        state = r.get("state") or "unknown"
        if not self.m.check_mode and state not in ("running", "finished"):
            self.m.fail_json(msg="(node rank %d): job %s is %s. Log %s: %s" % (
                want, self.job, state, r.get("log", ""), r.get("log_tail") or r.get("last_log_line") or ""), **r)
        got = r.get("node_rank")
        if got is None or int(got) != want:
            self.m.fail_json(msg="(node rank %d): job %s runs here with node rank %s, not this node's rank in the "
                                 "cluster model. Log %s. Fix: stop it (reset.yml) and launch again"
                                 % (want, self.job, got, r.get("log", "")), **r)
        how = ("(started)" if r.get("changed") else "(already running, left alone)" if state == "running"
               else "(left alone: rerun_finished=false)" if state == "finished" else "")
        r["msg"] = "node rank %d: %s%s, pid %s, resume from %s, log %s" % (
            want, state, " " + how if how else "", r.get("pid", "-"), r.get("resume_from") or "nothing",
            r.get("log", ""))
        return r

    @staticmethod
    def failure_words(d):
        f = d.get("failure")
        if f:
            return "rank %s (local rank %s) exit code %s%s" % (
                f.get("rank"), f.get("local_rank"), f.get("exitcode"),
                ", %s" % f["signal"] if f.get("signal") else "")
        if d.get("exit"):
            return "torchrun exited with %s; last line: %s" % (d["exit"].get("returncode"), d.get("last_log_line"))
        return "last line: %s" % d.get("last_log_line")


def release_lock(module, result):
    """Give back the run's cluster lock of this node (release_lock) after a start that did not fail: the node's last
    change of the run. A lock that cannot be given back here is the run's release task's (a warning, not a failure)."""
    lock = module.params["release_lock"] or {}
    if not lock or module.check_mode or result.get("failed"):
        return False
    path, token = lock.get("path"), lock.get("token")
    if not path or not token:
        module.fail_json(msg="torchrun_launch: release_lock needs path and token (cluster_lock_dir and the run's lock "
                             "token), got keys %s" % sorted(lock), **result)
    try:
        return cluster_lock.release(path, token)
    except (cluster_lock.LockError, OSError) as e:
        module.warn("cluster lock %s not given back here (%s): the run's release task does it" % (path, e))
        return False


def main():
    module = AnsibleModule(
        argument_spec=pg.job_args(**tr.command_options(
            state=dict(type="str", default="started", choices=["started", "stopped", "status"]),
            rdzv_backend=dict(type="str", default="static", choices=["static", "c10d"]),
            min_nnodes=dict(type="int", default=0),
            env_files=dict(type="list", elements="path", default=[]),
            env=dict(type="dict", default={}),
            first_launch_env=dict(type="dict", default={}),
            secret_env_file=dict(type="path", default=""),
            secret_env_mode=dict(type="str", default="env", choices=["env", "file"]),
            secrets_dir=dict(type="path", default=""),
            stale_secret_env_file=dict(type="path", default=""),
            secrets_uid=dict(type="int", default=-1),
            chdir=dict(type="path"),
            log=dict(type="path"),
            runtime=dict(type="str", default="host", choices=["host", "docker"]),
            container=dict(type="str", default=""),
            container_python=dict(type="str", default="python3"),
            docker=dict(type="str", default="docker"),
            sidecars=dict(type="list", elements="dict", default=[]),
            wait_for=dict(type="str", default="none", choices=["none", "rendezvous", "first_step"]),
            wait_timeout=dict(type="int", default=300),
            first_step_marker=dict(type="str", default="trainyard: first step done"),
            rendezvous_marker=dict(type="str", default=""),
            resume_from=dict(type="str", default=""),
            output_root=dict(type="path"),
            resume_arg=dict(type="str", default=""),
            rerun_finished=dict(type="bool", default=False),
            stop_timeout=dict(type="int", default=30),
            log_lines=dict(type="int", default=30),
            confirm=dict(type="bool", default=False),
            release_lock=dict(type="dict", default={}, no_log=False),
        )),
        supports_check_mode=True,
    )
    launch = Launch(module)
    state = module.params["state"]
    if state == "status":
        launch.status()
    elif state == "stopped":
        launch.stop()
    else:
        result = launch.start()
        result = launch.confirm(result) if module.params["confirm"] else result
        result["lock_released"] = release_lock(module, result)
        module.exit_json(**result)


if __name__ == "__main__":
    main()
