"""The container → host boundary on the simulated cluster: a process inside the training container cannot reach
the host-only state, rewrite what the host runs, or steer host-side kills with forged records.

Uses tests/integration/playbooks/launch.yml (container role, launch role, janitor role) on the session cluster."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from helpers import BIN, REPO, ansible_env

PLAYBOOK = "tests/integration/playbooks/launch.yml"
STATE = "/var/lib/trainyard/train"
OUT = "/srv/outputs"
CTR = "trainyard-train"
DECOY_ARG = "987654"
# A hostile "python" inside the training image: instead of running the launcher it forges the launcher's pid record,
# pointing at a host process outside the container (found through the shared PID namespace) with its real start
# time and this launch's token (read from the spec the job can read).
EVIL = r'''#!/usr/bin/python3
import json, os, sys
spec = json.load(open(sys.argv[2]))
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            args = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
        except OSError:
            continue
        if args[:2] == [b"sleep", b"''' + DECOY_ARG + r'''"]:
            st = open("/proc/%s/stat" % p).read()
            ticks = int(st[st.rfind(")") + 2:].split()[19])
            rec = {"pid": int(p), "pgid": int(p), "sid": int(p), "start_ticks": ticks, "child_pid": None,
                   "child_start_ticks": None, "token": spec["token"]}
            with open(spec["pid_file"], "w") as f:
                json.dump(rec, f)
'''


def play(cluster, *args):
    return cluster.playbook(PLAYBOOK, *args)


def in_container(cluster, node, script, user=None):
    """script in the training container, as the job's user (container_user) or as user (e.g. "0": a root job)."""
    return cluster.exec(node, ["docker", "exec", *(["-u", user] if user else []), CTR, "sh", "-c", script],
                        check=False)


def module(cluster, node, args):
    """torchrun_launch run ad hoc on one node (real Ansible over SSH); the module's result."""
    r = subprocess.run([str(BIN / "ansible"), node, "-i", str(cluster.inventory), "-m", "torchrun_launch",
                        "-a", json.dumps(args)],
                       env=ansible_env({"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
                                        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}),
                       capture_output=True, text=True, timeout=300, cwd=str(REPO))
    out, _ = json.JSONDecoder().raw_decode(r.stdout[r.stdout.index("{"):])
    return out["plays"][0]["tasks"][0]["hosts"][node]


