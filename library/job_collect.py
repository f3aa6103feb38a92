#!/usr/bin/python
# -*- coding: utf-8 -*-
# trainyard: everything a node knows about the job, read-only, in one call (playbooks/collect.yml).
from __future__ import annotations

DOCUMENTATION = r"""
module: job_collect
short_description: Gather a node's evidence about the training job (logs, state, dumps, kernel log, GPUs)
description:
  - "Read-only on the node: safe on a running, hung or dead job. Returns the files as data (base64) for the
    controller to store under C(runs/<id>/nodes/<host>/)."
  - From the job's host-only state directory (C(<state_root>/<job>/)) C(launch.json) and C(janitor.log); from its
    read-only part (C(job-ro/)) C(nccl.env), C(ds_config.json) and the launcher's C(launch.spec.json); from its
    job-writable part (C(job-rw/)) the torchrun log (head and tail kept within I(log_max_bytes)), the launcher's
    C(launch.pid.json) and C(launch.exit.json), every rank's flight-recorder dump (C(flight_recorder/rank_<N>))
    and progress file (C(progress/rank_<N>.json)). A job on the host (runtime host) keeps its launcher's spec,
    pid and exit records in the host-only directory. The torchelastic error file of every failed rank named in
    the log is read in the training container when the job runs in one (never as a host path).
  - "job-ro and job-rw are read as untrusted, through directory fds opened from the host-only directory: no
    symbolic link followed (none in between either), only regular files, size-capped; values of secret-looking
    variables (token, password, key, ...) in env and JSON files are replaced."
  - The kernel log since the job started (journalctl -k, else dmesg) with its Xid, OOM-killer and segfault
    events, C(nvidia-smi -q -x), the fabric manager's journal, the training container's C(docker inspect) and
    log tail. What cannot be read is listed with the reason, never silently left out.
options:
  container: {description: The training container; empty when the job runs on the node., type: str, default: ""}
  since:
    description: Epoch seconds the kernel log and journals are read from; 0 = when the job started (launch.json).
    type: float
    default: 0
  log_max_bytes: {description: Cap on the torchrun log (its head and tail are kept)., type: int, default: 4194304}
  log_head_bytes: {description: Bytes of the log's beginning kept when it is cut., type: int, default: 65536}
  file_max_bytes: {description: Cap on every other file (the tail is kept)., type: int, default: 1048576}
  dump_max_bytes:
    description: Cap on one flight-recorder dump; a larger dump is listed as skipped (a cut pickle is useless).
    type: int
    default: 33554432
  node_max_bytes:
    description: Cap on everything gathered on this node together (after the per-file caps); what no longer fits
      is listed in C(left_out) and in C(files) as skipped, never silently dropped.
    type: int
    default: 268435456
  files_max:
    description: Cap on the number of files taken from each directory the job fills (flight-recorder dumps,
      progress files, stacks) and on the error files named in the log; the rest is counted in C(left_out).
    type: int
    default: 64
  container_log_lines: {description: Lines of the container's log (docker logs --tail)., type: int, default: 2000}
  fabricmanager_unit: {description: The fabric manager's systemd unit., type: str, default: nvidia-fabricmanager}
  nvidia_smi: {description: nvidia-smi (name or path); empty skips it., type: str, default: nvidia-smi}
  timeout: {description: Seconds each command may take; 0 waits forever., type: int, default: 60}
extends_documentation_fragment: [trainyard.core.attributes, trainyard.core.attributes.job]
author: trainyard
"""

EXAMPLES = r"""
- name: Gather the node's evidence
  job_collect:
    job: "{{ cluster_job_name }}"
    state_root: "{{ cluster_state_dir }}"
    container: trainyard-train
  register: __job_collect
"""

RETURN = r"""
files:
  description: "Every item gathered: name (its file name under nodes/<host>/), content (base64, absent when
    skipped), size (bytes on the node), truncated, skipped (why it is not there, empty when it is)."
  returned: always
  type: list
state: {description: launch.json (secrets removed), or null., returned: always, type: dict}
started_at: {description: Epoch seconds the job started on this node (launch.json), or null., returned: always, type: float}
kernel: {description: "source, skipped, truncated and events (Xid, OOM kills, segfaults) of the kernel log.", returned: always, type: dict}
gpus: {description: Per-GPU health from nvidia-smi -q -x (module_utils/gpu_health.py)., returned: always, type: list}
smi_error: {description: Why nvidia-smi gave nothing (empty when it did)., returned: always, type: str}
progress: {description: The ranks' progress files (example trainers)., returned: always, type: list}
dumps: {description: Names of the flight-recorder dumps gathered., returned: always, type: list}
left_out:
  description: "What the caps left out: {name, why} per file (node_max_bytes) or per directory (files_max, with the
    count)."
  returned: always
  type: list
"""

