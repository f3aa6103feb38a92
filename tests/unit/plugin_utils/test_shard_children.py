"""plugin_utils/shards.py, the parent's side of a sharded run (docs/sharding.md): which command lines can be split
(refusal), a child's command line (child_argv), and Children with real child processes: each child is this Python
running a small script written under tmp_path, in place of ansible-playbook. Every test stops the children it
started (and kills, by PID, any grandchild its script reported) before it ends."""

import json
import os
import signal
import sys
import textwrap
import time

import pytest

from ansible_collections.trainyard.core.plugins.plugin_utils import shards

PLAN = [["n1", "n2"], ["n3"]]
RUN_ID = "20240102-030405-abcd"


def script(tmp_path, body, name="child.py"):
    """A child script under tmp_path; its body may use os, sys, time, json, signal, subprocess and SHARD (its index)
    and ROOT (the shard directory) from its environment."""
    path = tmp_path / name
    path.write_text("import json, os, signal, subprocess, sys, time\n"
                    "SHARD = int(os.environ['TRAINYARD_SHARD'].split('/')[0])\n"
                    "ROOT = os.environ['TRAINYARD_SHARD_DIR']\n"
                    "def out(line, end='\\n'):\n"
                    "    sys.stdout.write(line + end)\n"
                    "    sys.stdout.flush()\n"
                    + textwrap.dedent(body))
    return path


def start(tmp_path, body, plan=PLAN, args=(), **kw):
    root = str(tmp_path / "shards")
    path = script(tmp_path, body)
    return root, shards.Children(root, plan, sys.executable, [str(path)] + list(args), RUN_ID, **kw)


def run_to_end(tmp_path, body, **kw):
    """start(), every relayed line until the children ended (drain), then stop(): (root, children, relayed)."""
    root, children = start(tmp_path, body, **kw)
    try:
        got = drain(children)
    finally:
        children.stop(grace_s=2)
    return root, children, got


