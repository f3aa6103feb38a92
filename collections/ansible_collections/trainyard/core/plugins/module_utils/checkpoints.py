#!/usr/bin/env python3
"""Checkpoint completeness and the checkpoint janitor (stdlib only).

Imported by the launch module (``latest_complete_checkpoint`` for resume) and shipped to every node as the
janitor script::

    python3 checkpoints.py --root /srv/outputs --log janitor.log [--dry-run] [--loop --interval 60]
                           [--keep PATTERN ...] [--min-size BYTES] [--no-keep-full-latest]
                           [--completion marker|marker_or_superseded] [--json]

What counts as a checkpoint
    A directory named ``checkpoint-<N>`` (N decimal) found under the output root without following any
    symlink (depth-limited walk, ``--max-depth``). Checkpoints are grouped by their parent directory (one
    HF Trainer run directory each); numbering, "newest" and "latest complete" are decided per group.
    ``tmp-checkpoint-N``, ``checkpoint-abc``, symlinked checkpoint directories and anything else are left
    alone.

When a checkpoint is complete
    HF Trainer's ``_save_checkpoint`` writes, in order: the model (LoRA adapter), the optimizer/scheduler
    (under DeepSpeed: ``global_stepN/`` partitions of every rank, then ``latest`` after a barrier), the
    RNG states, and last ``trainer_state.json``. The completion marker is therefore ``trainer_state.json``:
    a regular file (not a symlink) that parses as JSON (a torn write is not a marker). ``--marker`` changes
    it for other trainers.

    Only the process that saves (rank 0) writes the marker. On the other nodes of a multi-node run with a
    node-local output root, ``checkpoint-N/`` holds only that node's ZeRO partitions and never a marker.
    There the janitor runs with ``--completion marker_or_superseded``: a checkpoint also counts as complete
    once a newer ``checkpoint-M`` directory exists in the same run directory (a rank only starts save M
    after its own writes for N returned, and cannot reach step M before rank 0 passed save N). The resume
    point (``latest_complete_checkpoint``) always uses the marker alone: compute it on the head node.

What the janitor deletes, and what it never touches
    * Never anything outside the output root; never through a symlink (every decision uses lstat, and
      deletion walks the tree with ``O_NOFOLLOW`` directory descriptors, so a directory swapped for a
      symlink after planning is refused, not followed); never a symlink itself.
    * Never the newest checkpoint of a run directory (complete or not): it is left alone until a newer one
      is complete. Never an incomplete checkpoint.
    * By default (``--keep-full-latest``) never the latest complete checkpoint, and never the
      ``best_model_checkpoint`` named in the newest trainer state: resume and ``load_best_model_at_end``
      need their DeepSpeed state.
    * Never a file protected by a keep pattern: adapter weights and config (``adapter_*``, anything named
      ``*adapter*``), tokenizer files, ``trainer_state.json``, ``training_args.bin``, RNG, scheduler and
      scaler states, model config, README; plus the user's ``--keep`` patterns (fnmatch on the name and on
      the path relative to the checkpoint). Never a file smaller than ``--min-size`` bytes.
    * In the other complete checkpoints it deletes the large non-LoRA state: every file under DeepSpeed's
      ``global_step*`` directories (then the emptied directories), optimizer and ZeRO partition files
      (``optimizer.pt``, ``*optim_states.pt``, ``zero_pp_rank_*``, ``mp_rank_*_model_states.pt``, ...), and
      full-model shards (``model*.safetensors``, ``pytorch_model*.bin`` and their indexes, FSDP shards).
      DeepSpeed's ``latest`` tag file and ``zero_to_fp32.py``/``zero_to_torch.py`` go with ``global_step*`` (they only describe it).

Each real deletion is logged with the bytes it freed; ``--dry-run`` lists what would go, with sizes.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import fnmatch
import json
import os
import re
import signal
import stat
import sys
import time
from dataclasses import asdict, dataclass, field

try:
    from ansible_collections.trainyard.core.plugins.module_utils import jobtree as jt
except ImportError:  # run as the janitor script: the janitor role ships jobtree.py beside it
    import jobtree as jt

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
DEFAULT_MARKERS = ("trainer_state.json",)
COMPLETION_MODES = ("marker", "marker_or_superseded")

# Always kept, whatever the user passes: what a LoRA user needs from a checkpoint.
PROTECTED_PATTERNS = (
    "*adapter*",  # adapter_model.safetensors/.bin, adapter_config.json (also per-adapter subdirectories)
    "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt", "*.model",
    "chat_template.*", "preprocessor_config.json",
    "trainer_state.json", "training_args.bin",
    "rng_state*.pth", "scheduler.pt", "scaler.pt",
    "config.json", "generation_config.json", "README.md",
)

# Large non-LoRA state outside global_step*: optimizer, ZeRO partitions, full model shards.
DELETE_PATTERNS = (
    "optimizer.pt", "optimizer.bin", "optimizer_*.bin", "optimizer*.pt",
    "*optim_states.pt", "zero_pp_rank_*", "mp_rank_*_model_states.pt", "*_model_states.pt",
    "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
    "pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json",
    "pytorch_model_fsdp*", "*.distcp",
)
# Go with global_step*: they only describe it.
DEEPSPEED_SIDE_FILES = ("latest", "zero_to_fp32.py", "zero_to_torch.py")
GLOBAL_STEP_RE = re.compile(r"^global_step\d+$")


# --------------------------------------------------------------------------------------------- discovery

@dataclass
class Checkpoint:
    path: str          # absolute path (under the resolved root)
    parent: str        # run directory
    name: str
    step: int
    complete: bool = False
    marker: bool = False
    rel: str = ""      # path relative to the root (what every file operation uses, from the root's descriptor)


@dataclass
class Deletion:
    path: str
    size: int
    checkpoint: str
    reason: str


@dataclass
class Plan:
    root: str
    deletions: list = field(default_factory=list)
    dirs: list = field(default_factory=list)          # directories to remove once empty (deepest first)
    kept_full: list = field(default_factory=list)     # complete checkpoints kept whole, with why
    skipped: list = field(default_factory=list)       # checkpoints left alone, with why
    checkpoints: int = 0
    scanned_files: int = 0
    scan_seconds: float = 0.0
    root_fd: int | None = None                        # the root, opened once by plan(), held until execute/close

    def close(self) -> None:
        if self.root_fd is not None:
            os.close(self.root_fd)
            self.root_fd = None

    def __del__(self):
        self.close()

    @property
    def total_bytes(self) -> int:
        return sum(d.size for d in self.deletions)

    def as_dict(self) -> dict:
        return {"root": self.root, "deletions": [asdict(d) for d in self.deletions], "dirs": self.dirs,
                "kept_full": self.kept_full, "skipped": self.skipped, "checkpoints": self.checkpoints,
                "scanned_files": self.scanned_files, "scan_seconds": round(self.scan_seconds, 4),
                "total_bytes": self.total_bytes}


_DIR_FLAGS = jt.DIR_FLAGS

# A trainer state is bounded (a torn or hostile file must not exhaust the node), but far beyond any real run:
# HF Trainer logs about 250 bytes per logged step, so 2 GiB is some eight million logged steps.
TRAINER_STATE_MAX_BYTES = 2 * 1024 * 1024 * 1024
TRAINER_STATE_KEYS = ("global_step", "best_model_checkpoint")
# One token of a skipped value: a whole string, a bracket, or a lone quote (a string cut off: the file is torn).
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}"]', re.S)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_JSON_SCALAR = re.compile(rb'(?:-?[0-9][0-9.eE+-]*|true|false|null)')
_JSON_WS = re.compile(rb"[ \t\r\n]*")
_CLOSE = {ord("["): ord("]"), ord("{"): ord("}")}


def _skip_value(buf, i: int) -> int:
    """Index just after the JSON value starting at buf[i]; ValueError when it is cut off or malformed."""
    c = buf[i:i + 1]
    if c == b'"':
        m = _JSON_STRING.match(buf, i)
        if not m:
            raise ValueError("unterminated string at byte %d" % i)
        return m.end()
    if c in (b"[", b"{"):
        want = [_CLOSE[c[0]]]
        for m in _JSON_TOKEN.finditer(buf, i + 1):
            t = m.group()
            if len(t) > 1:
                continue  # a whole string
            b = t[0]
            if b in _CLOSE:
                want.append(_CLOSE[b])
            elif b == ord('"'):
                raise ValueError("unterminated string at byte %d" % m.start())
            elif b != want.pop():
                raise ValueError("mismatched %r at byte %d" % (t.decode(), m.start()))
            if not want:
                return m.end()
        raise ValueError("cut off: %d bracket(s) still open at the end" % len(want))
    m = _JSON_SCALAR.match(buf, i)
    if not m:
        raise ValueError("no JSON value at byte %d" % i)
    return m.end()


def parse_trainer_state(buf, keys=TRAINER_STATE_KEYS) -> dict:
    """The top-level ``keys`` of a trainer state (bytes-like), checking the whole document is
    one complete JSON object without building it: the log history (the bulk of a long run) is skipped token by
    token, so memory stays small whatever the run's length. Absent keys are None; ValueError when torn."""
    n = len(buf)
    i = _JSON_WS.match(buf, 0).end()
    if buf[i:i + 1] != b"{":
        raise ValueError("not a JSON object")
    out = dict.fromkeys(keys)
    i = _JSON_WS.match(buf, i + 1).end()
    if buf[i:i + 1] == b"}":
        i += 1
    else:
        while True:
            m = _JSON_STRING.match(buf, i)
            if not m:
                raise ValueError("no key at byte %d" % i)
            key = json.loads(m.group())
            i = _JSON_WS.match(buf, m.end()).end()
            if buf[i:i + 1] != b":":
                raise ValueError("no ':' after key %r" % key)
            i = _JSON_WS.match(buf, i + 1).end()
            end = _skip_value(buf, i)
            if key in out:
                out[key] = json.loads(bytes(buf[i:end]))
            i = _JSON_WS.match(buf, end).end()
            sep = buf[i:i + 1]
            i = _JSON_WS.match(buf, i + 1).end()
            if sep == b"}":
                break
            if sep != b"," or buf[i:i + 1] == b"}":
                raise ValueError("cut off or malformed after key %r" % key)
    if _JSON_WS.match(buf, i).end() != n:
        raise ValueError("data after the object")
    return out


