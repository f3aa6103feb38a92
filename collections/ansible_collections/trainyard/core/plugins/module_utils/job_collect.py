# -*- coding: utf-8 -*-
"""Evidence of a job from one node, read safely, and what the controller concludes from every node's evidence.

Pure functions (standard library only) shared by the module `job_collect` (on the nodes), `collect_bundle` (on the
controller) and the job role's status filters. Unit tests: tests/unit/module_utils/test_job_collect.py.

Everything in the job's read-only and job-writable directories (job-ro/, job-rw/ beneath the host-only state
directory; module_utils/torchrun.py) may have been written or replaced by the job (its flight-recorder dumps,
progress files, log, pid and exit records): it is read through directory fds without following symbolic links,
only from regular files, and never more than a cap (JobTree).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat

from ansible_collections.trainyard.core.plugins.module_utils import jobtree
from ansible_collections.trainyard.core.plugins.module_utils.torchrun import capped_lines as _capped_lines
from ansible_collections.trainyard.core.plugins.module_utils.torchrun import looks_secret as _looks_secret

# ----------------------------------------------------------------------------------------- safe reads

TRUNCATED_MARK = b"\n[... trainyard: %d bytes left out here; the head and the tail are kept ...]\n"
# What one listing of a job-writable directory may hold before it is refused (jobtree caps the scan itself).
LIST_MAX_ENTRIES = 4096


def _skip(why):
    return {"data": None, "size": 0, "truncated": False, "skipped": why}


def _why(e, dir_fd, name):
    """The one-line reason a read was refused, from jobtree's refusal (or the OS error)."""
    if isinstance(e, FileNotFoundError):
        return "absent"
    st = jobtree.stat_at(dir_fd, name) if dir_fd is not None and name else None
    if st is not None and stat.S_ISLNK(st.st_mode):
        return "a symbolic link (not followed)"
    if isinstance(e, jobtree.TreeError) and (e.strerror or "").startswith("not a regular file"):
        return "not a regular file"  # a FIFO, device node or socket: never opened
    if isinstance(e, jobtree.TreeError):
        return e.strerror or str(e)
    return "unreadable: %s" % (e.strerror or e)


def safe_read(path, max_bytes, head_bytes=0, dir_fd=None):
    """Read a file that the job may control through the jobtree layer: no symbolic link followed, regular files
    only (the type is checked before the file is opened: a FIFO or device node is never opened), at most
    `max_bytes` kept. When larger, the first `head_bytes` and the last bytes are kept (the tail always). `path` is
    relative to `dir_fd`, or absolute (its parent directories are the host's).

    Returns {data: bytes or None, size, truncated, skipped: '' or why}.
    """
    own = dir_fd is None
    try:
        root, name = (jobtree.open_root(os.path.dirname(path) or "."), os.path.basename(path)) if own \
            else (dir_fd, path)
    except OSError as e:
        return _skip(_why(e, None, None))
    try:
        fd = jobtree.open_file(root, name)
    except OSError as e:
        return _skip(_why(e, root, name))
    finally:
        if own:
            os.close(root)
    try:
        size = jobtree.file_size(fd)
        if size <= max_bytes:
            data = jobtree.read_fd(fd, max_bytes)
            return {"data": data, "size": size, "truncated": len(data) < size, "skipped": ""}
        head = jobtree.read_fd(fd, head_bytes) if head_bytes > 0 else b""
        tail = jobtree.read_fd(fd, max(0, max_bytes - len(head)), tail=True)
        left = max(0, size - len(head) - len(tail))
        return {"data": head + (TRUNCATED_MARK % left) + tail, "size": size, "truncated": True, "skipped": ""}
    finally:
        os.close(fd)


