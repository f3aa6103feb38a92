#!/usr/bin/python
# -*- coding: utf-8 -*-
# trainyard: the job's progress on a node (per-rank progress files, GPUs) and, when asked, every rank's Python stack.
from __future__ import annotations

DOCUMENTATION = r"""
module: job_progress
short_description: A node's training progress, GPU state and (for a hung job) every rank's Python stack
description:
  - Reads the ranks' progress files (C(<state_root>/<job>/job-rw/progress/rank_<N>.json), written by the entry point)
    through directory fds without following links (none in between either), and C(nvidia-smi -q -x) for
    utilisation, memory, temperature and clock slowdown reasons.
  - "With I(stacks), takes a Python stack dump of every rank of this job on the node, read-only for the job. The ranks
    are found in /proc, never from a file the job writes: the direct children of the torchrun agent the host-only
    launch.json records (its PID and start time, a child of the verified launcher) with torchrun's C(RANK) and
    C(LOCAL_RANK) in their environment, one per local rank below the launch's C(nproc_per_node) (64 for a launch
    recorded without it); any other process, whatever its environment, is no rank. Each is dumped with C(py-spy dump) (I(py_spy), else py-spy on the node's PATH, else in the training
    container, which needs CAP_SYS_PTRACE; C(--nonblocking) for a stopped rank), else with SIGUSR1 to a rank that
    registered faulthandler for it (C(faulthandler.register(SIGUSR1)), e.g. from a sitecustomize on the job's
    PYTHONPATH); SIGUSR1 is never sent to a rank that did not (it would kill it). Each stack (text the job chooses:
    capped at 64 KiB, the last part kept) is kept in the host-only C(<state_root>/<job>/stacks/rank_<N>.txt) (not in
    check mode), where collect.yml picks it up; the result carries its last 20000 characters."
options:
  container: {description: The training container (py-spy inside it); empty when the job runs on the node., type: str, default: ""}
  stacks: {description: Take every rank's Python stack., type: bool, default: false}
  py_spy: {description: A py-spy binary on the node to use first; empty looks for py-spy on the PATH., type: str, default: ""}
  nvidia_smi: {description: nvidia-smi; empty skips the GPU state., type: str, default: nvidia-smi}
  timeout: {description: Seconds each command may take., type: int, default: 30}
extends_documentation_fragment: [trainyard.core.attributes, trainyard.core.attributes.job]
author: trainyard
"""

EXAMPLES = r"""
- name: Progress and GPUs of the node
  job_progress:
    job: train
  register: __job_progress
"""

RETURN = r"""
progress: {description: The ranks' progress records., returned: always, type: list}
gpus: {description: "Per GPU: index, util_pct, mem_used_mib, mem_total_mib, temp_c, throttle.", returned: always, type: list}
gpu_skipped: {description: Why there is no GPU state (empty when there is)., returned: always, type: str}
now: {description: The node's clock (epoch seconds) when it read the progress., returned: always, type: float}
log_mtime: {description: "When the job last wrote its log (epoch seconds, the node's clock); null when there is no log
  (a link there counts as none).", returned: always, type: float}
stacks: {description: "Per rank: rank, local_rank, pid, state (of /proc/PID/stat), method (py-spy or faulthandler), call,
  text, kept (the file on the node); or skipped with the reason.", returned: with stacks, type: list}
"""

import json
import os
import signal
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils.gpu_health import parse_health_xml
from ansible_collections.trainyard.core.plugins.module_utils.job_collect import (
    JobTree, main_call, parse_stacks, read_progress,
)
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
from ansible_collections.trainyard.core.plugins.module_utils import procgroup as pg

SEARCH_DIRS = ["/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/usr/sbin"]
SIGUSR1_BIT = 1 << (signal.SIGUSR1 - 1)


