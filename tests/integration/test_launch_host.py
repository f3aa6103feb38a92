"""torchrun_launch with runtime host, on this machine: two "nodes" (two state roots, node ranks 0 and 1) of one
real torchrun job over gloo on the loopback interface, driven through ansible-playbook (local connection).
Covers what the simulated cluster test does not: runtime host, another job holding the node, the same job
with a different command, a finished job left alone, a sidecar, and stop sparing a decoy named torchrun."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from helpers import REPO, BIN, ansible_env, parse_recap

PY = str(BIN / "python")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(tmp_path):
    inv = tmp_path / "hosts.yml"
    hosts = {f"n{i}": {"ansible_connection": "local", "ansible_python_interpreter": PY,
                       "state_root": str(tmp_path / f"state{i}"), "node_rank": i} for i in range(2)}
    inv.write_text(json.dumps({"all": {"hosts": hosts}}))
    pb = tmp_path / "launch.yml"
    pb.write_text("""
- hosts: all
  gather_facts: false
  tasks:
    - torchrun_launch:
        state: "{{ st | default('started') }}"
        job: "{{ job | default('hostjob') }}"
        state_root: "{{ state_root }}"
        nnodes: 2
        nproc_per_node: 1
        node_rank: "{{ node_rank }}"
        master_addr: 127.0.0.1
        master_port: "{{ port }}"
        torchrun: ["%s"]
        entrypoint: "%s"
        args: "{{ targs }}"
        env: "{{ jenv | default({'GLOO_SOCKET_IFNAME': 'lo', 'OMP_NUM_THREADS': '1'}) }}"
        first_launch_env: {NCCL_DEBUG: INFO, OMP_NUM_THREADS: "7"}
        chdir: "%s"
        resume_from: auto
        output_root: "%s/out{{ node_rank }}"
        wait_for: "{{ wf | default('first_step') }}"
        wait_timeout: 300
        stop_timeout: 20
        sidecars: [{name: ticker, argv: [sleep, "600"]}]
      register: r
    - copy: {content: "{{ r | to_json }}", dest: "%s/{{ inventory_hostname }}.json", mode: "0644"}
      delegate_to: localhost
      changed_when: false  # the test's own record of the result: the recap counts only the module
""" % (BIN / "torchrun", REPO / "examples/ddp_train.py", tmp_path, tmp_path, tmp_path))
    port = free_port()
    started = []

    def run(*extra, steps=2000, **kw):
        args = {"port": port, "targs": ["--steps", str(steps), "--save-every", "5", "--sleep", "0.1",
                                        "--output-root", str(tmp_path / "out{{ node_rank }}")]}
        args.update(kw)
        argv = [str(BIN / "ansible-playbook"), "-i", str(inv), str(pb), "-e", json.dumps(args), *extra]
        r = subprocess.run(argv, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=900)
        res = {}
        for h in hosts:
            f = tmp_path / f"{h}.json"
            if f.exists():
                res[h] = json.loads(f.read_text())
                f.unlink()
        started.append(args.get("job", "hostjob"))
        return r, parse_recap(r.stdout), res

    yield run, tmp_path
    for job in set(started):
        run("-e", "st=stopped", job=job)


def test_host_runtime_lifecycle(env):
    run, tmp = env
    r, recap, res = run()
    assert r.returncode == 0, r.stdout[-4000:]
    for h, rank in (("n0", 0), ("n1", 1)):
        assert res[h]["changed"] and res[h]["state"] == "running" and res[h]["node_rank"] == rank
        log = Path(res[h]["log"]).read_text()
        assert f"rendezvous done rank={rank} world=2" in log
        assert res[h]["sidecars"][0]["running"]
        state = json.loads((tmp / f"state{rank}" / "hostjob" / "launch.json").read_text())
        assert state["runtime"] == "host" and state["pid"] == res[h]["pid"]
        # A node's first launch gets the first-launch variables; env (applied after them) still wins.
        assert res[h]["first_launch_env"] == ["NCCL_DEBUG", "OMP_NUM_THREADS"]
        assert res[h]["env"]["NCCL_DEBUG"] == "INFO" and res[h]["env"]["OMP_NUM_THREADS"] == "1"

    # Same job, same command: left alone.
    r, recap, res2 = run()
    assert r.returncode == 0 and recap["n0"]["changed"] == 0 and recap["n1"]["changed"] == 0
    assert res2["n0"]["pid"] == res["n0"]["pid"]

    # Same job, another command: refused, with the way out.
    r, recap, res3 = run(steps=999)
    assert r.returncode != 0
    assert "already runs on this node" in r.stdout and "state: stopped" in r.stdout
    assert "a different command or environment (changed: command):" in r.stdout, r.stdout[-3000:]
    # Same command, another environment: refused, naming the variables (never their values).
    r, recap, _ = run(jenv={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "2", "NCCL_SOCKET_IFNAME": "eth9"})
    assert r.returncode != 0
    assert ("(changed: environment set anew: NCCL_SOCKET_IFNAME; environment another value: OMP_NUM_THREADS)"
            in r.stdout), r.stdout[-3000:]
    assert "eth9" not in r.stdout.split("(changed:", 1)[1].split("running:", 1)[0]

    # Another job on a node held by this one: refused, naming the holder.
    r, recap, _ = run(job="otherjob")
    assert r.returncode != 0 and "job hostjob (pid" in r.stdout and "holds this node" in r.stdout

    # Stop: every process of the job and its sidecar, not a decoy named torchrun.
    decoy_dir = tmp / "decoy"
    decoy_dir.mkdir()
    (decoy_dir / "torchrun").symlink_to("/bin/sleep")
    decoy = subprocess.Popen([str(decoy_dir / "torchrun"), "300"], start_new_session=True)
    try:
        token = json.loads((tmp / "state0" / "hostjob" / "launch.json").read_text())["token"]
        r, recap, res4 = run("-e", "st=stopped")
        assert r.returncode == 0 and recap["n0"]["changed"] == 1 and recap["n1"]["changed"] == 1
        assert decoy.poll() is None
        holders = [p for p in os.listdir("/proc") if p.isdigit() and _has_token(p, token)]
        assert holders == []
        assert not (tmp / "state0" / "hostjob" / "launch.json").exists()
        r, recap, _ = run("-e", "st=stopped")
        assert recap["n0"]["changed"] == 0
    finally:
        decoy.kill()
        decoy.wait()


def test_finished_job_is_left_alone_and_resumes_when_extended(env):
    run, tmp = env
    r, recap, res = run(steps=12, wf="none")
    assert r.returncode == 0, r.stdout[-3000:]
    status = None
    for _ in range(120):
        _, _, st = run("-e", "st=status", steps=12)
        status = st["n0"]["state"]
        if status != "running":
            break
        time.sleep(1)
    assert status == "finished", st
    r, recap, res = run(steps=12, wf="none")
    assert recap["n0"]["changed"] == 0 and res["n0"]["state"] == "finished"
    # A longer run of the same job resumes from the last complete checkpoint (rank 0's node holds it).
    r, recap, res = run(steps=30)
    assert r.returncode == 0, r.stdout[-3000:]
    # Not the node's first launch of the job: no first-launch variables.
    assert "first_launch_env" not in res["n0"] and "NCCL_DEBUG" not in res["n0"]["env"]
    assert res["n0"]["resume_from"].endswith("/out0/checkpoint-10")
    assert "resumed from" in Path(res["n0"]["log"]).read_text()


def _has_token(pid: str, token: str) -> bool:
    try:
        return f"TRAINYARD_LAUNCH_ID={token}".encode() in open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return False