def _read_trainer_state_fd(fd: int, keys=TRAINER_STATE_KEYS) -> dict:
    """Read into memory with pread (jobtree.read_buffer), never mapped: the job truncating the file during the
    parse gives a torn document (ValueError), not SIGBUS."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > TRAINER_STATE_MAX_BYTES:
        raise ValueError("%d bytes, over the %d bytes a trainer state may have" % (st.st_size,
                                                                                   TRAINER_STATE_MAX_BYTES))
    if st.st_size == 0:
        raise ValueError("empty")
    buf = jt.read_buffer(fd, st.st_size)
    if len(buf) != st.st_size:
        raise ValueError("changed while it was read (%d of %d bytes)" % (len(buf), st.st_size))
    return parse_trainer_state(buf, keys)


def read_trainer_state(path: str, keys=TRAINER_STATE_KEYS) -> dict:
    """``{key: value}`` of a trainer_state.json of any realistic size (see parse_trainer_state); never through a
    symlink, never a FIFO or device (jobtree.open_file). ValueError when the file is torn, not an object or too
    large; OSError when it cannot be opened."""
    dfd = jt.open_root(os.path.dirname(path) or ".")
    try:
        fd = jt.open_file(dfd, os.path.basename(path))
    finally:
        os.close(dfd)
    try:
        return _read_trainer_state_fd(fd, keys)
    finally:
        os.close(fd)


def _has_marker_at(dir_fd: int, markers=DEFAULT_MARKERS) -> bool:
    for m in markers:
        try:
            fd = jt.open_file(dir_fd, m)
        except OSError:
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            if m.endswith(".json"):
                _read_trainer_state_fd(fd, ())
        except (OSError, ValueError):
            return False
        finally:
            os.close(fd)
    return True


def has_marker(ckpt_dir: str, markers=DEFAULT_MARKERS) -> bool:
    """True when every marker is a regular file in ckpt_dir; a ``.json`` marker must also be one whole JSON
    object (a torn write is not a marker), of any realistic size."""
    try:
        fd = jt.open_root(ckpt_dir)
    except OSError:
        return False
    try:
        return _has_marker_at(fd, markers)
    finally:
        os.close(fd)


def walk_dirs(root_fd: int, parts, open_one=None) -> int:
    """A new descriptor of directory root_fd/parts..., each component opened by open_one(dir_fd, name, index)
    (default: O_DIRECTORY|O_NOFOLLOW, so any symlink on the way is refused)."""
    fd = os.dup(root_fd)
    try:
        for i, comp in enumerate(parts):
            nfd = open_one(fd, comp, i) if open_one else os.open(comp, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_rel(root_fd: int, rel: str) -> int:
    """A new descriptor of directory rel under root_fd, opened component by component, refusing any symlink."""
    return walk_dirs(root_fd, [c for c in rel.split(os.sep) if c])


def _scandir_rel(root_fd: int, rel: str, want_stat: bool = False):
    """[(name, is_dir, lstat of a regular file or None)] of directory rel under root_fd (no symlink followed;
    the lstat only with want_stat); [] when it is gone."""
    try:
        fd = _open_rel(root_fd, rel)
    except OSError:
        return []
    try:
        with os.scandir(fd) as it:
            out = []
            for e in it:
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                    st = e.stat(follow_symlinks=False) if want_stat and e.is_file(follow_symlinks=False) else None
                except OSError:
                    continue
                out.append((e.name, is_dir, st))
            return out
    except OSError:
        return []
    finally:
        os.close(fd)


def _find_checkpoints_fd(root_fd: int, rroot: str, max_depth: int) -> list[Checkpoint]:
    found: list[Checkpoint] = []
    stack = [("", 0)]
    while stack:
        rel, depth = stack.pop()
        for name, is_dir, _ in _scandir_rel(root_fd, rel):
            if not is_dir:
                continue
            sub = os.path.join(rel, name) if rel else name
            m = CHECKPOINT_RE.match(name)
            if m:
                found.append(Checkpoint(path=os.path.join(rroot, sub), parent=os.path.join(rroot, rel) if rel
                                        else rroot, name=name, step=int(m.group(1)), rel=sub))
            elif depth + 1 < max_depth:
                stack.append((sub, depth + 1))
    return found


def _open_root(rroot: str) -> int:
    return jt.open_root(rroot)


def tree_bytes(path: str, max_entries: int = 10_000_000) -> int:
    """Apparent bytes of the regular files below path (jobtree.walk: links never followed; what vanishes is not
    counted)."""
    fd = jt.open_root(path)
    try:
        return jt.tree_usage(fd, ".", max_entries=max_entries)[1]
    finally:
        os.close(fd)


def _groups(ckpts: list[Checkpoint]) -> dict[str, list[Checkpoint]]:
    out: dict[str, list[Checkpoint]] = {}
    for c in ckpts:
        out.setdefault(c.parent, []).append(c)
    for lst in out.values():
        lst.sort(key=lambda c: (c.step, c.name))
    return out


def _resolve_root(root: str) -> str:
    return os.path.realpath(os.path.abspath(root))


def latest_complete_checkpoint(root: str, markers=DEFAULT_MARKERS, max_depth: int = 1) -> str | None:
    """The newest ``root/checkpoint-N`` whose completion marker (``trainer_state.json``) exists, else None.

    Only direct children of root by default (HF Trainer's output_dir); a partially written newer checkpoint
    (crash during save) is skipped. Uses the marker alone: call it where rank 0 saves (the head node).
    Walks from one descriptor of the root, never through a symlink the job planted.
    """
    rroot = _resolve_root(root)
    try:
        root_fd = _open_root(rroot)
    except OSError:
        return None
    try:
        best = None
        for c in _find_checkpoints_fd(root_fd, rroot, max_depth):
            if best is not None and (c.step, c.name) <= (best.step, best.name):
                continue
            try:
                fd = _open_rel(root_fd, c.rel)
            except OSError:
                continue
            try:
                if _has_marker_at(fd, markers):
                    best = c
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)
    if best is None:
        return None
    # Report it under the path the caller gave (the container mounts the root at the same path).
    return os.path.join(root.rstrip("/") or "/", best.rel)


DEEPSPEED_TAG_RE = re.compile(r"global_step\d+")


def write_file_at(dir_fd: int, name: str, data, mode: int = 0o644, owner_of_dir: bool = True,
                  owner: tuple[int, int] | None = None) -> None:
    """Atomically put ``name`` in the directory dir_fd holds (jobtree.write_file: a fresh O_EXCL|O_NOFOLLOW
    temporary file, 0600 while written, then renameat; a planted file or symlink is never written through).
    ``data`` is bytes or a binary file object (copied in chunks). The file gets ``owner`` (uid, gid), else with
    owner_of_dir the directory's owner (so the job can rewrite it), as root only."""
    if os.geteuid() == 0 and (owner is not None or owner_of_dir):
        if owner is None:
            d = os.fstat(dir_fd)
            owner = (d.st_uid, d.st_gid)
    else:
        owner = (None, None)
    jt.write_file(dir_fd, name, data, mode, *owner)


def ensure_deepspeed_latest(checkpoint: str) -> str | None:
    """Write DeepSpeed's ``latest`` tag file into a node's copy of a checkpoint when it is missing.

    DeepSpeed writes ``<checkpoint>/latest`` on global rank 0 only, also with ``checkpoint.use_node_local_storage``,
    so on every other node of a cluster with node-local output roots the checkpoint has its shards but no tag, and
    the HF Trainer refuses to resume ("[deepspeed] failed to resume from checkpoint"). With exactly one
    ``global_step*`` directory the tag is certain and is written; with none or several nothing is guessed.
    Returns the tag written, or None. The checkpoint is a job-writable directory and this runs as root: it is
    opened once without following a symlink, and the tag is written relative to that descriptor
    (write_file_at), so nothing the job plants redirects the write.
    """
    try:
        dfd = jt.open_root(checkpoint)
    except OSError:
        return None
    try:
        try:
            os.stat("latest", dir_fd=dfd, follow_symlinks=False)
            return None
        except FileNotFoundError:
            pass
        try:
            with os.scandir(dfd) as it:
                tags = [e.name for e in it if DEEPSPEED_TAG_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
        except OSError:
            return None
        if len(tags) != 1:
            return None
        write_file_at(dfd, "latest", tags[0].encode())
        return tags[0]
    finally:
        os.close(dfd)


def _best_model_name_at(dir_fd: int) -> str | None:
    try:
        fd = jt.open_file(dir_fd, "trainer_state.json")
    except OSError:
        return None
    try:
        best = _read_trainer_state_fd(fd, ("best_model_checkpoint",))["best_model_checkpoint"]
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return os.path.basename(str(best).rstrip("/")) if best else None


# ------------------------------------------------------------------------------------------- planning

_COMPILED: dict = {}


def _compile(patterns) -> "re.Pattern":
    key = tuple(patterns)
    rx = _COMPILED.get(key)
    if rx is None:
        rx = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in key) or r"(?!)")
        _COMPILED[key] = rx
    return rx