def sigusr1_caught(pid):
    """Whether the process installed a handler for SIGUSR1 (SigCgt of /proc/PID/status)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & SIGUSR1_BIT)
    except (OSError, ValueError):
        pass
    return False


def main():
    m = AnsibleModule(
        argument_spec=pg.job_args(
            container=dict(type="str", default=""),
            stacks=dict(type="bool", default=False),
            py_spy=dict(type="str", default=""),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    p = m.params
    try:
        lay = tr.job_layout(p["state_root"], p["job"])
    except tr.LaunchError as e:
        m.fail_json(msg="job: %s" % e)
    tree = JobTree(lay, tr.JOB_RO_DIR, tr.JOB_RW_DIR)
    try:
        out = progress_and_stacks(m, p, tree)
    finally:
        tree.close()
    m.exit_json(**out)


def progress_and_stacks(m, p, tree):
    tbin = m.get_bin_path("timeout")

    def run(argv):
        if tbin and p["timeout"] > 0:
            argv = [tbin, "-k", "5", str(p["timeout"])] + argv
        return m.run_command(argv, environ_update={"LC_ALL": "C"}, errors="surrogate_or_replace")

    out = {"changed": False, "progress": [], "gpus": [], "gpu_skipped": ""}
    # the ranks' progress files: job-rw/progress, written by the job, read through the tree's fds
    out["progress"] = [rec for _n, _r, rec in read_progress(tree) if rec is not None and "rank" in rec]
    out["now"] = time.time()
    # when the job last wrote its log (lstat, through the tree): what tells a silent job from a busy one when its
    # entry point writes no progress files
    out["log_mtime"] = tree.mtime("rw", tree.log_name(launch_state(tree).get("log")))

    smi = m.get_bin_path(p["nvidia_smi"], opt_dirs=SEARCH_DIRS) if p["nvidia_smi"] else None
    if not smi:
        out["gpu_skipped"] = "no nvidia-smi on the node (no GPU)"
    else:
        rc, o, e = run([smi, "-q", "-x"])
        if rc != 0:
            out["gpu_skipped"] = "nvidia-smi -q -x failed (exit %s): %s" % (rc, (o + e).strip()[:200])
        else:
            try:
                out["gpus"] = [{k: g.get(k) for k in ("index", "pci", "util_pct", "mem_used_mib", "mem_total_mib",
                                                      "temp_c", "throttle", "power_w")} for g in parse_health_xml(o)]
            except ValueError as ex:
                out["gpu_skipped"] = str(ex)

    if p["stacks"]:
        out["stacks"] = stacks(m, run, tree, p["container"], p["py_spy"])
    return out


# At most this many ranks for a launch recorded without nproc_per_node; the stack text kept per rank.
MAX_RANKS = 64
STACK_TEXT_MAX = 64 * 1024


def find_ranks(state):
    """This job's ranks on the node from /proc: the recorded torchrun agent's direct children (procgroup.job_ranks),
    at most the launch's nproc_per_node."""
    limit = state.get("nproc_per_node")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit <= MAX_RANKS:
        limit = MAX_RANKS
    return pg.job_ranks(state, pg.all_stats(), pg.read_environ, limit)


def keep_stack(m, tree, rank, text):
    """Keep a rank's stack in the host-only state directory (<job>/stacks/rank_<N>.txt) for collect.yml; never in
    check mode. Written through the directory's fd, no link followed (the job cannot write there)."""
    if m.check_mode or tree.fd.get("dir") is None:
        return None
    dfd = tree.fd["dir"]
    try:
        os.mkdir("stacks", 0o700, dir_fd=dfd)
    except FileExistsError:
        pass
    except OSError:
        return None
    sfd, _why = tree.subdir("dir", "stacks")
    if sfd is None:
        return None
    name = "rank_%d.txt" % rank
    try:
        fd = os.open(name + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=sfd)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(name + ".tmp", name, src_dir_fd=sfd, dst_dir_fd=sfd)
    except OSError:
        return None
    finally:
        os.close(sfd)
    return os.path.join(tree.paths["dir"], "stacks", name)