@pytest.fixture(scope="module")
def prepared(cluster):
    r = play(cluster, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
    assert r.returncode == 0, r.stdout[-3000:]
    r = play(cluster, "-e", "test_launch_entry=none")
    assert r.returncode == 0, r.stdout[-3000:]
    yield cluster
    play(cluster, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")


def test_container_sees_only_the_jobs_read_only_and_writable_parts(prepared):
    c, node = prepared, prepared.head
    c.exec(node, ["sh", "-c", f"echo host-only > {STATE}/host-only.txt"])
    r = in_container(c, node, f"ls -A {STATE}")
    assert set(r.stdout.split()) <= {"job-ro", "job-rw"}, r.stdout
    assert in_container(c, node, f"cat {STATE}/host-only.txt").returncode != 0
    r = in_container(c, node, f"echo pwned > {STATE}/job-ro/test.env")
    assert r.returncode != 0 and "Read-only file system" in r.stderr, r.stdout + r.stderr
    # Writing where the host keeps its control state lands in the container's own filesystem, not the host's, even
    # for a job that runs as root in the container (container_user: root); the default job user cannot write there.
    assert in_container(c, node, f"echo forged > {STATE}/launch.json").returncode != 0
    assert in_container(c, node, f"echo forged > {STATE}/launch.json && echo x > {STATE}/janitor.py",
                        user="0").returncode == 0
    assert c.exec(node, ["cat", f"{STATE}/host-only.txt"]).stdout == "host-only\n"
    assert c.exec(node, ["test", "-e", f"{STATE}/launch.json"], check=False).returncode != 0
    assert in_container(c, node, f"echo ok > {STATE}/job-rw/probe && rm {STATE}/job-rw/probe").returncode == 0


def test_forged_pid_record_from_the_container_cannot_steer_host_kills(prepared):
    c, node = prepared, prepared.head
    c.exec(node, ["sleep", DECOY_ARG], detach=True)
    decoy = None
    for _ in range(50):
        out = c.exec(node, ["pgrep", "-fx", f"sleep {DECOY_ARG}"], check=False).stdout.split()
        if out:
            decoy = int(out[0])
            break
        time.sleep(0.1)
    assert decoy
    try:
        assert in_container(c, node, f"cat > /tmp/evil-python <<'EOF'\n{EVIL}EOF\nchmod +x /tmp/evil-python")\
            .returncode == 0
        args = {"job": "train", "state_root": "/var/lib/trainyard", "runtime": "docker", "container": CTR,
                "container_python": "/tmp/evil-python", "nnodes": 1, "nproc_per_node": 1, "node_rank": 0,
                "master_addr": "127.0.0.1", "master_port": 39555, "entrypoint": "/bin/true"}
        res = module(c, node, args)
        assert res.get("failed") and "does not match the launcher the host started" in res["msg"], res
        assert c.exec(node, ["test", "-e", f"{STATE}/launch.json"], check=False).returncode != 0
        res = module(c, node, {"job": "train", "state_root": "/var/lib/trainyard", "state": "stopped"})
        assert res["state"] == "absent", res
        assert c.exec(node, ["kill", "-0", str(decoy)], check=False).returncode == 0  # the decoy lives
    finally:
        c.exec(node, ["kill", str(decoy)], check=False)
        in_container(c, node, f"rm -f /tmp/evil-python {STATE}/job-rw/launch.pid.json")


def test_janitor_runs_unprivileged_from_code_the_container_cannot_change(prepared):
    c, node = prepared, prepared.head
    argv = ["--steps", "60", "--save-every", "5", "--sleep", "0.2", "--output-root", OUT]
    for n in c.nodes:
        c.exec(n, ["sh", "-c", f"rm -rf {OUT}/checkpoint-* {STATE}/job-rw/torchrun.log*"])
    r = play(c, "-e", "test_launch_prepare=false", "-e", "test_launch_janitor=true",
             "-e", json.dumps({"launch_example_argv": argv, "launch_wait_timeout": 600}))
    assert r.returncode == 0, r.stdout[-4000:]
    code = c.exec(node, ["sha256sum", f"{STATE}/janitor.py"]).stdout
    assert c.exec(node, ["stat", "-c", "%U %a", f"{STATE}/janitor.py"]).stdout.split() == ["root", "644"]
    # The janitor process runs as its own unprivileged user.
    users = [ln.split(None, 1) for ln in c.exec(node, ["ps", "-eo", "user:32=,args="]).stdout.splitlines()
             if "janitor.py" in ln and "setpriv" not in ln]
    assert users and all(u == "trainyard-janitor" for u, _ in users), users
    # The container rewrites "the janitor" and plants a symlink where the old layout kept the janitor's log.
    in_container(c, node, f"echo 'import os; os.system(\"touch /pwned\")' > {STATE}/janitor.py; "
                          f"ln -sf /etc/passwd {STATE}/job-rw/janitor.log")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        log = c.exec(node, ["cat", f"{STATE}/janitor.log"], check=False).stdout
        if re.search(r"deleted \d+ bytes", log):
            break
        time.sleep(2)
    assert re.search(r"deleted \d+ bytes", log), log[-2000:]
    assert c.exec(node, ["sha256sum", f"{STATE}/janitor.py"]).stdout == code
    assert c.exec(node, ["test", "-e", "/pwned"], check=False).returncode != 0
    assert c.exec(node, ["stat", "-c", "%U", f"{STATE}/janitor.log"]).stdout.strip() == "root"


# The job's entry point (run by torchrun inside the container) starts an escaper: it double-forks, calls setsid and
# re-execs python with an empty environment (no launch token) under a name of its own, ignoring SIGTERM; then the
# rank waits. Nothing but the container's cgroup (and the launcher as subreaper) ties the escaper to the job.
ESCAPE_ENTRY = r'''import os, sys, time
marker = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve(sys.executable, ["python3", "-c",
                  "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)", marker], {})
    os._exit(0)
time.sleep(3600)
'''


def adhoc(cluster, node, name, args):
    """One module run ad hoc on one node (real Ansible over SSH); the module's result."""
    r = subprocess.run([str(BIN / "ansible"), node, "-i", str(cluster.inventory), "-m", name, "-a", json.dumps(args)],
                       env=ansible_env({"ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
                                        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}),
                       capture_output=True, text=True, timeout=300, cwd=str(REPO))
    out, _ = json.JSONDecoder().raw_decode(r.stdout[r.stdout.index("{"):])
    return out["plays"][0]["tasks"][0]["hosts"][node]


def escaper_pids(cluster, node, marker):
    r = cluster.exec(node, ["pgrep", "-f", "SIG_IGN.*" + marker], check=False)  # not torchrun or the rank
    return [int(p) for p in r.stdout.split()]


def launch_escaper(cluster, node, marker):
    # An earlier test may have left its job running (the janitor's): a fresh start for this one.
    adhoc(cluster, node, "torchrun_launch", {"job": "train", "state_root": "/var/lib/trainyard", "state": "stopped"})
    res = adhoc(cluster, node, "torchrun_launch", {
        "job": "train", "state_root": "/var/lib/trainyard", "runtime": "docker", "container": CTR,
        "nnodes": 1, "nproc_per_node": 1, "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 39556,
        "entrypoint": "/srv/code/escape_entry.py", "args": [marker], "chdir": "/srv/code"})
    assert not res.get("failed"), (res.get("msg"), res.get("log_tail"))
    pids = []
    for _ in range(100):
        pids = escaper_pids(cluster, node, marker)
        if pids:
            break
        time.sleep(0.2)
    assert len(pids) == 1, "the escaper did not start: %s" % res
    environ = cluster.exec(node, ["cat", f"/proc/{pids[0]}/environ"]).stdout
    assert "TRAINYARD_LAUNCH_ID" not in environ  # it shed the token
    return res


@pytest.mark.parametrize("how", ["stop", "job_reset", "reset.yml"])
def test_a_double_forked_setsid_escaper_without_the_token_is_gone_after_stop_and_reset(prepared, how):
    c, node = prepared, prepared.head
    marker = "ty-escaper-%s-%d" % (how.replace(".", ""), time.time_ns())
    c.exec(node, ["sh", "-c", "cat > /srv/code/escape_entry.py"], input=ESCAPE_ENTRY)
    c.exec(node, ["sleep", DECOY_ARG], detach=True)  # a host process outside the job: never signalled
    try:
        launched = launch_escaper(c, node, marker)
        if how == "stop":
            res = adhoc(c, node, "torchrun_launch", {"job": "train", "state_root": "/var/lib/trainyard",
                                                     "state": "stopped", "stop_timeout": 3})
            assert res["state"] == "stopped" and not res.get("failed"), res
        elif how == "job_reset":
            res = adhoc(c, node, "job_reset", {"job": "train", "state_root": "/var/lib/trainyard",
                                               "stop_timeout": 3})
            assert not res.get("failed"), res
        else:
            r = c.playbook("reset.yml", "-e", "reset_confirm=true", "-e", "reset_container=never")
            assert r.returncode == 0, r.stdout[-3000:]
        assert escaper_pids(c, node, marker) == [], "the escaper survived %s" % how
        assert launched.get("cgroup_tracking") == "pass", launched  # the container's cgroup was recorded
        assert c.exec(node, ["pgrep", "-fx", f"sleep {DECOY_ARG}"], check=False).stdout.strip()  # the decoy lives
    finally:
        adhoc(c, node, "torchrun_launch", {"job": "train", "state_root": "/var/lib/trainyard", "state": "stopped"})
        for pid in escaper_pids(c, node, marker):
            c.exec(node, ["kill", "-9", str(pid)], check=False)
        for pid in c.exec(node, ["pgrep", "-fx", f"sleep {DECOY_ARG}"], check=False).stdout.split():
            c.exec(node, ["kill", pid], check=False)