def _scan_checkpoint(ckpt: Checkpoint, keep: tuple, min_size: int, plan: Plan, root_fd: int) -> None:
    """Add the deletable files of one complete checkpoint to the plan (walked from the root's descriptor,
    lstat only, no symlink followed)."""
    prot = _compile(PROTECTED_PATTERNS + tuple(keep))
    dele = _compile(DELETE_PATTERNS)
    has_global_step = False
    # (directory path relative to the root, path relative to the checkpoint, inside a global_step* directory)
    stack = [(ckpt.rel, "", False)]
    gs_dirs: list[str] = []
    while stack:
        d, rel_d, in_gs = stack.pop()
        for name, is_dir, st in _scandir_rel(root_fd, d, want_stat=True):
            rel = f"{rel_d}{name}"
            plan.scanned_files += 1
            path = os.path.join(plan.root, d, name)
            if is_dir:
                gs = in_gs or bool(GLOBAL_STEP_RE.match(name))
                if gs:
                    has_global_step = True
                    gs_dirs.append(path)
                stack.append((os.path.join(d, name), rel + "/", gs))
                continue
            if st is None:
                continue  # symlinks, sockets, fifos: never touched
            if prot.match(name) or (rel_d and prot.match(rel)):
                continue
            if in_gs:
                reason = "deepspeed global_step"
            elif not rel_d and name in DEEPSPEED_SIDE_FILES:
                reason = "deepspeed tag/helper"
            elif dele.match(name) or (rel_d and dele.match(rel)):
                reason = "optimizer/zero/full-model state"
            else:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size < min_size:
                continue
            plan.deletions.append(Deletion(path=path, size=st.st_size, checkpoint=ckpt.path, reason=reason))
    if not has_global_step:
        # latest / zero_to_fp32.py only go together with the state they describe.
        plan.deletions[:] = [x for x in plan.deletions
                             if not (x.checkpoint == ckpt.path and x.reason == "deepspeed tag/helper")]
    plan.dirs.extend(sorted(gs_dirs, key=lambda p: p.count(os.sep), reverse=True))


