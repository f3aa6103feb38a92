"""reset.yml and job_reset on the simulated cluster.

`test_job_reset_*` run today: they crash a stand-in job that the test starts itself on every node (a leader
with the job's launch token and an orphaned worker in its own session that listens on the rendezvous port and
leaves shm/tmp files), next to decoys (a process named torchrun, a /dev/shm/torch_other held open by it).
`test_reset_playbook_*` run the whole reset.yml after a real launch and skip until the roles they need
(cluster validate, launch, container) are in the tree.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from helpers import BIN, REPO, parse_recap

STATE_ROOT = "/var/lib/trainyard"
PORT = 39500

# Runs on a node: start a stand-in job as torchrun_launch would (leader in its own session with the launch
# token; a worker in a session of its own), write launch.json, then crash it (leader killed -9).
FAKE_JOB = r'''
import json, os, signal, subprocess, sys, time, uuid
state_root, job, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
worker = """
import os, socket, sys, time
port = int(sys.argv[1])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", port)); s.listen()
nccl = open("/dev/shm/nccl-Xy12Ab", "w")
open("/dev/shm/torch_%d_987_0" % os.getpid(), "w").write("x" * 4096)
os.makedirs("/tmp/.torch_distributed_rdzv", exist_ok=True)
open("/tmp/.torch_distributed_rdzv/store", "w").write("s")
open("/tmp/fakejob.ready", "w").close()
time.sleep(3600)
"""
leader = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(3600)
"""
os.makedirs(os.path.join(state_root, job), exist_ok=True)
token = uuid.uuid4().hex
started = time.time()
time.sleep(0.05)
env = dict(os.environ, TRAINYARD_LAUNCH_ID=token)
p = subprocess.Popen([sys.executable, "-c", leader, worker, str(port)], env=env, start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(600):
    if os.path.exists("/tmp/fakejob.ready"):
        break
    time.sleep(0.05)
else:
    holders = [ln for f in ("/proc/net/tcp", "/proc/net/tcp6") for ln in open(f).read().splitlines()[1:]
               if ln.split()[1].endswith(":%04X" % port)]
    sys.exit("stand-in worker not ready after 30 s; port %d entries in /proc/net/tcp and tcp6: %s" % (port, holders))
os.unlink("/tmp/fakejob.ready")
t = open("/proc/%d/stat" % p.pid).read()
ticks = int(t[t.rfind(")") + 2:].split()[19])
state = {"version": 1, "job": job, "runtime": "host", "container": "", "pid": p.pid, "pgid": p.pid,
         "start_ticks": ticks, "started_at": started, "command": ["torchrun", "train.py"], "env_files": [],
         "log": os.path.join(state_root, job, "torchrun.log"), "node_rank": 0, "master_port": port,
         "resume_from": "", "sidecars": [], "token": token}
open(os.path.join(state_root, job, "launch.json"), "w").write(json.dumps(state))
os.kill(p.pid, signal.SIGKILL)
p.wait()
print(json.dumps(state))
'''

# A decoy named torchrun (not ours) that holds /dev/shm/torch_other open.
DECOY = ["python3", "-c", "import os; fd = os.open('/dev/shm/torch_other', os.O_RDWR | os.O_CREAT); "
         "os.set_inheritable(fd, True); os.execvp('sleep', ['torchrun', '3600'])"]


def pids_with_token(cluster, node, token):
    script = ("import os\nfor p in os.listdir('/proc'):\n if p.isdigit():\n  try:\n"
              "   e = open('/proc/%s/environ' % p, 'rb').read()\n  except OSError:\n   continue\n"
              f"  if b'TRAINYARD_LAUNCH_ID={token}' in e.split(b'\\0'):\n   print(p)\n")
    return cluster.exec(node, ["python3", "-c", script]).stdout.split()


def listening(cluster, node, port):
    out = cluster.exec(node, ["cat", "/proc/net/tcp", "/proc/net/tcp6"]).stdout
    return any(len(f) > 3 and f[1].endswith(":%04X" % port) and f[3] == "0A" for f in (ln.split() for ln in out.splitlines()))


def exists(cluster, node, path):
    return cluster.exec(node, ["test", "-e", path], check=False).returncode == 0


@pytest.fixture(scope="module", autouse=True)
def no_job_left(cluster):
    """Test files run before this one on the same cluster may leave their job running (site.yml launches it) on the
    rendezvous port the stand-in job listens on: job_reset stops it first, as a user's reset would."""
    r, out = job_reset_adhoc(cluster)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    for n in cluster.nodes:
        assert not listening(cluster, n, PORT), (n, out.get(n))


def crash_fake_job(cluster, node, job="train"):
    out = cluster.exec(node, ["python3", "-c", FAKE_JOB, STATE_ROOT, job, str(PORT)], timeout=60).stdout
    return json.loads(out.strip().splitlines()[-1])


def start_decoy(cluster, node):
    cluster.exec(node, DECOY, detach=True)
    for _ in range(50):
        r = cluster.exec(node, ["sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | "
                                            "grep -q '^torchrun 3600' && basename $p; done; true"], check=False)
        if r.stdout.split():
            return r.stdout.split()[0]
        time.sleep(0.1)
    raise AssertionError(f"{node}: decoy did not start")


def job_reset_adhoc(cluster, limit=None, check=False, extra=None):
    args = {"job": "train", "state_root": STATE_ROOT, "port": PORT, "stop_timeout": 5}
    args.update(extra or {})
    argv = [str(BIN / "ansible"), "trainers", "-i", str(cluster.inventory), "-m", "job_reset",
            "-a", json.dumps(args), "-o"] + (["--check"] if check else []) + (["--limit", limit] if limit else [])
    import subprocess
    from helpers import ansible_env
    r = subprocess.run(argv, cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=300)
    out = {}
    for line in r.stdout.splitlines():
        if " | " in line and " => " in line:
            host, rest = line.split(" | ", 1)
            status, body = rest.split(" => ", 1)
            out[host] = (status, json.loads(body))
        elif " | UNREACHABLE" in line:
            out[line.split(" | ")[0]] = ("UNREACHABLE", {})
    return r, out


def cleanup_node(cluster, node, decoy_pid=None):
    if decoy_pid:
        cluster.exec(node, ["kill", decoy_pid], check=False)
    cluster.exec(node, ["rm", "-rf", "/dev/shm/torch_other", f"{STATE_ROOT}/train/launch.json"], check=False)


def test_job_reset_cleans_a_crashed_job_on_every_node_and_spares_decoys(cluster):
    nodes = cluster.nodes
    decoys = {}
    states = {}
    try:
        for n in nodes:
            decoys[n] = start_decoy(cluster, n)
            states[n] = crash_fake_job(cluster, n)
        for n in nodes:
            assert pids_with_token(cluster, n, states[n]["token"]), n
            assert listening(cluster, n, PORT) and exists(cluster, n, "/dev/shm/nccl-Xy12Ab")
        # Check mode: nothing changes.
        r, res = job_reset_adhoc(cluster, check=True)
        assert set(res) == set(nodes), r.stdout + r.stderr
        for n in nodes:
            assert res[n][0] == "CHANGED", res[n]
            assert listening(cluster, n, PORT) and pids_with_token(cluster, n, states[n]["token"])
        # Real run.
        t0 = time.monotonic()
        r, res = job_reset_adhoc(cluster)
        wall = time.monotonic() - t0
        print(f"job_reset on {len(nodes)} nodes from a crashed state: {wall:.1f} s")
        for n in nodes:
            status, body = res[n]
            assert status == "CHANGED", body
            assert not pids_with_token(cluster, n, states[n]["token"]), n
            assert not listening(cluster, n, PORT), n
            for leftover in ("/tmp/.torch_distributed_rdzv", "/dev/shm/nccl-Xy12Ab"):
                assert not exists(cluster, n, leftover), (n, leftover)
            assert not cluster.exec(n, ["sh", "-c", "ls /dev/shm | grep '^torch_[0-9]' || true"]).stdout.strip()
            # Decoys survive: the process named torchrun, and the torch_ file it holds.
            assert exists(cluster, n, f"/proc/{decoys[n]}"), n
            assert exists(cluster, n, "/dev/shm/torch_other"), n
            assert any(k["path"] == "/dev/shm/torch_other" for k in body["kept"]), body["kept"]
            assert body["port"]["free"] is True
        # Idempotent: a second run changes nothing.
        r, res = job_reset_adhoc(cluster)
        assert all(res[n][0] == "SUCCESS" and res[n][1]["changed"] is False for n in nodes), res
    finally:
        for n in nodes:
            cleanup_node(cluster, n, decoys.get(n))


def test_job_reset_reports_a_foreign_listener_and_still_cleans_other_nodes(cluster):
    head, down = cluster.nodes[0], cluster.nodes[-1]
    states = {}
    try:
        # A stuck listener on the port that is not the job's: reported with its PID, left alone. SO_REUSEADDR as a
        # server sets it: an earlier test's connections to the port may still be in TIME_WAIT on the head.
        cluster.exec(head, ["sh", "-c", f"exec python3 -c 'import socket,time; s=socket.socket(); "
                                        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                                        f"s.bind((\"0.0.0.0\",{PORT})); s.listen(); time.sleep(3600)' "
                                        "</dev/null >/dev/null 2>&1"], detach=True)
        deadline = time.monotonic() + 30
        while not listening(cluster, head, PORT) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert listening(cluster, head, PORT), f"the test's own listener on {head}:{PORT} did not start"
        for n in cluster.nodes[1:]:
            states[n] = crash_fake_job(cluster, n)
        import subprocess
        subprocess.run(["docker", "stop", "-t", "0", down], check=True, capture_output=True)
        try:
            r, res = job_reset_adhoc(cluster)
            assert res[down][0] == "UNREACHABLE", r.stdout
            body = res[head][1]
            assert body["port"]["free"] is False and body["port"]["holders"][0]["cmdline"][0] == "python3"
            assert "held by PID" in body["summary"]
            assert listening(cluster, head, PORT)
            mid = cluster.nodes[1]
            assert res[mid][0] == "CHANGED" and not pids_with_token(cluster, mid, states[mid]["token"])
        finally:
            cluster.start(down)
    finally:
        holder = cluster.exec(head, ["sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null "
                                                 f"| grep -q 's.bind((\"0.0.0.0\",{PORT}))' && basename $p; done; true"],
                              check=False).stdout.split()
        for p in holder:
            cluster.exec(head, ["kill", p], check=False)
        for n in cluster.nodes:
            job_reset_adhoc(cluster, limit=n)
            cleanup_node(cluster, n)


# ------------------------------------------------------------------------------ whole reset.yml

NEEDED = ["roles/cluster/tasks/validate.yml", "roles/launch/tasks/reset.yml", "roles/container/tasks/reset.yml"]
missing = [p for p in NEEDED if not (REPO / p).exists()]
needs_roles = pytest.mark.skipif(bool(missing), reason=f"reset.yml needs {', '.join(missing)}")


def reset(cluster, *args):
    return cluster.playbook("reset.yml", "-e", "reset_confirm=true", *args)


@needs_roles
def test_reset_playbook_after_a_crash_then_a_fresh_launch(cluster):
    # A job of its own, started fresh: site.yml leaves a job that already ran to its end with the same command as
    # finished (nothing to crash), and one resumed from an earlier test's last checkpoint would end at once.
    options = {"--steps": 100000 + uuid.uuid4().int % 100000, "--save-every": 10, "--sleep": 0.2,
               "--output-root": "{{ train_args_output_dir }}"}
    r = cluster.playbook("site.yml", "-e", json.dumps({"train_args_options": options, "launch_resume_from": ""}))
    assert r.returncode == 0, r.stdout[-4000:]
    head, others = cluster.nodes[0], cluster.nodes[1:]
    decoy = start_decoy(cluster, head)
    try:
        tokens = {}
        for n in cluster.nodes:
            st = json.loads(cluster.exec(n, ["cat", f"{STATE_ROOT}/train/launch.json"]).stdout)
            tokens[n] = st["token"]
            assert pids_with_token(cluster, n, st["token"]), (
                n, cluster.exec(n, ["tail", "-n", "40", f"{STATE_ROOT}/train/job-rw/torchrun.log"], check=False).stdout,
                r.stdout[-3000:])
        # Crash: kill -9 the ranks on some nodes (the agents' children), leave shm files and a listener.
        for n in others:
            for pid in pids_with_token(cluster, n, tokens[n]):
                cluster.exec(n, ["kill", "-9", pid], check=False)
        cluster.exec(head, ["sh", "-c", "echo x > /dev/shm/nccl-crash1; echo y > /dev/shm/torch_1_2_3; "
                                        "mkdir -p /tmp/.torch_distributed_crash"])
        t0 = time.monotonic()
        r = reset(cluster)
        wall = time.monotonic() - t0
        print(f"reset.yml on {len(cluster.nodes)} nodes from a crashed state: {wall:.1f} s")
        assert r.returncode == 0, r.stdout[-4000:]
        for n in cluster.nodes:
            assert not pids_with_token(cluster, n, tokens[n]), n
            assert not listening(cluster, n, PORT), n
            for leftover in ("/dev/shm/nccl-crash1", "/dev/shm/torch_1_2_3", "/tmp/.torch_distributed_crash"):
                assert not exists(cluster, n, leftover), (n, leftover)
            running = cluster.ssh(n, ["docker", "inspect", "-f", "{{.State.Running}}", "trainyard-train"]).stdout
            assert running.strip() == "true", n
        assert exists(cluster, head, f"/proc/{decoy}") and exists(cluster, head, "/dev/shm/torch_other")
        # Reset on a clean cluster changes nothing.
        r = reset(cluster)
        assert r.returncode == 0, r.stdout[-4000:]
        assert all(v["changed"] == 0 for h, v in parse_recap(r.stdout).items() if h in cluster.nodes), r.stdout[-3000:]
        # A launch that skipped the render play (the job's nccl.env and arguments) stops, naming the fix, and starts
        # nothing; tags that bring back only the arguments stop the same.
        for tags in ("launch", "train_args,launch"):
            r = cluster.playbook("site.yml", "--tags", tags)
            assert r.returncode != 0 and "Run site.yml without --tags" in r.stdout, r.stdout[-4000:]
            assert not any(exists(cluster, n, "/var/lib/trainyard/train/launch.json") for n in cluster.nodes)
        # A fresh launch (the launch role alone, as the launch tests run it) succeeds on the reset cluster.
        r = cluster.playbook("tests/integration/playbooks/launch.yml")
        assert r.returncode == 0, r.stdout[-4000:]
    finally:
        # Reset before the cleanup: the cleanup removes launch.json, without which reset cannot tell the job
        # just launched is ours and would leave it holding the rendezvous port for the next test.
        r = reset(cluster)
        cleanup_node(cluster, head, decoy)
    assert r.returncode == 0 and not listening(cluster, head, PORT), r.stdout[-4000:]


@needs_roles
def test_reset_playbook_with_a_node_down_cleans_the_others(cluster):
    import subprocess
    down = cluster.nodes[-1]
    for n in cluster.nodes[:-1]:
        crash_fake_job(cluster, n)
    subprocess.run(["docker", "stop", "-t", "0", down], check=True, capture_output=True)
    try:
        r = reset(cluster)
        assert r.returncode != 0
        recap = parse_recap(r.stdout)
        assert recap[down]["unreachable"] == 1
        assert f"{down}: UNREACHABLE" in r.stdout or "not reset" in r.stdout
        for n in cluster.nodes[:-1]:
            assert not listening(cluster, n, PORT) and not exists(cluster, n, "/dev/shm/nccl-Xy12Ab"), n
    finally:
        cluster.start(down)
