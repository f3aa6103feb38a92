"""Every host-side touch of a tree the job can write goes through module_utils/jobtree.py (issue 33, "one layer").

The product's Python is parsed (ast) and, in the modules that handle job trees (JOB_TREE_MODULES), any of these
outside jobtree.py fails the test: a path-based ``open()``/``os.open()`` (no ``dir_fd``), ``os.chmod``,
``os.chown``/``os.lchown``, ``shutil.rmtree``, ``os.walk`` and ``mmap``. Each remaining use is named in ALLOWED
with the reason it is safe (reading /proc, a host-only root-owned file); the test fails on a stale entry too, so
the list only shrinks. Every product file that mentions a job tree is classified, so a new one cannot slip by.
"""

from __future__ import annotations

import ast

from helpers import REPO

MU = "collections/ansible_collections/trainyard/core/plugins/module_utils/"
PU = "collections/ansible_collections/trainyard/core/plugins/plugin_utils/"
LAYER = MU + "jobtree.py"

# Node-side code that opens, reads, writes, lists or removes in the output root, the code directory, job-rw,
# /dev/shm or /tmp.
JOB_TREE_MODULES = [
    "library/job_files.py", "library/job_reset.py", "library/torchrun_launch.py", "library/job_progress.py",
    "library/job_collect.py", "library/collect_bundle.py", "library/checkpoint_copy.py",
    "library/checkpoint_shards.py",
    MU + "checkpoints.py", MU + "ckpt_transfer.py", MU + "recover.py", MU + "job_collect.py", MU + "torchrun.py",
    MU + "launcher.py", MU + "procgroup.py", "library/slurm_job.py", MU + "slurm_node.py",
]

# Files that name a job tree but never touch one on a node, and why.
NOT_JOB_TREE = {
    "library/host_facts.py": "passes the output root to statvfs (free space); reads /proc, /sys, /etc only",
    "action_plugins/llamafactory_validate.py": "controller: validates a config in a private temporary directory",
    "action_plugins/host_basics.py": "controller: builds checks from variables",
    "action_plugins/preflight_check.py": "controller: checks variables",
    "filter_plugins/cluster_report.py": "controller: formats results already returned by modules",
    "filter_plugins/recover_shards.py": "controller: plans shard transfers from returned lists",
    PU + "ds_config.py": "controller: builds a DeepSpeed config from variables",
    PU + "nccl_vars.py": "controller: builds environment variables",
    PU + "host_basics.py": "controller: builds checks from variables",
    PU + "janitor_checks.py": "controller: builds a record from the janitor's dry-run answer",
    PU + "container_checks.py": "controller: builds records from the engine's and the health probe's answers",
    "action_plugins/container_health.py": "controller: hands docker_container_exec its arguments, records the answer",
    "action_plugins/janitor_check.py": "controller: hands job_files and the dry run their arguments, records the answer",
    PU + "cluster_model.py": "controller: reads the inventory's cluster spec",
    "roles/container/files/container_health.py": "runs inside the training container: the job's own side",
    "roles/recover/files/recover_ckpt.py": "runs with the job's Python inside the training container (the job's own "
                                          "side), as recover's inline -c scripts did; with launch_runtime host it "
                                          "reads and rewrites the head's checkpoint files by path as the connecting user",
    PU + "recover_convert.py": "controller: builds the conversion command and recover.json from returned values",
    "filter_plugins/container_filters.py": "controller: builds container arguments",
    "filter_plugins/train_args_filters.py": "controller: builds trainer arguments",
}

HOST_ONLY_STATE = "<state>/<job>/ (host-only: never mounted into the container; validation keeps it out of mounts)"