def plan(root: str, keep=(), min_size: int = 0, keep_full_latest: bool = True, markers=DEFAULT_MARKERS,
         completion: str = "marker", max_depth: int = 4) -> Plan:
    """What the janitor would delete under root now (see the module docstring for the rules).

    The root is opened once, here, and the plan holds that descriptor until execute (or close): planning and
    deleting walk from it with no-follow opens, so a root or any directory below it swapped for a symlink
    between the two never redirects a deletion."""
    if completion not in COMPLETION_MODES:
        raise ValueError(f"completion must be one of {COMPLETION_MODES}, not {completion!r}")
    t0 = time.monotonic()
    rroot = _resolve_root(root)
    p = Plan(root=rroot)
    try:
        p.root_fd = _open_root(rroot)
    except OSError:
        p.scan_seconds = time.monotonic() - t0
        return p
    ckpts = _find_checkpoints_fd(p.root_fd, rroot, max_depth)
    p.checkpoints = len(ckpts)

    def at(c, fn):
        try:
            fd = _open_rel(p.root_fd, c.rel)
        except OSError:
            return None
        try:
            return fn(fd)
        finally:
            os.close(fd)

    for parent, group in _groups(ckpts).items():
        for c in group:
            c.marker = bool(at(c, lambda fd: _has_marker_at(fd, markers)))
        newest_step = group[-1].step
        for i, c in enumerate(group):
            superseded = completion == "marker_or_superseded" and c.step < newest_step
            c.complete = c.marker or superseded
        complete = [c for c in group if c.complete]
        keep_full: dict[str, str] = {}
        if keep_full_latest and complete:
            keep_full[complete[-1].path] = "latest complete (resume)"
            marked = [c for c in group if c.marker]
            if marked:
                # The resume point (latest_complete_checkpoint) is the latest with a marker, even where a
                # newer one only counts as complete because it was superseded.
                keep_full.setdefault(marked[-1].path, "latest with marker (resume)")
                best = at(marked[-1], _best_model_name_at)
                for c in group:
                    if best and c.name == best and c.path not in keep_full:
                        keep_full[c.path] = "best_model_checkpoint"
        newest = group[-1]
        for c in group:
            if c is newest or c.step == newest.step:
                p.skipped.append({"path": c.path, "why": "newest" + ("" if c.complete else " (incomplete)")})
            elif not c.complete:
                p.skipped.append({"path": c.path, "why": "incomplete"})
            elif c.path in keep_full:
                p.kept_full.append({"path": c.path, "why": keep_full[c.path]})
            else:
                _scan_checkpoint(c, tuple(keep), int(min_size), p, p.root_fd)
    p.scan_seconds = time.monotonic() - t0
    return p