def open_dir(path, dir_fd=None):
    """(fd, '') of a directory opened through jobtree (no symbolic link followed at `path`, relative to `dir_fd`
    when given), or (None, why): absent, a symbolic link, not a directory. Open the job-writable tree one level at
    a time from a trusted directory's fd, so that no link the job planted in between is followed."""
    try:
        return (jobtree.open_dir(dir_fd, path) if dir_fd is not None else jobtree.open_root(path)), ""
    except FileNotFoundError:
        return None, "absent"
    except jobtree.TreeError:
        return None, "a symbolic link or not a directory (not followed)"
    except OSError as e:
        return None, "unreadable: %s" % e.strerror


def list_names(fd, max_entries=LIST_MAX_ENTRIES):
    """(sorted names, why) of an open directory through jobtree.listdir (which follows nothing): ([], why) when it
    cannot be listed or holds more than max_entries. Links, FIFOs and devices are listed: reading them is refused
    by safe_read, naming why."""
    if fd is None:
        return [], ""
    try:
        return [n for n, _kind in jobtree.listdir(fd, ".", max_entries)], ""
    except OSError as e:
        return [], "not listed: %s" % (e.strerror or e)


def listdir_fd(fd):
    """Sorted names in an open directory; [] when it cannot be listed (or holds too many) or fd is None."""
    return list_names(fd)[0]


def safe_listdir(path):
    """Names in a directory that is not a symbolic link; [] when absent or a link."""
    fd, _why = open_dir(path)
    try:
        return listdir_fd(fd)
    finally:
        if fd is not None:
            os.close(fd)


class JobTree(object):
    """A job's directories on a node, opened once: the host-only state directory (`layout['dir']`) and, through
    its fd, the read-only and job-writable parts beneath it (`ro_name`, `rw_name`), none through a symbolic link.
    Files are then read by name relative to those fds (safe_read: no link, regular files, capped), so nothing the
    job writes can send a read elsewhere on the host. close() when done."""

    def __init__(self, layout, ro_name, rw_name):
        self.paths = {"dir": layout["dir"], "ro": layout["ro"], "rw": layout["rw"]}
        self.fd, self.why = {}, {}
        self.fd["dir"], self.why["dir"] = open_dir(layout["dir"])
        for key, name in (("ro", ro_name), ("rw", rw_name)):
            if self.fd["dir"] is None:
                self.fd[key], self.why[key] = None, self.why["dir"]
            else:
                self.fd[key], self.why[key] = open_dir(name, self.fd["dir"])

    def read(self, where, name, max_bytes, head_bytes=0):
        """safe_read of the file `name` (a plain name, no '/') in the part `where` (dir, ro or rw)."""
        if not name or "/" in name or name in (".", ".."):
            return {"data": None, "size": 0, "truncated": False, "skipped": "not a plain file name: %r" % (name,)}
        if self.fd.get(where) is None:
            return {"data": None, "size": 0, "truncated": False,
                    "skipped": "%s: %s" % (self.paths.get(where, where), self.why.get(where, "unknown part"))}
        return safe_read(name, max_bytes, head_bytes, dir_fd=self.fd[where])

    def read_first(self, wheres, name, max_bytes, head_bytes=0):
        """The first of `wheres` that holds `name` (not absent); else the last one's answer."""
        r = None
        for where in wheres:
            r = self.read(where, name, max_bytes, head_bytes)
            if r["skipped"] != "absent" and not r["skipped"].endswith(": absent"):
                return r
        return r

    def subdir(self, where, name):
        """(fd, why) of the directory `name` in the part `where`, no link followed; the caller closes the fd."""
        if self.fd.get(where) is None:
            return None, "%s: %s" % (self.paths.get(where, where), self.why.get(where, "unknown part"))
        return open_dir(name, self.fd[where])

    def log_name(self, state_log, default="torchrun.log"):
        """The log's name in the job-writable part: launch.json's `log` when it sits directly there, else
        `default` (a log configured elsewhere is not read: it is outside the job's tree)."""
        if state_log and os.path.dirname(state_log) == self.paths["rw"] and os.path.basename(state_log):
            return os.path.basename(state_log)
        return default

    def mtime(self, where, name):
        """Modification time of the regular file `name` in the part `where` (lstat: a link is not followed and
        counts as absent), or None."""
        if not name or "/" in name or self.fd.get(where) is None:
            return None
        try:
            st = jobtree.stat_at(self.fd[where], name)
        except OSError:
            return None
        return st.st_mtime if st is not None and stat.S_ISREG(st.st_mode) else None

    def close(self):
        for key, fd in list(self.fd.items()):
            if fd is not None:
                os.close(fd)
            self.fd[key] = None


