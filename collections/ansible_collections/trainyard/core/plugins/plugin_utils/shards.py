# -*- coding: utf-8 -*-
"""A run split over several ``ansible-playbook`` processes (docs/sharding.md): which shard this process runs, and the
exchange of every shard's values at a cross-node step.

The parent run (the play "Split the run" of site.yml, action ``trainyard_shards``) starts one child
``ansible-playbook`` per shard with, in its environment, ``TRAINYARD_SHARD=i/K`` and ``TRAINYARD_SHARD_DIR=<run
dir>/shards``. In a child, each cross-node step passes its shard's values through ``union(step, value)`` (the filter
``trainyard_shard_union``): the shard writes them to ``<shard dir>/exchange/<step>/<i>.json`` (write, then rename),
waits until every shard has written that step or ended, and gets the union in shard order (lists concatenated, maps
merged). Shards are contiguous ranges of the ranks, so the union is in rank order, and every shard computes the same
answer from the same inputs. Outside a sharded run ``union`` returns its value unchanged: the one-process run reads
``hostvars`` as it always did.

A shard that ended (the parent writes ``ended/<i>.json`` with its exit code when the child exits, whatever the cause)
contributes nothing to the steps it did not reach; a step waits at most ``TRAINYARD_SHARD_WAIT_S`` seconds (default
1800) and then fails naming the shards that did not come. Pure file operations, unit-tested in
tests/unit/plugin_utils/test_shards.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import time

ENV_SHARD = "TRAINYARD_SHARD"
ENV_DIR = "TRAINYARD_SHARD_DIR"
ENV_WAIT = "TRAINYARD_SHARD_WAIT_S"
DEFAULT_WAIT_S = 1800.0
PLAN = "shards.json"
STEP_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,120}$")


class ShardError(RuntimeError):
    """A sharded run cannot go on; the message names the shard, its nodes and its log."""


class Shard:
    """This process's place in a sharded run: index (0-based), count, the run's shard directory and the step
    timeout."""

    def __init__(self, index, count, root, wait_s=DEFAULT_WAIT_S):
        self.index, self.count, self.root, self.wait_s = index, count, root, wait_s

    def __repr__(self):
        return f"Shard({self.index}/{self.count}, {self.root!r})"

    @property
    def leader(self):
        """Shard 0 writes what the run writes once (the report)."""
        return self.index == 0

    def plan(self):
        """The parent's plan ({"shards": [[node, ...], ...], ...}), read from <root>/shards.json."""
        try:
            with open(os.path.join(self.root, PLAN), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise ShardError(f"shard {self.index}/{self.count}: cannot read the run's shard plan "
                             f"{os.path.join(self.root, PLAN)}: {e}") from None

    def nodes(self, index=None):
        shards = self.plan().get("shards") or []
        i = self.index if index is None else index
        return list(shards[i]) if 0 <= i < len(shards) else []

    def describe(self, index):
        """'shard 2 (nodes a..b, log <root>/2.log)'."""
        nodes = self.nodes(index)
        span = f"{nodes[0]}..{nodes[-1]}" if len(nodes) > 1 else (nodes[0] if nodes else "no nodes")
        return f"shard {index} (nodes {span}, log {os.path.join(self.root, f'{index}.log')})"


def current(environ=None):
    """The Shard of this process, or None outside a sharded run. A malformed TRAINYARD_SHARD raises ShardError."""
    env = os.environ if environ is None else environ
    spec = env.get(ENV_SHARD, "")
    if not spec:
        return None
    m = re.fullmatch(r"(\d+)/(\d+)", spec)
    root = env.get(ENV_DIR, "")
    if not m or not int(m.group(2)) or int(m.group(1)) >= int(m.group(2)) or not root:
        raise ShardError(f"{ENV_SHARD}={spec!r} with {ENV_DIR}={root!r}: a child of a sharded run needs "
                         f"{ENV_SHARD}=<index>/<count> (index below count) and {ENV_DIR}; unset {ENV_SHARD} to run "
                         "unsharded")
    try:
        wait_s = float(env.get(ENV_WAIT) or DEFAULT_WAIT_S)
    except ValueError:
        wait_s = math.nan
    if not math.isfinite(wait_s) or wait_s <= 0:
        raise ShardError(f"{ENV_WAIT}={env.get(ENV_WAIT)!r} is not a number of seconds above 0")
    return Shard(int(m.group(1)), int(m.group(2)), root, wait_s)


def write_json(path, value):
    """Write then rename: a reader sees the whole file or none."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        text = json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ShardError(f"{os.path.basename(os.path.dirname(path))}: a value a shard hands to the others must be "
                         f"JSON ({e})") from None
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def ended(shard, index):
    """The parent's record of a child that exited ({"rc": N, "reason": ...}), or None while it runs."""
    return read_json(os.path.join(shard.root, "ended", f"{index}.json"))


def mark_ended(root, index, rc, reason=""):
    write_json(os.path.join(root, "ended", f"{index}.json"), {"rc": rc, "reason": reason})


def retired(shard, index):
    """The record of a shard that has no node left in the node plays ({"reason": ...}), or None."""
    return read_json(os.path.join(shard.root, "retired", f"{index}.json"))


def retire(shard, reason):
    """This shard has no node left (every one was left out): its child still runs the controller plays (the report),
    but its node plays select no node, so the other shards' node steps no longer wait for it (exchange)."""
    write_json(os.path.join(shard.root, "retired", f"{shard.index}.json"), {"reason": reason})


def retire_if_none_left(kept, shard=None):
    """retire() this shard when none of its nodes is among kept; whether it did. Outside a sharded run, False."""
    shard = shard if shard is not None else current()
    if shard is None or set(shard.nodes()) & set(kept):
        return False
    retire(shard, "every node of this shard was left out")
    return True


def merge(values, step="?"):
    """The union of the shards' values in shard order: lists concatenated, maps merged; None (a shard that ended
    before the step) adds nothing."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, list) for v in present):
        return [x for v in present for x in v]
    if all(isinstance(v, dict) for v in present):
        out = {}
        for v in present:
            out.update(v)
        return out
    raise ShardError(f"step {step}: the shards' values are not all lists or all maps "
                     f"({', '.join(sorted({type(v).__name__ for v in present}))}); a cross-node step exchanges a list "
                     "per node or a map by node")


def exchange(shard, step, value, sleep=time.sleep, clock=time.monotonic, poll_s=0.05, every_shard=False):
    """Write this shard's value for step, wait for every other shard's (or its end), return them by shard index.

    A node step (the default: a task of a play on the nodes) does not wait for a retired shard (retire()): its node
    plays select no node, so it never reaches the step. A controller step (every_shard: a task of a play on the
    controller, which every child runs, such as the report) waits for it too."""
    if not STEP_RE.match(str(step)):
        raise ShardError(f"step name {step!r}: letters, digits, '_', '.' and '-' only")
    base = os.path.join(shard.root, "exchange", str(step))
    write_json(os.path.join(base, f"{shard.index}.json"), {"value": value})
    out = [None] * shard.count
    waiting = set(range(shard.count))
    deadline = clock() + shard.wait_s
    while True:
        for i in sorted(waiting):
            path = os.path.join(base, f"{i}.json")
            got = read_json(path)
            # A shard may write the step and end between the two reads: its file is read again once it ended, so
            # every shard sees the same values.
            if got is None and (ended(shard, i) is not None or (not every_shard and retired(shard, i) is not None)):
                got = read_json(path) or {"value": None}
            if got is not None:
                out[i] = got.get("value")
                waiting.discard(i)
        if not waiting:
            return out
        if clock() >= deadline:
            raise ShardError(f"step {step}: " + "; ".join(shard.describe(i) for i in sorted(waiting))
                             + f" did not reach it within {shard.wait_s:g} s ({ENV_WAIT}); see the logs")
        sleep(poll_s)


def union(value, step, shard=None, every_shard=False):
    """value unchanged outside a sharded run; in one, the union of every shard's value for step (every_shard: a
    controller step, see exchange)."""
    shard = shard if shard is not None else current()
    if shard is None:
        return value
    return merge(exchange(shard, step, value, every_shard=every_shard), step)


def lead(step, shard=None):
    """Whether this process does what a run does once at step: the lowest-index shard that reaches the step (shard
    0 unless it ended before), or the one process of an unsharded run. A controller step: every shard that runs
    takes part, a retired one included, so every shard names the same leader."""
    shard = shard if shard is not None else current()
    if shard is None:
        return True
    return shard.index == min(merge(exchange(shard, f"{step}.who", [shard.index], every_shard=True), step))


def once(step, fn, shard=None):
    """fn() computed by the shard that leads step (lead), its answer handed to every shard; fn() itself unsharded.
    fn's answer must be JSON."""
    shard = shard if shard is not None else current()
    if shard is None:
        return fn()
    if lead(step, shard):
        got = merge(exchange(shard, step, {"value": fn()}, every_shard=True), step)
    else:
        got = merge(exchange(shard, step, {}, every_shard=True), step)
    if "value" not in (got or {}):
        raise ShardError(f"step {step}: the shard that leads it ended before it gave its answer; see the logs under "
                         f"{shard.root}")
    return got["value"]