# (file, function, call): why it is safe.
ALLOWED = {
    ("library/slurm_job.py", "SlurmJob.prepared", "open"): "reads the env files the render play wrote (nccl.env in "
    "job-ro, read-only in the container), as torchrun_launch does",
    ("library/slurm_job.py", "SlurmJob.differs", "open"): "reads node.json, job.env and the runner in " + HOST_ONLY_STATE
    + "slurm/ (0700)",
    ("library/slurm_job.py", "SlurmJob.load_record", "open"): "reads slurm.json in " + HOST_ONLY_STATE,
    ("library/slurm_job.py", "SlurmJob.submit_lock", "os.open"): "the submit lock in " + HOST_ONLY_STATE
    + "slurm/ (0700), O_NOFOLLOW",
    ("library/slurm_job.py", "SlurmJob.status", "open"): "reads slurm/node.json in " + HOST_ONLY_STATE,
    ("library/slurm_job.py", "SlurmJob.collected", "open"): "reads slurm.json in " + HOST_ONLY_STATE
    + " (the batch output, which the job step writes, goes through the layer)",
    (MU + "slurm_node.py", "load", "open"): "reads its spec in " + HOST_ONLY_STATE + "slurm/ (0700)",
    (MU + "slurm_node.py", "token_holders", "open"): "reads /proc/<pid>/environ",
    (MU + "slurm_node.py", "watchdog", "os.open"): "opens /dev/null",
    (MU + "slurm_node.py", "open_log", "os.open"): "the node's log in job-rw: O_NOFOLLOW | O_NONBLOCK, a regular file "
    "only (fstat), created 0644; the runner is standalone (written to the node as one file), so the layer's own "
    "helpers are not importable there",
    ("library/job_reset.py", "proc_mapped_paths", "open"): "reads /proc/<pid>/maps",
    ("library/job_reset.py", "unix_sockets", "open"): "reads /proc/net/unix",
    ("library/job_reset.py", "Reset.states", "open"): "reads launch.json in " + HOST_ONLY_STATE,
    ("library/job_reset.py", "unlink_in", "os.open"): "removes the launch records in " + HOST_ONLY_STATE + " and the "
    "secret files of /run/trainyard/<job>/secrets (read-only in the container), through an O_NOFOLLOW directory "
    "descriptor",
    (MU + "torchrun.py", "read_state", "open"): "reads launch.json in " + HOST_ONLY_STATE + " (host_facts job)",
    ("library/torchrun_launch.py", "Launch.other_jobs", "open"): "reads launch.json of other jobs, " + HOST_ONLY_STATE,
    ("library/torchrun_launch.py", "Launch.file_envs", "open"):
        "reads the env files the nccl_env role wrote into job-ro (mounted read-only: the job cannot write it)",
    ("library/torchrun_launch.py", "Launch.secret_names", "open"): "reads the root-owned 0600 secret env file",
    ("library/job_progress.py", "sigusr1_caught", "open"): "reads /proc/<pid>/status",
    (MU + "checkpoints.py", "_Logger.__init__", "os.open"):
        "the janitor's --log (O_NOFOLLOW|O_NONBLOCK, type checked after the open), written by the unprivileged "
        "janitor user; the role keeps it in the host-only janitor_dir",
    (MU + "checkpoints.py", "load_config", "os.open"): "the janitor's root-owned config in " + HOST_ONLY_STATE,
    (MU + "torchrun.py", "write_atomic", "os.open"):
        "O_EXCL|O_NOFOLLOW temporary file beside launch.json or the launcher, in " + HOST_ONLY_STATE + " or job-ro",
    (MU + "launcher.py", "stat", "open"): "reads /proc/<pid>/stat",
    (MU + "launcher.py", "leftovers", "open"): "reads /proc/<pid>/environ",
    (MU + "procgroup.py", "read_stat", "open"): "reads /proc/<pid>/stat",
    (MU + "procgroup.py", "read_environ", "open"): "reads /proc/<pid>/environ",
    (MU + "procgroup.py", "read_cmdline", "open"): "reads /proc/<pid>/cmdline",
    (MU + "procgroup.py", "read_cgroup", "open"): "reads /proc/<pid>/cgroup",
    (MU + "procgroup.py", "start_detached", "os.open"):
        "a sidecar's log in " + HOST_ONLY_STATE + ", O_NOFOLLOW (a link is refused, never followed)",
    (MU + "launcher.py", "read_file", "os.open"):
        "the launch spec, env files and secret env file (job-ro, host-only): O_NOFOLLOW|O_NONBLOCK, regular files "
        "only (fstat after the open), capped at 16 MiB; the launcher runs in the container, stdlib only, no jobtree",
    (MU + "launcher.py", "write_json", "os.open"): "O_CREAT|O_EXCL|O_NOFOLLOW temporary file, renamed over the record",
    (MU + "launcher.py", "main", "os.open"):
        "job-rw/torchrun.log O_CREAT|O_APPEND|O_NOFOLLOW (a planted link fails the launch, never followed; the "
        "launcher writes as the job's own user inside the container), and os.devnull",
    ("library/torchrun_launch.py", "write_secret_files", "os.open"):
        "the host-only /run/trainyard/<job> and its secrets directory O_NOFOLLOW|O_DIRECTORY, each file O_EXCL|"
        "O_NOFOLLOW relative to it (mounted read-only into the container: never job-writable)",
    (MU + "ckpt_transfer.py", "pack", "shutil.rmtree"): "removes its own private mkdtemp directory (0700, root's)",
}