PROGRESS_MAX_BYTES = 65536
# The most progress files (rank_<N>.json) read on one node: far above the ranks a node runs.
PROGRESS_MAX_FILES = 256
# The fields of a progress record (the example trainers, module_utils/train_progress) the controller computes with:
# a record of other types is refused at the reader (jobtree.loads_bounded), its file still collected.
NUM = (int, float)
PROGRESS_SCHEMA = {"rank": int, "step": int, "steps_total": int, "time": NUM, "step_s": NUM, "compute_s": NUM}


def read_progress(tree, max_files=PROGRESS_MAX_FILES):
    """The ranks' progress files (job-rw/progress/rank_<N>.json) through `tree` (a JobTree): a list of
    (name, safe_read result, record or None) for at most max_files files that could be read; record is the parsed
    dict, None when it is not JSON, too deep or of the wrong types (r["refused"] says why)."""
    fd, _why = tree.subdir("rw", "progress")
    res = []
    try:
        names = [n for n in listdir_fd(fd) if n.startswith("rank_") and n.endswith(".json")]
        for n in names[:max_files]:
            r = safe_read(n, PROGRESS_MAX_BYTES, dir_fd=fd)
            if r["data"] is None:
                continue
            try:
                rec = jobtree.loads_bounded(r["data"], expect=PROGRESS_SCHEMA)
            except jobtree.BadRecord as e:
                rec, r["refused"] = None, e.strerror or str(e)
            res.append((n, r, rec))
    finally:
        if fd is not None:
            os.close(fd)
    return res


# ----------------------------------------------------------------------------------------- secrets

REDACTED = "<redacted>"
# Nesting of a collected JSON file that is parsed to redact it (deeper: redacted as text, never a RecursionError).
JSON_MAX_DEPTH = 64


def is_secret_name(name):
    """The one secret-name rule (torchrun.SECRET_NAME, docs/security.md "Secrets"): the bundle hides what the
    launch's results and the validate play hide."""
    return _looks_secret(name)


def redact_env_text(text):
    """KEY=VALUE lines (env files, logs of env dumps): values of secret-looking names replaced."""
    out = []
    for line in text.splitlines(True):
        m = re.match(r"^(\s*(?:export\s+)?)([A-Za-z_][A-Za-z0-9_]*)=(.*?)(\r?\n?)$", line)
        if m and is_secret_name(m.group(2)):
            line = "%s%s=%s%s" % (m.group(1), m.group(2), REDACTED, m.group(4))
        out.append(line)
    return "".join(out)


def redact_json(obj):
    """Values under secret-looking keys replaced, recursively; also KEY=VALUE strings in lists (argv, env)."""
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_name(k) and not isinstance(v, (dict, list)) else redact_json(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_json(v) for v in obj]
    if isinstance(obj, str):
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=", obj)
        if m and is_secret_name(m.group(1)):
            return m.group(1) + "=" + REDACTED
    return obj


def redact_file(name, data):
    """Bytes of a collected file with secrets removed, by kind (env files, JSON); other files unchanged."""
    if data is None:
        return data
    if name.endswith(".env") or name == "environ":
        return redact_env_text(data.decode("utf-8", "replace")).encode()
    if name.endswith(".json"):
        try:
            obj = jobtree.loads_bounded(data.decode("utf-8", "replace"), max_depth=JSON_MAX_DEPTH)
            return (json.dumps(redact_json(obj), indent=1) + "\n").encode()
        except ValueError:  # not JSON, too deep (jobtree.BadRecord): redacted as text
            return redact_env_text(data.decode("utf-8", "replace")).encode()
    return data