# ------------------------------------------------------------------------------------------- deleting

def _within(root: str, path: str) -> str:
    rel = os.path.relpath(path, root)
    if rel == "." or rel.startswith("..") or os.path.isabs(rel):
        raise ValueError(f"{path} is not inside {root}")
    return rel


def _open_parent(root_fd: int, rel: str) -> tuple[int, str]:
    """Open the directory holding rel under root_fd, component by component, refusing any symlink."""
    head, name = os.path.split(rel)
    return _open_rel(root_fd, head), name


def execute(p: Plan, log=None) -> dict:
    """Delete what the plan lists, relative to the root descriptor the plan holds (never the root re-opened by
    path); returns {freed, deleted, errors, dirs_removed}. Logs each deletion. Closes the plan."""
    result = {"freed": 0, "deleted": 0, "dirs_removed": 0, "errors": []}
    if p.root_fd is None:  # a plan built by hand, not by plan(): open its root now (no planning to race)
        try:
            p.root_fd = _open_root(p.root)
        except OSError as e:
            result["errors"].append(f"{p.root}: {e.strerror}")
            return result
    root_fd = p.root_fd
    try:
        for d in p.deletions:
            try:
                rel = _within(p.root, d.path)
                pfd, name = _open_parent(root_fd, rel)
                try:
                    st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode):
                        raise OSError(errno.EPERM, "no longer a regular file")
                    os.unlink(name, dir_fd=pfd)
                finally:
                    os.close(pfd)
            except FileNotFoundError:
                continue  # the trainer rotated it away meanwhile
            except (OSError, ValueError) as e:
                result["errors"].append(f"{d.path}: {getattr(e, 'strerror', None) or e}")
                continue
            result["freed"] += st.st_size
            result["deleted"] += 1
            if log:
                log(f"deleted {st.st_size} bytes {d.path} ({d.reason})")
        for d in p.dirs:
            try:
                pfd, name = _open_parent(root_fd, _within(p.root, d))
                try:
                    os.rmdir(name, dir_fd=pfd)
                finally:
                    os.close(pfd)
                result["dirs_removed"] += 1
                if log:
                    log(f"removed empty directory {d}")
            except (OSError, ValueError):
                continue  # not empty (kept files, symlinks) or gone: fine
    finally:
        p.close()
    return result