def launch_state(tree):
    """The host-only launch.json (written by the launch module, never by the job) as a dict; {} when unreadable."""
    st = tree.read("dir", tr.STATE_FILE, 1 << 20)
    try:
        state = json.loads((st["data"] or b"{}").decode("utf-8", "replace"))
    except ValueError:
        state = {}
    return state if isinstance(state, dict) else {}


def stacks(m, run, tree, container, py_spy):
    """Every rank's Python stack (see DOCUMENTATION)."""
    state = launch_state(tree)
    if not state.get("token"):
        return [{"rank": None, "skipped": "no launch state (launch.json) on this node: no job to dump"}]
    ranks = find_ranks(state)
    if not ranks:
        return [{"rank": None, "skipped": "no rank of this job runs on the node (no child of its torchrun agent "
                 "with a RANK): the ranks exited"}]
    pyspy = None
    if py_spy and os.path.isfile(py_spy) and os.access(py_spy, os.X_OK):
        pyspy = py_spy
    pyspy = pyspy or m.get_bin_path("py-spy", opt_dirs=SEARCH_DIRS)
    docker = m.get_bin_path("docker", opt_dirs=SEARCH_DIRS) if container else None
    log = tree.log_name(state.get("log"))  # in job-rw: the job writes it, so it is read through the tree
    res = []
    for rk in ranks:
        rank, pid = rk["rank"], rk["pid"]
        text, method, why = "", None, []
        # A stopped rank cannot be suspended by py-spy (it is already): read it without suspending.
        nonblock = ["--nonblocking"] if rk["state"] in ("T", "t") else []
        tries = []
        if pyspy:
            tries.append([pyspy, "dump"] + nonblock + ["--pid", str(pid)])
            if not nonblock:
                tries.append([pyspy, "dump", "--nonblocking", "--pid", str(pid)])
        elif docker:
            tries.append([docker, "exec", container, "py-spy", "dump"] + nonblock + ["--pid", str(pid)])
        else:
            why.append("py-spy: not on the node (status.yml places it when launch_status_pyspy names it on the "
                       "controller)")
        for argv in tries:
            if pg.start_ticks(pid) != rk["start_ticks"]:
                break  # the rank exited meanwhile: the PID is not its any more
            rc, o, e = run(argv)
            if rc == 0 and "Thread " in o:
                text, method = o, "py-spy"
                break
            why.append("py-spy: %s" % ((e or o).strip().splitlines() or ["exit %s" % rc])[-1][:200])
        if not method and sigusr1_caught(pid):
            start = tree.read("rw", log, 0)["size"]
            if pg.signal_process(pid, rk["start_ticks"], signal.SIGUSR1):
                for _ in range(20):
                    time.sleep(0.25)
                    r = tree.read("rw", log, 4 << 20)
                    tail = (r["data"] or b"").decode("utf-8", "replace")[max(0, start - max(0, r["size"] - len(r["data"] or b""))):]
                    if "most recent call first" in tail:
                        time.sleep(0.5)
                        r = tree.read("rw", log, 4 << 20)
                        text, method = (r["data"] or b"").decode("utf-8", "replace")[
                            max(0, start - max(0, r["size"] - len(r["data"] or b""))):], "faulthandler (SIGUSR1)"
                        break
        elif not method:
            why.append("SIGUSR1 not caught by the rank (no faulthandler.register(SIGUSR1)): not sent")
        if not method:
            res.append({"rank": rank, "pid": pid, "state": rk["state"], "skipped": "; ".join(why) or "no stack tool"})
            continue
        text = text[-STACK_TEXT_MAX:]
        threads = parse_stacks(text)
        res.append({"rank": rank, "local_rank": rk["local_rank"], "pid": pid, "state": rk["state"], "method": method,
                    "call": main_call(threads), "text": text[-20000:], "kept": keep_stack(m, tree, rank, text)})
    return res


if __name__ == "__main__":
    main()