# ----------------------------------------------------------------------------------------- torchelastic error files

# Matched line by line ([ \t], never \s: with re.M a \s* ran across every following line, quadratic in lines).
_ERROR_FILE = re.compile(r"[ \t]*error_file[ \t]*:[ \t]*(/\S+)[ \t]*$")


def error_files_in_log(text):
    """Paths of torchelastic error files named in torchrun's failure report (`error_file: /tmp/.../error.json`)."""
    found = (_ERROR_FILE.match(line) for line in _capped_lines(text) if "error_file" in line)
    return list(dict.fromkeys(m.group(1) for m in found if m and m.group(1) != "<N/A>"))


# ----------------------------------------------------------------------------------------- flight recorder

def normalize_fr_dump(dump):
    """A flight-recorder dump (the unpickled dict) the analyzer can read. Dumps of the gloo backend name the
    default group '' in pg_config while their entries name it '0' (the analyzer then fails with KeyError:
    ('0', 0)); such a group is renamed to the name its entries use. Returns (dump, changed)."""
    cfg = dump.get("pg_config") or {}
    if not isinstance(cfg, dict) or "" not in cfg or not isinstance(cfg[""], dict):
        return dump, False
    entries = dump.get("entries") if isinstance(dump.get("entries"), list) else []
    names = {tuple(str(x) for x in e["process_group"][:2]) for e in entries
             if isinstance(e, dict) and isinstance(e.get("process_group"), (list, tuple))
             and len(e["process_group"]) >= 2}
    name, desc = next(iter(sorted(names))) if len(names) == 1 else ("0", "default_pg")
    fixed = dict(cfg)
    entry = dict(fixed.pop(""))
    entry["name"], entry["desc"] = name, entry.get("desc") or desc
    fixed[name] = entry
    out = dict(dump)
    out["pg_config"] = fixed
    status = out.get("pg_status") or {}
    if isinstance(status, dict) and "" in status:
        status = dict(status)
        status[name] = status.pop("")
        out["pg_status"] = status
    return out, True


_FR_FIELDS = {
    "internal record id": "record_id", "group info": "group", "collective": "op", "missing ranks": "missing_ranks",
    "input sizes": "input_sizes", "output sizes": "output_sizes", "world size": "world_size",
    "expected ranks": "expected_ranks", "collective state": "state",
}


def _ranks(value):
    return sorted(int(x) for x in re.findall(r"-?\d+", value or ""))


_FR_SEQ = ", sequence number: "
_DIGITS = re.compile(r"\d+")


def _fr_heading(line):
    """(kind, sequence number) of a problem heading of the analyzer ('Not all ranks joining collective, sequence
    number: 7', '... mismatch, sequence number: 3'), else (None, None). String search, not a backtracking regex:
    the last ', sequence number: <digits>' of the line ends the kind."""
    i = line.rfind(_FR_SEQ)
    while i >= 0:
        m = _DIGITS.match(line, i + len(_FR_SEQ))
        if m:
            kind = line[:i]
            if kind.startswith("Not all ranks joining collective") or "ismatch" in kind:
                return kind, int(m.group())
            return None, None
        i = line.rfind(_FR_SEQ, 0, i)
    return None, None