BANNED_ATTRS = {("os", "chmod"), ("os", "chown"), ("os", "lchown"), ("shutil", "rmtree"), ("os", "walk"),
                ("mmap", "mmap")}


def product_files():
    roots = ["library", "action_plugins", "filter_plugins", "callback_plugins",
             "collections/ansible_collections/trainyard/core/plugins"]
    out = [p for r in roots for p in (REPO / r).rglob("*.py")]
    out += list(REPO.glob("roles/*/files/**/*.py")) + list(REPO.glob("roles/*/filter_plugins/*.py"))
    return sorted(str(p.relative_to(REPO)) for p in out)


class Finder(ast.NodeVisitor):
    """(function, call name, line) of every banned call; function as the lists spell it: the outermost function,
    or Class.method (nested functions count as the one they are in)."""

    def __init__(self):
        self.stack, self.found = [], []

    def _scope(self, node):
        self.stack.append((node.name, isinstance(node, ast.ClassDef)))
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def add(self, name, node):
        names = [n for n, _ in self.stack]
        where = ".".join(names[:2]) if self.stack and self.stack[0][1] else (names[0] if names else "<module>")
        self.found.append((where, name, node.lineno))

    def visit_Import(self, node):
        for a in node.names:
            if a.name == "mmap":
                self.add("mmap", node)
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        if node.module == "mmap":
            self.add("mmap", node)
        self.generic_visit(node)

    def visit_Call(self, node):
        f = node.func
        kw = {k.arg for k in node.keywords}
        if isinstance(f, ast.Name) and f.id == "open":
            self.add("open", node)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            pair = (f.value.id, f.attr)
            if pair == ("os", "open") and "dir_fd" not in kw:
                self.add("os.open", node)
            elif pair in BANNED_ATTRS:
                self.add("%s.%s" % pair, node)
        self.generic_visit(node)


def offenders(rel):
    finder = Finder()
    finder.visit(ast.parse((REPO / rel).read_text(), rel))
    return finder.found


def test_every_file_that_names_a_job_tree_is_classified():
    markers = ("job-rw", "job_rw", "output_root", "code_dir", "/dev/shm", "checkpoint", "flight_recorder")
    unclassified = [f for f in product_files() if f != LAYER and f not in JOB_TREE_MODULES and f not in NOT_JOB_TREE
                    and any(m in (REPO / f).read_text() for m in markers)]
    assert not unclassified, "classify in JOB_TREE_MODULES or NOT_JOB_TREE (with the reason): %s" % unclassified
    missing = [f for f in JOB_TREE_MODULES + list(NOT_JOB_TREE) if not (REPO / f).is_file()]
    assert not missing, missing


def test_job_tree_code_touches_trees_only_through_the_layer():
    seen, bad = set(), []
    for rel in JOB_TREE_MODULES:
        for func, call, line in offenders(rel):
            key = (rel, func, call)
            seen.add(key)
            if key not in ALLOWED:
                bad.append("%s:%d %s() calls %s" % (rel, line, func, call))
    assert not bad, ("path-based access in code that handles job trees: use module_utils/jobtree.py (or, where "
                     "it is not a job tree, add the call to ALLOWED with the reason):\n" + "\n".join(bad))
    stale = sorted(k for k in ALLOWED if k not in seen)
    assert not stale, "no longer offending: remove from ALLOWED: %s" % stale


def test_the_scan_catches_what_it_is_meant_to(tmp_path):
    src = ("import os, shutil, mmap\n"
           "def f(p, d):\n"
           "    open(p)\n    os.open(p, 0)\n    os.open('x', 0, dir_fd=d)\n    os.chmod(p, 0)\n    os.chown(p, 0, 0)\n"
           "    shutil.rmtree(p)\n    os.walk(p)\n    mmap.mmap(-1, 1)\n")
    finder = Finder()
    finder.visit(ast.parse(src))
    assert [c for _, c, _ in finder.found] == ["mmap", "open", "os.open", "os.chmod", "os.chown", "shutil.rmtree",
                                               "os.walk", "mmap.mmap"]