import base64
import os
import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils.gpu_health import (
    parse_health_xml, parse_kernel_log, read_kernel_log,
)
from ansible_collections.trainyard.core.plugins.module_utils.job_collect import (
    JobTree,
    error_files_in_log,
    listdir_fd,
    read_progress,
    redact_env_text,
    redact_file,
    safe_read,
)
from ansible_collections.trainyard.core.plugins.module_utils import jobtree
from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr

SEARCH_DIRS = ["/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/usr/sbin", "/bin", "/sbin"]
# Where each file lives (module_utils/torchrun.py, docs/architecture.md "Node-local layout"): dir = the host-only
# state directory, ro = its read-only part (job-ro), rw = its job-writable part (job-rw).
# launch.json's fields this module uses (host-only, but read as untrusted like everything else).
STATE_SCHEMA = {"started_at": (int, float), "runtime": str, "container": str, "log": str}
STATE_FILES = ((tr.STATE_FILE, ("dir",)), (tr.EXIT_FILE, ("rw",)), (tr.SPEC_FILE, ("ro",)), (tr.PID_FILE, ("rw",)),
               ("nccl.env", ("ro",)), ("ds_config.json", ("ro",)), ("janitor.log", ("dir",)))


class Collector(object):
    def __init__(self, module):
        self.m = module
        self.p = module.params
        try:
            lay = tr.job_layout(self.p["state_root"], self.p["job"])
        except tr.LaunchError as e:
            module.fail_json(msg="job: %s" % e)
        self.dir = lay["dir"]
        self.tree = JobTree(lay, tr.JOB_RO_DIR, tr.JOB_RW_DIR)
        self.files = []
        self.left_out = []
        self.total = 0
        t = self.p["timeout"]
        self._timeout = module.get_bin_path("timeout") if t > 0 else None

    def run(self, argv):
        if self._timeout:
            argv = [self._timeout, "-k", "5", str(self.p["timeout"])] + argv
        return self.m.run_command(argv, environ_update={"LC_ALL": "C"}, errors="surrogate_or_replace")

    def add(self, name, data=None, size=None, truncated=False, skipped=""):
        if data is not None and self.total + len(data) > self.p["node_max_bytes"]:
            why = "left out: this node's evidence reached node_max_bytes (%d bytes; launch_collect_node_max_bytes)" \
                % self.p["node_max_bytes"]
            self.left_out.append({"name": name, "why": why})
            size, data, skipped = len(data) if size is None else size, None, why
        if data is not None:
            data = redact_file(name, data)
            self.total += len(data)
        entry = {"name": name, "size": size if size is not None else (len(data) if data is not None else 0),
                 "truncated": bool(truncated), "skipped": skipped if data is None else ""}
        if data is not None:
            entry["content"] = base64.b64encode(data).decode("ascii")
        self.files.append(entry)

    def add_read(self, name, path, max_bytes, head=0):
        r = safe_read(path, max_bytes, head)
        self.add(name, r["data"], r["size"], r["truncated"], r["skipped"])
        return r

    def text_cmd(self, name, argv, max_bytes, what):
        rc, out, err = self.run(argv)
        text = (out or "") + (("\n" + err) if err and rc != 0 else "")
        if rc != 0 and not (out or "").strip():
            self.add(name, skipped="%s failed (exit %s): %s" % (what, rc, (err or "").strip()[:300]))
            return None
        data = text.encode("utf-8", "replace")
        self.add(name, data[-max_bytes:], len(data), len(data) > max_bytes)
        return text

    def capped(self, where, names):
        """The first files_max of names; the rest counted in left_out (a job plants files at no cost)."""
        n = self.p["files_max"]
        if len(names) > n:
            self.left_out.append({"name": where, "why": "left out: %d more files than files_max (%d; "
                                  "launch_collect_files_max)" % (len(names) - n, n)})
        return names[:n]

    def collect(self):
        try:
            return self._collect()
        finally:
            self.tree.close()

    def _collect(self):
        p = self.p
        tree = self.tree
        out = {"changed": False, "node": socket.gethostname(), "state": None, "started_at": None, "gpus": [],
               "smi_error": "", "progress": [], "dumps": [], "error_files": []}
        if tree.fd["dir"] is None:
            self.add("state-dir", skipped="%s: %s on this node (the job was never launched here?)"
                     % (self.dir, tree.why["dir"]))
        # The launch state first (host-only): it says when the job started, how it runs and where its log is.
        st = tree.read("dir", tr.STATE_FILE, p["file_max_bytes"])
        if st["data"]:
            try:
                out["state"] = jobtree.loads_bounded(redact_file(tr.STATE_FILE, st["data"]), expect=STATE_SCHEMA)
            except ValueError:  # jobtree.BadRecord: torn, too deep, or of the wrong types
                out["state"] = None
        state = out["state"] if isinstance(out["state"], dict) else {}
        out["started_at"] = state.get("started_at")
        # A job in a container keeps its launcher's spec in job-ro and its pid and exit records in job-rw; a job
        # on the host keeps all three in the host-only directory.
        in_container = state.get("runtime") == "docker"
        for name, wheres in STATE_FILES:
            if name in (tr.SPEC_FILE, tr.PID_FILE, tr.EXIT_FILE) and not in_container:
                wheres = ("dir",) + wheres
            r = tree.read_first(wheres, name, p["file_max_bytes"])
            if name == tr.STATE_FILE:
                r = st
            self.add(name, r["data"], r["size"], r["truncated"], r["skipped"])
        log_name = tree.log_name(state.get("log"))
        log = tree.read("rw", log_name, p["log_max_bytes"], p["log_head_bytes"])
        self.add("torchrun.log", log["data"], log["size"], log["truncated"], log["skipped"])
        log_text = (log["data"] or b"").decode("utf-8", "replace")
        r = tree.read("rw", log_name + ".1", p["file_max_bytes"])
        self.add("torchrun.log.1", r["data"], r["size"], r["truncated"], r["skipped"])

        # torchelastic error files of the failed ranks. Their paths come from the log, which the job writes: in a
        # container they are read there (docker exec, the container's view), never as the host's paths.
        container = p["container"] or (state.get("container") if in_container else "")
        docker = self.m.get_bin_path("docker", opt_dirs=SEARCH_DIRS)
        for i, path in enumerate(self.capped("error files named in the log", error_files_in_log(log_text))):
            name = "error-%d-%s" % (i, os.path.basename(os.path.dirname(path)) or "rank")
            out["error_files"].append(path)
            if container:
                if not docker:
                    self.add(name + ".json", skipped="in container %s: docker is not installed" % container)
                    continue
                rc, o, e = self.run([docker, "exec", container, "head", "-c", str(p["file_max_bytes"]), path])
                if rc == 0:
                    self.add(name + ".json", o.encode("utf-8", "replace"))
                else:
                    self.add(name + ".json", skipped="in container %s: %s" % (container, (e or "").strip()[:200]))
                continue
            r = safe_read(path, p["file_max_bytes"])
            self.add(name + ".json", r["data"], r["size"], r["truncated"], r["skipped"])

        # Flight-recorder dumps and progress files (job-rw): written by the job, read with care.
        fr_fd, why = tree.subdir("rw", "flight_recorder")
        try:
            if fr_fd is None and why != "absent":
                self.add("flight_recorder", skipped=why)
            for n in self.capped("flight_recorder/", [n for n in listdir_fd(fr_fd)
                                                      if n.startswith("rank_") and n[5:].isdigit()]):
                r = safe_read(n, p["dump_max_bytes"] + 1, dir_fd=fr_fd)
                if r["data"] is not None and r["size"] > p["dump_max_bytes"]:
                    self.add("flight_recorder/" + n, size=r["size"],
                             skipped="larger than dump_max_bytes (%d): not collected" % p["dump_max_bytes"])
                    continue
                self.add("flight_recorder/" + n, r["data"], r["size"], r["truncated"], r["skipped"])
                if r["data"] is not None:
                    out["dumps"].append(n)
        finally:
            if fr_fd is not None:
                os.close(fr_fd)
        for n, r, rec in read_progress(tree, self.p["files_max"]):
            self.add("progress/" + n, r["data"], r["size"], r["truncated"])
            if rec is not None:
                out["progress"].append(rec)
            elif r.get("refused"):
                self.left_out.append({"name": "progress/" + n, "why": "not used: %s" % r["refused"]})
        # Stack dumps kept on the node (host-only directory).
        st_fd, _why = tree.subdir("dir", "stacks")
        try:
            for n in self.capped("stacks/", listdir_fd(st_fd)):
                r = safe_read(n, p["file_max_bytes"], dir_fd=st_fd)
                self.add("stacks/" + n, r["data"], r["size"], r["truncated"], r["skipped"])
        finally:
            if st_fd is not None:
                os.close(st_fd)

        # The kernel log since the job started, and the GPUs.
        since = p["since"] or out["started_at"] or None
        journalctl = self.m.get_bin_path("journalctl")
        kernel = read_kernel_log(self.run, journalctl, self.m.get_bin_path("dmesg"), since,
                                 p["file_max_bytes"])
        kernel["events"] = parse_kernel_log(kernel["text"], since=since)
        if kernel["skipped"]:
            self.add("kernel.log", skipped=kernel["skipped"])
        else:
            self.add("kernel.log", kernel["text"].encode("utf-8", "replace"), truncated=kernel["truncated"])
        kernel.pop("text")
        kernel["since"] = since
        out["kernel"] = kernel

        smi = None
        if p["nvidia_smi"]:
            smi = p["nvidia_smi"] if "/" in p["nvidia_smi"] else self.m.get_bin_path(p["nvidia_smi"],
                                                                                      opt_dirs=SEARCH_DIRS)
        if not smi:
            out["smi_error"] = "nvidia-smi not found on the node"
            self.add("nvidia-smi-q.xml", skipped=out["smi_error"])
        else:
            xml = self.text_cmd("nvidia-smi-q.xml", [smi, "-q", "-x"], p["file_max_bytes"] * 4, "nvidia-smi -q -x")
            if xml is None:
                out["smi_error"] = self.files[-1]["skipped"]
            else:
                try:
                    out["gpus"] = parse_health_xml(xml)
                except ValueError as e:
                    out["smi_error"] = str(e)

        if not journalctl:
            self.add("fabricmanager.journal", skipped="journalctl is not installed (no systemd journal)")
        else:
            argv = [journalctl, "-u", p["fabricmanager_unit"], "--no-pager", "-q", "-o", "short-iso"]
            argv += ["--since", "@%d" % int(since)] if since else ["-b"]
            text = self.text_cmd("fabricmanager.journal", argv, p["file_max_bytes"], "journalctl")
            if text is not None and not text.strip():
                self.files[-1] = {"name": "fabricmanager.journal", "size": 0, "truncated": False,
                                  "skipped": "no journal entries of %s since the job started" % p["fabricmanager_unit"]}

        if container and docker:
            text = self.text_cmd("container.inspect.json", [docker, "inspect", container], p["file_max_bytes"],
                                 "docker inspect")
            if text is not None:
                try:
                    info = jobtree.loads_bounded(text, max_depth=64, expect=list)
                    hc = (info[0].get("HostConfig") or {}) if info else {}
                    out["container_state"] = (info[0].get("State") or {}) if info else {}
                    out["container_limits"] = {k: hc.get(k) for k in ("NanoCpus", "CpuQuota", "CpuPeriod",
                                                                      "Memory", "CpusetCpus")}
                except (ValueError, IndexError, AttributeError):
                    pass
            rc, o, e = self.run([docker, "logs", "--tail", str(p["container_log_lines"]), container])
            if rc == 0:
                data = redact_env_text((o or "") + (e or "")).encode("utf-8", "replace")
                self.add("container.log", data[-p["file_max_bytes"]:], len(data), len(data) > p["file_max_bytes"])
            else:
                self.add("container.log", skipped="docker logs failed (exit %s): %s" % (rc, (e or "").strip()[:200]))
        elif container:
            self.add("container.inspect.json", skipped="docker is not installed on the node")
        else:
            self.add("container.inspect.json", skipped="the job runs on the node (runtime host): no container")
        out["files"] = self.files
        out["left_out"] = self.left_out
        out["collected_at"] = time.time()
        return out


def main():
    module = AnsibleModule(
        argument_spec=pg.job_args(
            container=dict(type="str", default=""),
            since=dict(type="float", default=0),
            log_max_bytes=dict(type="int", default=4 << 20),
            log_head_bytes=dict(type="int", default=64 << 10),
            file_max_bytes=dict(type="int", default=1 << 20),
            dump_max_bytes=dict(type="int", default=32 << 20),
            node_max_bytes=dict(type="int", default=256 << 20),
            files_max=dict(type="int", default=64),
            container_log_lines=dict(type="int", default=2000),
            fabricmanager_unit=dict(type="str", default="nvidia-fabricmanager"),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            timeout=dict(type="int", default=60),
        ),
        supports_check_mode=True,
    )
    module.exit_json(**Collector(module).collect())


if __name__ == "__main__":
    main()