def wait_for(pred, timeout=5.0, what="a condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def log(root, i):
    with open(os.path.join(root, f"{i}.log"), encoding="utf-8") as f:
        return f.read()


def drain(children, timeout=8.0):
    """poll() until running() is false, as the action does: every relayed (shard, line), in order."""
    out = []
    deadline = time.monotonic() + timeout
    while children.running():
        assert time.monotonic() < deadline, "the children did not end"
        out += children.poll()
        time.sleep(0.02)
    return out


def gone(pid):
    """The process no longer runs: no such PID, or a zombie waiting for its reaper (init in a container may be slow
    or may not reap at all)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def ended(root, i):
    with open(os.path.join(root, "ended", f"{i}.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture
def grandchildren():
    """PIDs of grandchildren a test's scripts started: killed by PID at the end if they still run."""
    pids = []
    yield pids
    for pid in pids:
        if not gone(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# refusal(): a command line that cannot be split.


def test_a_plain_command_line_can_be_split():
    assert shards.refusal(["ansible-playbook", "-i", "inv.yml", "site.yml", "-e", "x=1", "--check", "-vv",
                           "--tags", "gpu", "--vault-password-file", "pw.txt"]) == ""
    assert shards.refusal(["ansible-playbook"]) == ""


@pytest.mark.parametrize("limit", [["-l", "n1"], ["--limit", "n1"], ["--limit=n1"], ["-ln1"]])
def test_a_limit_is_refused_naming_limit(limit):
    why = shards.refusal(["ansible-playbook", "-i", "inv.yml", "site.yml"] + limit)
    assert why and "--limit" in why


@pytest.mark.parametrize("flag", shards.PROMPTS)
def test_a_password_prompt_is_refused_naming_its_flag(flag):
    why = shards.refusal(["ansible-playbook", "site.yml", flag])
    assert why and why.startswith(flag + " ") and "--limit" not in why


def test_list_hosts_is_not_a_limit():
    assert shards.refusal(["ansible-playbook", "site.yml", "--list-hosts"]) == ""


def test_the_program_name_is_not_read_as_an_option():
    assert shards.refusal(["-l", "site.yml"]) == ""


# child_argv(): the parent's command line, then the shard's limit and the run id.


def test_child_argv_keeps_the_parents_arguments_in_order_then_limit_and_run_id():
    argv = ["/usr/bin/ansible-playbook", "-i", "inv.yml", "site.yml", "-e", "a=1", "--check", "-vv"]
    assert shards.child_argv("/py/python3", argv, "/run/shards/1.limit", "rid") == [
        "/py/python3", "/usr/bin/ansible-playbook", "-i", "inv.yml", "site.yml", "-e", "a=1", "--check", "-vv",
        "--limit", "@/run/shards/1.limit", "-e", "_cluster_run_id=rid"]
    assert argv == ["/usr/bin/ansible-playbook", "-i", "inv.yml", "site.yml", "-e", "a=1", "--check", "-vv"]


# Children: the plan, the limit files, each child's environment and command line.


def test_children_write_the_plan_and_limits_and_each_child_gets_its_shard(tmp_path):
    body = """
        out(json.dumps({"env": {k: os.environ.get(k) for k in ("TRAINYARD_SHARD", "TRAINYARD_SHARD_DIR",
                                                               "TRAINYARD_SHARD_WAIT_S", "KEPT")},
                        "argv": sys.argv, "stdin": sys.stdin.read(), "own_group": os.getpgid(0) == os.getpid()}))
    """
    environ = dict(os.environ, KEPT="yes", TRAINYARD_SHARD="7/9", TRAINYARD_SHARD_DIR="/elsewhere")
    root, children = start(tmp_path, body, args=["-i", "inv.yml", "site.yml"], wait_s=7, environ=environ)
    try:
        with open(os.path.join(root, shards.PLAN), encoding="utf-8") as f:
            assert json.load(f) == {"shards": PLAN, "run_id": RUN_ID}
        assert os.path.isdir(os.path.join(root, "exchange"))
        for i, nodes in enumerate(PLAN):
            with open(os.path.join(root, f"{i}.limit"), encoding="utf-8") as f:
                assert f.read() == "\n".join(["localhost"] + nodes) + "\n"
        assert drain(children) == []
    finally:
        children.stop(grace_s=2)
    assert children.rcs == {0: 0, 1: 0}
    for i in range(len(PLAN)):
        seen = json.loads(log(root, i))
        assert seen["env"] == {"TRAINYARD_SHARD": f"{i}/2", "TRAINYARD_SHARD_DIR": root,
                               "TRAINYARD_SHARD_WAIT_S": "7", "KEPT": "yes"}
        assert seen["argv"] == [str(tmp_path / "child.py"), "-i", "inv.yml", "site.yml",
                                "--limit", "@" + os.path.join(root, f"{i}.limit"), "-e", "_cluster_run_id=" + RUN_ID]
        assert seen["stdin"] == "" and seen["own_group"]


def test_the_default_wait_reaches_the_children(tmp_path):
    root, _, _ = run_to_end(tmp_path, "out(os.environ['TRAINYARD_SHARD_WAIT_S'])\n", plan=[["n1"]])
    assert float(log(root, 0)) == shards.DEFAULT_WAIT_S


# poll(): what is relayed, whole lines only, and each child's end.

RELAY_BODY = """
    if SHARD == 1:
        out("TASK [cluster : something] ****")
        out("ERROR! shard one broke")
        sys.exit(0)
    out("PLAY [Preflight] *****************")
    out("TASK [gpu : check the GPUs] *****")
    out("ok: [n1]")
    out("fatal: [n2]: FAILED! => {")
    out('    "changed": false,')
    while not os.path.exists(os.path.join(ROOT, "go")):
        time.sleep(0.02)
    out('    "msg": "n2: GPU 3 is missing; reseat it and re-run"')
    out("}")
    out("")
    out("ok: [n1]")
    out("TASK [gpu : next] ****")
    out("[WARNING]: something to know")
    out("PLAY RECAP *********************************************")
    out("n1                         : ok=3    changed=0    unreachable=0    failed=0    skipped=1")
    out("n2                         : ok=2    changed=0    unreachable=0    failed=1    skipped=0")
    out("")
    sys.exit(2)
"""


def test_poll_relays_failures_with_their_block_and_the_recap_and_records_each_end(tmp_path):
    root, children = start(tmp_path, RELAY_BODY)
    try:
        wait_for(lambda: '"changed": false' in log(root, 0) and children.procs[1].poll() is not None,
                 what="the first half of shard 0's failure and shard 1's end")
        first = children.poll()
        assert first == [(0, "fatal: [n2]: FAILED! => {"), (0, '    "changed": false,'),
                         (1, "ERROR! shard one broke")]
        assert children.rcs == {1: 0} and children.running()
        assert ended(root, 1) == {"rc": 0, "reason": "exited"}
        assert not os.path.exists(os.path.join(root, "ended", "0.json"))
        # The rest of the block comes in a later poll: the block is still open.
        (tmp_path / "shards" / "go").write_text("")
        rest = drain(children)
    finally:
        children.stop(grace_s=2)
    assert rest == [
        (0, '    "msg": "n2: GPU 3 is missing; reseat it and re-run"'),
        (0, "}"),
        (0, "[WARNING]: something to know"),
        (0, "PLAY RECAP *********************************************"),
        (0, "n1                         : ok=3    changed=0    unreachable=0    failed=0    skipped=1"),
        (0, "n2                         : ok=2    changed=0    unreachable=0    failed=1    skipped=0"),
    ]
    assert children.rcs == {0: 2, 1: 0}
    assert ended(root, 0) == {"rc": 2, "reason": "exited"}
    # Every line came before the end was recorded: nothing is left for a last poll.
    assert children.poll() == []


def test_a_line_written_in_two_pieces_is_relayed_once_whole(tmp_path):
    body = """
        out("fatal: [n1]: UNRE", end="")
        while not os.path.exists(os.path.join(ROOT, "go")):
            time.sleep(0.02)
        out("ACHABLE! => the rest of the line")
        out("TASK [after] ***")
    """
    root, children = start(tmp_path, body, plan=[["n1"]])
    try:
        wait_for(lambda: "UNRE" in log(root, 0), what="the first half of the line")
        assert children.poll() == []
        assert children.poll() == []
        (tmp_path / "shards" / "go").write_text("")
        got = drain(children)
    finally:
        children.stop(grace_s=2)
    assert got == [(0, "fatal: [n1]: UNREACHABLE! => the rest of the line")]
    assert children.rcs == {0: 0}


def test_a_failed_child_is_recorded_with_its_exit_code(tmp_path):
    root, children, got = run_to_end(tmp_path, "sys.exit(4 + SHARD)\n")
    assert got == []
    assert children.rcs == {0: 4, 1: 5}
    assert [ended(root, i)["rc"] for i in range(2)] == [4, 5]


# stop(): every child's process group, SIGTERM then SIGKILL.

def grandchild_body(grandchild="import time; time.sleep(60)", then="time.sleep(60)"):
    """A child that starts a grandchild (Python running the code grandchild), writes its PID to <root>/g<i>.pid
    (write, then rename), then runs then."""
    return f"""
g = subprocess.Popen([sys.executable, "-c", {grandchild!r}])
with open(os.path.join(ROOT, f"g{{SHARD}}.pid.tmp"), "w") as f:
    f.write(str(g.pid))
os.replace(os.path.join(ROOT, f"g{{SHARD}}.pid.tmp"), os.path.join(ROOT, f"g{{SHARD}}.pid"))
{then}
"""


def grandchild_pid(root, i):
    path = os.path.join(root, f"g{i}.pid")
    wait_for(lambda: os.path.exists(path), what=f"shard {i}'s grandchild")
    with open(path, encoding="utf-8") as f:
        return int(f.read())


def test_stop_ends_each_child_and_its_grandchild(tmp_path, grandchildren):
    root, children = start(tmp_path, grandchild_body())
    kids = [p.pid for p in children.procs]
    try:
        for i in range(len(PLAN)):
            grandchildren.append(grandchild_pid(root, i))
        assert not any(gone(pid) for pid in kids + grandchildren)
        assert children.poll() == [] and children.running()
    finally:
        children.stop(grace_s=30)
    assert children.rcs == {0: -signal.SIGTERM, 1: -signal.SIGTERM}
    for i in range(len(PLAN)):
        assert ended(root, i) == {"rc": -signal.SIGTERM, "reason": "stopped by the parent"}
    wait_for(lambda: all(gone(pid) for pid in kids + grandchildren), what="the children and grandchildren to go")
    assert not children.running()


def test_stop_kills_a_child_that_ignores_sigterm_after_the_grace_period(tmp_path):
    body = """
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        out("ready")
        time.sleep(60)
    """
    root, children = start(tmp_path, body, plan=[["n1"]])
    pid = children.procs[0].pid
    try:
        wait_for(lambda: "ready" in log(root, 0), what="the child to ignore SIGTERM")
    finally:
        t0 = time.monotonic()
        children.stop(grace_s=1)
        took = time.monotonic() - t0
    assert took >= 1, "the grace period is waited before SIGKILL"
    assert children.rcs == {0: -signal.SIGKILL}
    assert ended(root, 0) == {"rc": -signal.SIGKILL, "reason": "stopped by the parent"}
    assert gone(pid)


def test_stop_after_every_child_ended_changes_nothing(tmp_path):
    root, children, _ = run_to_end(tmp_path, "sys.exit(3)\n", plan=[["n1"]])
    assert children.rcs == {0: 3} and ended(root, 0) == {"rc": 3, "reason": "exited"}


# recap(): the hosts' lines of the last PLAY RECAP.


def test_recap_is_the_host_lines_after_the_last_play_recap(tmp_path):
    body = """
        if SHARD == 1:
            out("TASK [x] ***")
            out("n3 : ok=1 (not in a recap)")
            sys.exit(0)
        out("PLAY RECAP ***")
        out("n1                         : ok=1    changed=0    failed=0")
        out("")
        out("PLAY [again] ***")
        out("PLAY RECAP *******************")
        out("n1                         : ok=3    changed=1    unreachable=0    failed=0")
        out("n2                         : ok=2    changed=0    unreachable=0    failed=1")
        out("")
        out("Tuesday 02 January 2024  03:04:05 +0000 (0:00:00.010)       0:00:12.345 ******")
    """
    _, children, _ = run_to_end(tmp_path, body)
    assert children.recap(0) == [
        "n1                         : ok=3    changed=1    unreachable=0    failed=0",
        "n2                         : ok=2    changed=0    unreachable=0    failed=1",
    ]
    assert children.recap(1) == []
    assert children.recap(5) == []


# stop() signals every started child's whole process group, not only the groups whose leader (the child) still runs.


def test_stop_kills_a_grandchild_that_ignores_sigterm(tmp_path, grandchildren):
    body = grandchild_body("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                           "print('ignoring', flush=True); time.sleep(60)")
    root, children = start(tmp_path, body, plan=[["n1"]])
    try:
        grandchildren.append(grandchild_pid(root, 0))
        wait_for(lambda: "ignoring" in log(root, 0), what="the grandchild to ignore SIGTERM")
    finally:
        children.stop(grace_s=1)
    assert children.rcs == {0: -signal.SIGTERM}
    wait_for(lambda: gone(grandchildren[0]), timeout=1.5, what="the grandchild to go")


def test_stop_ends_the_grandchild_of_a_child_that_already_exited(tmp_path, grandchildren):
    root, children = start(tmp_path, grandchild_body(then="sys.exit(0)"), plan=[["n1"]])
    try:
        grandchildren.append(grandchild_pid(root, 0))
        drain(children)
        assert children.rcs == {0: 0} and not gone(grandchildren[0])
    finally:
        children.stop(grace_s=1)
    wait_for(lambda: gone(grandchildren[0]), timeout=1.5, what="the grandchild to go")


@pytest.mark.parametrize("argv", [["--vault-id", "prod@prompt"], ["--vault-id=prod@prompt"]])
def test_a_vault_id_that_prompts_is_refused(argv):
    assert "--vault-id" in shards.refusal(["ansible-playbook", "site.yml", *argv])
    assert shards.refusal(["ansible-playbook", "site.yml", "--vault-id", "prod@/etc/vault-pass"]) == ""


def test_a_start_that_fails_part_way_stops_the_children_already_started(tmp_path, grandchildren):
    root = tmp_path / "shards"
    (root / "1.limit").mkdir(parents=True)  # the second child's limit file cannot be written
    path = script(tmp_path, "import os, time; open(os.environ['PIDFILE'], 'w').write(str(os.getpid())); time.sleep(60)")
    pidfile = tmp_path / "child.pid"
    with pytest.raises(IsADirectoryError):
        shards.Children(str(root), [["n1"], ["n2"]], sys.executable, [str(path)], RUN_ID,
                        environ=dict(os.environ, PIDFILE=str(pidfile)))
    # The first child had started; it is gone and recorded ended.
    assert ended(str(root), 0) is not None
    if pidfile.exists():
        wait_for(lambda: gone(int(pidfile.read_text())), what="the first child to go")


def test_the_last_line_of_a_child_without_a_newline_is_relayed(tmp_path):
    root, children, got = run_to_end(tmp_path, "import sys; sys.stdout.write('ERROR! the last words'); sys.exit(3)",
                                     plan=[["n1"]])
    assert (0, "ERROR! the last words") in got and children.rcs == {0: 3}


# group_alive(): a process group with only zombies left has ended.


def test_group_alive_counts_a_running_member_and_not_a_zombie():
    import subprocess
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                         start_new_session=True)
    try:
        assert shards.group_alive(p.pid)
        p.stdin.close()
        # not reaped: the exited child stays a zombie in its own group until wait()
        wait_for(lambda: gone(p.pid), what="the child to exit")
        assert os.path.exists(f"/proc/{p.pid}"), "still a zombie: not reaped yet"
        assert not shards.group_alive(p.pid)
    finally:
        p.kill()
        p.wait()


def test_group_alive_reads_the_group_after_a_command_with_spaces_and_parentheses(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "stat").write_text("41 (a (b) c) S 1 77 77 0 -1\n")
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (x) Z 1 78 78 0 -1\n")
    assert shards.group_alive(77, proc=str(tmp_path))
    assert not shards.group_alive(78, proc=str(tmp_path))
    assert not shards.group_alive(79, proc=str(tmp_path))
    assert shards.group_alive(79, proc=str(tmp_path / "none")), "no /proc: any member counts, as before"