def local_hosts(hosts, shard=None):
    """The hosts of this shard among hosts (all of them outside a sharded run), in the order given."""
    shard = shard if shard is not None else current()
    if shard is None:
        return list(hosts)
    mine = set(shard.nodes())
    return [h for h in hosts if h in mine]


def split(nodes, per_shard, max_shards):
    """Contiguous shards of nodes (rank order) of at most about per_shard nodes, at most max_shards of them; one
    shard (no split) when per_shard is 0 or the nodes fit in one."""
    nodes = list(nodes)
    if per_shard <= 0 or len(nodes) <= per_shard:
        return [nodes]
    k = min(max(1, max_shards), -(-len(nodes) // per_shard))
    size, extra = divmod(len(nodes), k)
    out, start = [], 0
    for i in range(k):
        end = start + size + (1 if i < extra else 0)
        out.append(nodes[start:end])
        start = end
    return [s for s in out if s]


# The parent's side: the children, their logs and their ends.

PROMPTS = ("-k", "--ask-pass", "-K", "--ask-become-pass", "--ask-vault-pass", "--ask-vault-password", "-J")
LIMITS = ("-l", "--limit")
# A child's output lines the parent prints as they come (prefixed with the shard): failures and the run's verdicts.
RELAY = re.compile(r"^(fatal:|failed:|An exception occurred|ERROR!|\[ERROR\]|\[WARNING\]|.*Preflight (passed|failed)"
                   r"|.*Not launching|PLAY RECAP|\S+\s+: ok=)")


def group_alive(pgid, proc="/proc"):
    """Whether a process of group pgid still runs: a zombie does not count (an orphan whose reaper is slow, or a
    container's init that never reaps, would otherwise hold stop() for its whole grace period). Where there is no
    /proc, the group counts as alive while it has any member."""
    if not os.path.isdir(proc):
        return True
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "stat"), encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # after the command: state, ppid, pgrp
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def decide(nodes, per_shard, max_shards, argv, environ=None, cores=None):
    """(plan, why): the shards this process splits nodes into, why empty; or, where it runs them itself, the plan it
    would have had and why not (a child of a sharded run, one shard is enough, or a command line that cannot be
    split). max_shards 0: half the controller's cores."""
    if current(environ) is not None:
        return [list(nodes)], "a shard of a sharded run: it runs its own nodes"
    cores = os.cpu_count() if cores is None else cores
    plan = split(nodes, per_shard, max_shards or max(1, (cores or 2) // 2))
    if len(plan) < 2:
        return plan, "%d node(s) in one ansible-playbook process (cluster_shard_nodes %d)" % (len(list(nodes)), per_shard)
    return plan, refusal(argv)


def refusal(argv):
    """Why this command line cannot be split ('' when it can): a limit (the shards are the whole inventory's) or a
    prompt (a child has no terminal)."""
    for prev, a in zip(argv, argv[1:]):
        if a.endswith("@prompt") and (prev == "--vault-id" or a.startswith("--vault-id=")):
            return ("--vault-id …@prompt asks for a password on the terminal, which a child process has not; the run "
                    "goes on in one process (give the password in a file to shard)")
        if a in LIMITS or a.startswith("--limit=") or (a.startswith("-l") and not a.startswith("--")):
            return "--limit is given (a sharded run splits the whole inventory); the run goes on in one process"
        if a in PROMPTS:
            return (f"{a} asks for a password on the terminal, which a child process has not; the run goes on in one "
                    "process (give the password in a file, e.g. --vault-password-file, to shard)")
    return ""


def child_argv(executable, argv, limit_file, run_id):
    """A child's command line: the parent's own (inventory, -e, --check, --tags, verbosity), its shard's nodes as the
    limit and the parent's run id."""
    return [executable, argv[0]] + list(argv[1:]) + ["--limit", "@" + limit_file, "-e", "_cluster_run_id=" + run_id]


class Children:
    """The K child ansible-playbook processes of a sharded run, each in its own process group, its output in
    <root>/<i>.log. Kills only the process groups it started."""

    def __init__(self, root, plan, executable, argv, run_id, wait_s=DEFAULT_WAIT_S, environ=None, popen=None):
        import subprocess

        self.root, self.plan = root, plan
        self.procs, self.offsets, self.rcs, self.in_block = [], [], {}, set()
        popen = popen or subprocess.Popen
        os.makedirs(os.path.join(root, "exchange"), exist_ok=True)
        write_json(os.path.join(root, PLAN), {"shards": plan, "run_id": run_id})
        base = dict(os.environ if environ is None else environ)
        try:
            self.start(plan, executable, argv, run_id, wait_s, base, popen)
        except BaseException:
            self.stop(grace_s=2.0)  # the children already started: none is left behind
            raise

    def start(self, plan, executable, argv, run_id, wait_s, base, popen):
        import subprocess

        root = self.root
        for i, nodes in enumerate(plan):
            limit = os.path.join(root, f"{i}.limit")
            with open(limit, "w", encoding="utf-8") as f:
                f.write("\n".join(["localhost"] + list(nodes)) + "\n")
            env = dict(base, **{ENV_SHARD: f"{i}/{len(plan)}", ENV_DIR: root, ENV_WAIT: str(wait_s)})
            with open(os.path.join(root, f"{i}.log"), "wb") as log:
                self.procs.append(popen(child_argv(executable, argv, limit, run_id), stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                        start_new_session=True))
            self.offsets.append(0)

    def poll(self):
        """New relayed lines [(shard, line)] since the last call; records each child that exited (ended/<i>.json)."""
        out = []
        for i, proc in enumerate(self.procs):
            rc = proc.poll()
            for line in self.new_lines(i, final=rc is not None):
                # A failure's result follows its "fatal:" line, indented, up to the next blank line: the node and
                # the fix are in it.
                if RELAY.match(line) or (i in self.in_block and line.strip()):
                    out.append((i, line))
                    if line.startswith(("fatal:", "failed:")) and line.rstrip().endswith("{"):
                        self.in_block.add(i)
                else:
                    self.in_block.discard(i)
            if rc is not None and i not in self.rcs:
                self.rcs[i] = rc
                mark_ended(self.root, i, rc, "exited")
        return out

    def new_lines(self, i, final=False):
        """The whole lines the child wrote since the last call (final: the child exited, its last line too)."""
        try:
            with open(os.path.join(self.root, f"{i}.log"), "rb") as f:
                f.seek(self.offsets[i])
                data = f.read()
        except OSError:
            return []
        cut = len(data) if final else data.rfind(b"\n") + 1
        self.offsets[i] += cut
        return data[:cut].decode("utf-8", "replace").splitlines()

    def running(self):
        return len(self.rcs) < len(self.procs)

    def stop(self, grace_s=10.0, sleep=time.sleep):
        """SIGTERM to the process group of every child started (what its processes left in it too, even when the
        child itself exited), SIGKILL to what is left after grace_s; each child is recorded ended. Only these groups:
        each child leads the one it was started in."""
        import signal

        def signal_groups(sig):
            alive = []
            for p in self.procs:
                try:
                    os.killpg(p.pid, sig)
                    alive.append(p)
                except (ProcessLookupError, PermissionError):
                    pass
            return alive

        signal_groups(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(group_alive(p.pid) for p in signal_groups(0)):
            for p in self.procs:
                p.poll()  # reap the children that ended: a child's zombie keeps its group
            sleep(0.1)
        signal_groups(signal.SIGKILL)
        for i, p in enumerate(self.procs):
            p.wait()
            if i not in self.rcs:
                self.rcs[i] = p.returncode
                mark_ended(self.root, i, p.returncode, "stopped by the parent")

    def recap(self, i):
        """The child's PLAY RECAP lines (one per host) from its log."""
        try:
            with open(os.path.join(self.root, f"{i}.log"), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return []
        tail = text.rsplit("PLAY RECAP", 1)
        return [ln for ln in tail[1].splitlines() if " : ok=" in ln] if len(tail) == 2 else []