def parse_fr_report(text):
    """The analyzer's (torch.distributed.flight_recorder.fr_trace) text -> list of problems:
    {kind, seq, op, missing_ranks, input_sizes, output_sizes, world_size, expected_ranks, state, group, stack}."""
    problems, cur, in_stack = [], None, False
    for line in _capped_lines(text):
        kind, seq = _fr_heading(line)
        if kind or line.startswith("Not all ranks joining collective"):
            cur = {"kind": kind or line.strip(), "seq": seq, "stack": []}
            problems.append(cur)
            in_stack = False
            continue
        if cur is None:
            continue
        key, sep, value = line.partition(":")
        k = key.strip().lower()
        if sep and k in _FR_FIELDS:
            field = _FR_FIELDS[k]
            value = value.strip()
            if field in ("missing_ranks", "expected_ranks"):
                cur[field] = _ranks(value)
            elif field == "world_size":
                cur[field] = int(value) if value.isdigit() else value
            else:
                cur[field] = value
            in_stack = False
        elif k == "collective stack trace":
            in_stack = True
            if value.strip():
                cur["stack"].append(value.strip())
        elif in_stack and line.strip():
            cur["stack"].append(line.strip())
    return problems


def fr_lines(problems, hosts_by_rank_of, nproc_per_node):
    """Sentences naming the node and rank(s) that never joined, the collective, its sequence number and sizes."""
    out = []
    for p in problems:
        missing = p.get("missing_ranks") or []
        who = ", ".join("rank %d on %s (node rank %d, local rank %d)" % (
            r, hosts_by_rank_of(r // nproc_per_node) if nproc_per_node else "?", r // max(nproc_per_node, 1),
            r % max(nproc_per_node, 1)) for r in missing) or "no rank named"
        where = next((s for s in p.get("stack") or [] if "distributed_c10d" not in s and "c10d_logger" not in s), "")
        out.append("%s never joined collective %s (sequence number %s, input sizes %s, %s) where the other ranks "
                   "wait%s" % (who, p.get("op", "?"), p.get("seq"), p.get("input_sizes", "?"),
                               p.get("state", "state unknown"), "; they called it at %s" % where if where else ""))
    return out


# ----------------------------------------------------------------------------------------- progress, stragglers

def _median(values):
    v = sorted(values)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0


def _num(value):
    """A finite number from a record the job wrote, else None ("x", True, 1e999, NaN, a list: never a crash)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _step_record(r):
    """A progress record the summary can use: a dict with an integer step and rank and numbers where numbers
    belong (jobtree's PROGRESS_SCHEMA, checked again: records also arrive from module results)."""
    if not isinstance(r, dict) or isinstance(r.get("step"), bool) or not isinstance(r.get("step"), int):
        return False
    if isinstance(r.get("rank"), bool) or not isinstance(r.get("rank"), int):
        return False
    return all(r.get(k) is None or _num(r[k]) is not None for k in ("steps_total", "time", "step_s", "compute_s"))


def _quiet_s(info, now):
    """How long a running node without any step record has been silent: since its launch when no rank ever wrote
    its log (hung in the rendezvous or NCCL's init before any output), else since the log's last write (an entry
    point that writes no progress files but logs as it trains, e.g. the HF Trainer's progress bar). None when the
    job does not run there or the times are unknown. Both times are the node's own clock."""
    if info.get("state") != "running":
        return None
    node_now = _num(info.get("now")) or float(now)
    last = max([_num(t) for t in (info.get("started_at"), info.get("log_mtime")) if _num(t)] or [0.0])
    return max(0.0, node_now - last) if last else None


def progress_summary(per_node, now, stall_s=300, straggler_ratio=1.3):
    """per_node: {host: {"node_rank": n, "ranks": [progress dicts of the example trainers], and for a node whose ranks
    wrote none: "state" (running, ...), "started_at", "now", "log_mtime" (the node's clock)}} ->
    {nodes: [{host, node_rank, ranks, last_step, steps_total, steps_per_s, eta_s, compute_s, age_s}],
     stragglers: [{host, node_rank, ranks, compute_s, others_s, ratio, text, fix}], stalled: [hosts], reporting}.

    A straggler is a node whose ranks' median compute time (each rank's own time between collectives, not the
    lock-stepped step time) is at least straggler_ratio x the median of the other nodes' ranks.
    """
    nodes = []
    for host, info in per_node.items():
        ranks = [r for r in info.get("ranks") or [] if _step_record(r)]
        if not ranks:
            nodes.append({"host": host, "node_rank": info.get("node_rank"), "ranks": [], "last_step": None,
                          "steps_total": None, "steps_per_s": None, "eta_s": None, "compute_s": None,
                          "age_s": _quiet_s(info, now), "no_step": True})
            continue
        step = min(int(r["step"]) for r in ranks)
        total = max(int(_num(r.get("steps_total")) or 0) for r in ranks) or None
        step_s = _median([_num(r["step_s"]) for r in ranks if _num(r.get("step_s"))])
        sps = 1.0 / step_s if step_s else None
        age = max(0.0, now - max(_num(r.get("time")) or 0.0 for r in ranks))
        nodes.append({"host": host, "node_rank": info.get("node_rank"), "ranks": sorted(int(r["rank"]) for r in ranks),
                      "last_step": step, "steps_total": total, "steps_per_s": sps,
                      "eta_s": (total - step) / sps if (sps and total) else None,
                      "compute_s": _median([_num(r["compute_s"]) for r in ranks
                                            if _num(r.get("compute_s")) is not None]),
                      "age_s": age})
    stragglers = []
    with_c = [n for n in nodes if n["compute_s"] is not None]
    for n in with_c:
        others = [o["compute_s"] for o in with_c if o is not n]
        ref = _median(others)
        if not ref or ref <= 0:
            continue
        ratio = n["compute_s"] / ref
        if ratio >= straggler_ratio:
            stragglers.append({
                "host": n["host"], "node_rank": n["node_rank"], "ranks": n["ranks"], "compute_s": n["compute_s"],
                "others_s": ref, "ratio": ratio,
                "text": "%s (node rank %s) is a straggler: its ranks %s compute a step in %.3f s, the other nodes' "
                        "ranks in %.3f s (%.1fx); every rank waits for it at each collective"
                        % (n["host"], n["node_rank"], n["ranks"], n["compute_s"], ref, ratio),
                "fix": "on %s: look for GPU throttling (nvidia_driver.throttle), another process on its GPUs or CPUs "
                       "(top, nvidia-smi), a CPU quota on the training container (docker inspect: NanoCpus / "
                       "CpuQuota), a slower data path; replace the node if it stays slow" % n["host"]})
    stalled = [n["host"] for n in nodes if n["age_s"] is not None and n["age_s"] >= stall_s]
    return {"nodes": nodes, "stragglers": stragglers, "stalled": stalled,
            "reporting": sum(1 for n in nodes if n["ranks"])}


# ----------------------------------------------------------------------------------------- Python stacks

_SPY_THREAD = re.compile(r"^Thread (0x[0-9A-Fa-f]+|\d+) \((\w+)\)(?:: \"(.*)\")?")
_SPY_FRAME = re.compile(r"^\s+(\S+) \((.+?):(\d+)\)")
_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (\S+)')


def parse_stacks(text):
    """py-spy dump or faulthandler output -> [{thread, frames: [{func, file, line}] innermost first}]."""
    threads, cur = [], None
    for line in _capped_lines(text):
        m = _SPY_THREAD.match(line) or _FH_THREAD.match(line)
        if m:
            cur = {"thread": m.group(2) if m.re is _FH_THREAD else m.group(1), "frames": []}
            threads.append(cur)
            continue
        if cur is None:
            continue
        m = _SPY_FRAME.match(line)
        if m:
            cur["frames"].append({"func": m.group(1), "file": m.group(2), "line": int(m.group(3))})
            continue
        m = _FH_FRAME.match(line)
        if m:
            cur["frames"].append({"func": m.group(3), "file": m.group(1), "line": int(m.group(2))})
    return threads


_BORING = ("threading.py", "selectors.py", "queue.py", "socket.py", "site-packages/torch/_ops.py")


def main_call(threads):
    """The call a rank sits in: of the thread with the deepest stack that is not an idle helper thread, the
    innermost frame in torch.distributed (the collective) or else the innermost frame, as 'func (file:line)'."""
    best = None
    for t in threads:
        frames = t["frames"]
        if not frames or all(any(b in f["file"] for b in _BORING) for f in frames[:1]) and len(frames) < 3:
            continue
        if best is None or len(frames) > len(best["frames"]):
            best = t
    if best is None:
        return None
    frames = best["frames"]
    dist = [f for f in frames if "torch/distributed" in f["file"] and f["func"] not in ("wrapper",)]
    f = dist[0] if dist else frames[0]
    caller = next((g for g in frames if "torch/" not in g["file"] and "site-packages" not in g["file"]), None)
    text = "%s (%s:%d)" % (f["func"], os.path.basename(f["file"]), f["line"])
    if caller and caller is not f:
        text += " called from %s (%s:%d)" % (caller["func"], os.path.basename(caller["file"]), caller["line"])
    return text


def group_calls(per_rank):
    """{rank: call text or None} -> [{call, ranks}] (largest group first): which ranks sit in which call."""
    groups = {}
    for rank, call in sorted(per_rank.items()):
        groups.setdefault(call or "(no stack)", []).append(rank)
    return [{"call": c, "ranks": r} for c, r in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))]