# ------------------------------------------------------------------------------------------------ CLI

def _human(n: int) -> str:
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{v:.1f} {unit}" if unit != "B" else f"{int(v)} B"
        v /= 1024
    return f"{n} B"


class _Logger:
    def __init__(self, path: str | None):
        self.f = None
        if path:
            # Never through a symlink, and only into a regular file: the log is opened once, no-follow.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
                         | getattr(os, "O_NONBLOCK", 0), 0o640)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(errno.EINVAL, "not a regular file", path)
            self.f = os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def __call__(self, msg: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} {msg}"
        if self.f:
            self.f.write(line + "\n")
        else:
            print(line, flush=True)

    def try_lock(self) -> bool:
        if not self.f:
            return True
        try:
            fcntl.flock(self.f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False

    def unlock(self) -> None:
        if self.f:
            fcntl.flock(self.f.fileno(), fcntl.LOCK_UN)


def run_pass(args, log: _Logger) -> dict:
    p = plan(args.root, keep=args.keep, min_size=args.min_size, keep_full_latest=args.keep_full_latest,
             markers=tuple(args.marker or DEFAULT_MARKERS), completion=args.completion, max_depth=args.max_depth)
    if args.dry_run:
        p.close()
        if args.json:
            print(json.dumps(dict(p.as_dict(), dry_run=True)), flush=True)
        else:
            for d in p.deletions:
                print(f"would delete {d.size:>14} {d.path} ({d.reason})")
            for k in p.kept_full:
                print(f"keep whole  {k['path']} ({k['why']})")
            for s in p.skipped:
                print(f"leave alone {s['path']} ({s['why']})")
            print(f"dry run: {len(p.deletions)} files, {p.total_bytes} bytes ({_human(p.total_bytes)}) "
                  f"in {p.checkpoints} checkpoints; scanned {p.scanned_files} entries in {p.scan_seconds:.3f}s",
                  flush=True)
        return {"freed": 0, "deleted": 0, "would_free": p.total_bytes, "would_delete": len(p.deletions)}
    if not log.try_lock():
        p.close()
        log("another janitor pass holds the log lock; skipping this pass")
        return {"freed": 0, "deleted": 0, "skipped": True}
    try:
        r = execute(p, log)
    finally:
        log.unlock()
    for e in r["errors"]:
        log(f"error {e}")
    if r["deleted"] or r["errors"]:
        log(f"pass freed {r['freed']} bytes ({_human(r['freed'])}) in {r['deleted']} files; "
            f"{p.checkpoints} checkpoints, scan {p.scan_seconds:.3f}s")
    if args.json:
        print(json.dumps(dict(r, root=p.root, scan_seconds=round(p.scan_seconds, 4))), flush=True)
    return r


# What the config file (--config, written by the janitor role) may hold, and its type.
CONFIG_KEYS = {"root": str, "log": str, "interval": (int, float), "keep": list, "min_size": int,
               "keep_full_latest": bool, "marker": list, "completion": str, "max_depth": int}


def load_config(path: str) -> dict:
    """The janitor's settings from a JSON file: paths travel as data, never through a shell or a unit file's
    command line. ValueError with a one-line reason naming the key."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(1024 * 1024).decode("utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the janitor config ({getattr(e, 'strerror', None) or e})")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    for key, value in data.items():
        want = CONFIG_KEYS.get(key)
        if want is None:
            raise ValueError(f"{path}: unknown key {key!r} (known: {', '.join(sorted(CONFIG_KEYS))})")
        if value is None:
            continue
        if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
            raise ValueError(f"{path}: {key} must be {getattr(want, '__name__', 'a number')}, not {value!r}")
        if want is list and not all(isinstance(x, str) for x in value):
            raise ValueError(f"{path}: {key} must be a list of strings")
    return {k: v for k, v in data.items() if v is not None}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="checkpoints.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="JSON file with any of the settings below (root, log, keep, min_size, ...)")
    ap.add_argument("--root", help="output root; nothing outside it is touched")
    ap.add_argument("--dry-run", action="store_true", help="list what would be deleted, with sizes")
    ap.add_argument("--loop", action="store_true", help="run a pass every --interval seconds until stopped")
    ap.add_argument("--interval", type=float, default=60.0)
    ap.add_argument("--keep", action="append", default=[], metavar="PATTERN",
                    help="fnmatch pattern (file name or path relative to the checkpoint) never deleted")
    ap.add_argument("--min-size", type=int, default=0, metavar="BYTES", help="never delete smaller files")
    ap.add_argument("--keep-full-latest", action=argparse.BooleanOptionalAction, default=True,
                    help="keep the latest complete checkpoint whole for resume (default: on)")
    ap.add_argument("--marker", action="append", metavar="NAME",
                    help=f"completion marker file(s) (default: {', '.join(DEFAULT_MARKERS)})")
    ap.add_argument("--completion", choices=COMPLETION_MODES, default="marker",
                    help="marker_or_superseded on nodes where rank 0 does not save (no marker written there)")
    ap.add_argument("--max-depth", type=int, default=4, help="how deep to look for checkpoint-N directories")
    ap.add_argument("--log", help="append deletions here (default: stdout)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per pass")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.config:
        try:
            cfg = load_config(args.config)
        except ValueError as e:
            print(f"checkpoints.py: {e}", file=sys.stderr)
            return 2
        # The file gives the defaults; options on the command line (--dry-run, --json) still apply.
        ap.set_defaults(**cfg)
        args = ap.parse_args(argv)
    if not args.root:
        print("checkpoints.py: give --root or a --config file with root", file=sys.stderr)
        return 2
    if args.completion not in COMPLETION_MODES:
        print(f"checkpoints.py: completion must be one of {', '.join(COMPLETION_MODES)}", file=sys.stderr)
        return 2
    if args.min_size < 0 or args.interval <= 0 or args.max_depth < 1:
        print("checkpoints.py: min_size must be >= 0, interval > 0 and max_depth >= 1", file=sys.stderr)
        return 2
    try:
        log = _Logger(None if args.dry_run else args.log)
    except OSError as e:
        print(f"checkpoints.py: cannot open the log {args.log}: {e.strerror} (a symlink or not a regular file is "
              "refused; remove it)", file=sys.stderr)
        return 2
    if not args.loop:
        r = run_pass(args, log)
        return 1 if r.get("errors") else 0
    stop = {"now": False}

    def _stop(signum, frame):  # noqa: ARG001 - signal handler signature
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log(f"janitor started: root={_resolve_root(args.root)} interval={args.interval}s "
        f"keep_full_latest={args.keep_full_latest} completion={args.completion} min_size={args.min_size}")
    while not stop["now"]:
        try:
            run_pass(args, log)
        except Exception as e:  # noqa: BLE001 - a supervised loop must survive one bad pass and say why
            log(f"error pass failed: {type(e).__name__}: {e}")
        deadline = time.monotonic() + args.interval
        while not stop["now"] and time.monotonic() < deadline:
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    log("janitor stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