# ----------------------------------------------------------------------------------------- the ranks on a node

# What a process state letter of /proc/PID/stat means for a hung rank, and what to do about it.
PROC_STATES = {
    "T": ("stopped (SIGSTOP, SIGTSTP or a debugger)",
          "send it SIGCONT or detach the debugger; find who stopped it (a shell's Ctrl-Z, gdb, a cgroup freezer)"),
    "t": ("stopped by a tracer (a debugger is attached)", "detach the debugger (gdb, strace, py-spy record)"),
    "D": ("in uninterruptible I/O (D: waiting on storage or a driver)",
          "look at the node's storage (a hung NFS or Lustre mount) and its kernel log (Xid, hung-task messages)"),
    "Z": ("a zombie (exited, not reaped)", "the rank died: read its traceback in the log"),
}


NO_STACK_FIX = ("put py-spy on the controller (pip install -r requirements.txt: py-spy==0.4.2; or name a copy in "
                "launch_status_pyspy), run status.yml as root on the node; py-spy inside the training container needs "
                "--cap-add SYS_PTRACE")


def stack_lines(stacks_by_host):
    """{host: [job_progress stack results]} -> the lines status.yml prints: which ranks sit in which call (largest
    group first), ranks in a telling process state with the fix, and ranks without a stack with the reason."""
    per_rank, states, notes = {}, [], []
    for host, stacks in stacks_by_host.items():
        for s in stacks or []:
            rank = s.get("rank")
            if s.get("skipped"):
                notes.append("%s rank %s: no stack: %s. fix: %s" % (
                    host, "?" if rank is None else rank, s["skipped"], NO_STACK_FIX))
                continue
            per_rank[(rank if isinstance(rank, int) else -1, host)] = s.get("call")
            st = PROC_STATES.get(s.get("state") or "")
            if st:
                states.append("rank %s on %s (pid %s) is %s. fix: %s" % (rank, host, s.get("pid"), st[0], st[1]))
    lines = []
    groups = group_calls(per_rank)
    for g in groups:
        ranks = ", ".join("%d (%s)" % k for k in g["ranks"])
        lines.append("%s %s %s in %s" % ("ranks" if len(g["ranks"]) > 1 else "rank", ranks,
                                         "sit" if len(g["ranks"]) > 1 else "sits", g["call"]))
    if len(groups) > 1:
        lines.append("fix: the ranks outside the largest group are the ones the others wait for: read their whole "
                     "stacks (kept on each node in <state dir>/<job>/stacks/rank_<N>.txt; playbooks/collect.yml "
                     "gathers them) and that rank's log tail")
    return lines + states + notes
