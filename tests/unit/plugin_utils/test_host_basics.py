"""The host-basics checks (plugin_utils/host_basics.py): every record's status, detail and fix from a probe, the
clock judged against the median of the nodes taken once, and the role's tasks run by the real ansible-playbook on
three local inventory hosts (one whose Python cannot run the probe)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from helpers import BIN, REPO

from ansible_collections.trainyard.core.plugins.plugin_utils import host_basics as hb

GIB, MIB = 2**30, 2**20
PF = {"min_free_gb": 10, "min_shm_mb": 512, "min_memlock_kb": -1, "max_clock_skew_s": 2.0, "min_python": "3.8",
      "docker": "auto"}
OPTS = {"thresholds": PF, "output_root": "/srv/out", "launch_runtime": "docker", "nccl_env_profile": "tcp",
        "container_engine_install": True, "container_enabled": True}


def probe(**over):
    p = {"time": 1.0, "python": {"version": "3.11.2", "executable": "/usr/bin/python3"},
         "paths": [{"path": "/srv/out", "probed": "/srv/out", "exists": True, "free_bytes": 50 * GIB,
                    "total_bytes": 252 * GIB}],
         "shm": {"path": "/dev/shm", "exists": True, "total_bytes": 16 * GIB, "free_bytes": 16 * GIB - MIB},
         "limits": {"memlock_soft_kb": -1, "memlock_hard_kb": -1, "nofile_soft": 1024, "nofile_hard": 4096},
         "docker": {"cli": "/usr/bin/docker", "socket": "/var/run/docker.sock", "reachable": True, "version": "27.3.1",
                    "api_version": "1.47", "error": None},
         "clock": {"offset": 0.5, "uncertainty": 0.1},
         "ansible_facts": {"trainyard_init": {"systemd": True, "pid1": "systemd", "container": None,
                                              "container_evidence": "", "nvidiactl": False}}}
    for key, value in over.items():
        p[key] = dict(p[key], **value) if isinstance(value, dict) else value
    return p


REF = {"median": 0.25, "uncertainty": 0.2, "nodes": 3}


def records(p=None, ref=REF, **opts):
    out = hb.host_basics_records(p or probe(), ref, dict(OPTS, **opts))
    return {r["check"]: r for r in out}


def status(rec):
    return rec.get("status") or ("pass" if rec["ok"] else "fail")


def test_a_healthy_node_passes_every_check_with_what_was_seen():
    r = records()
    assert list(r) == ["cluster.python", "cluster.disk", "cluster.shm", "cluster.memlock", "cluster.docker",
                       "cluster.clock"]
    assert all(status(x) == "pass" for x in r.values()), r
    assert r["cluster.python"]["detail"] == "Python 3.11.2 (/usr/bin/python3)"
    assert r["cluster.python"]["data"] == {"drift": {"python": "3.11.2"}}
    assert r["cluster.disk"]["detail"] == "/srv/out: 50.0 GiB free of 252.0 GiB, need 10 GiB"
    assert r["cluster.disk"]["data"] == {"free_gib": 50.0}
    assert r["cluster.shm"]["detail"] == "/dev/shm 16384 MiB (16383 MiB free), need 512 MiB"
    assert r["cluster.memlock"]["detail"] == ("memlock soft unlimited, hard unlimited; need unlimited (a warning with "
                                              "nccl_env_profile tcp)")
    assert r["cluster.docker"]["detail"] == "docker 27.3.1 (API 1.47) answers on /var/run/docker.sock"
    assert r["cluster.docker"]["data"] == {"drift": {"docker": "27.3.1"}}
    # 0.5 from a median of 0.25: +0.25 s, within both measurement windows (0.1 + 0.2).
    assert r["cluster.clock"]["detail"] == ("clock +0.25 s from the median of the nodes (at least 0.00 s after the "
                                            "measurement error of ±0.10 s), allowed 2.0 s")
    assert r["cluster.clock"]["data"] == {"clock_offset_s": 0.25}


def test_each_failure_says_what_was_seen_and_the_fix():
    p = probe(python={"version": "3.6.8"},
              paths=[{"path": "/srv/out", "probed": "/srv", "exists": False, "free_bytes": 5 * GIB,
                      "total_bytes": 100 * GIB}],
              shm={"total_bytes": 64 * MIB, "free_bytes": 60 * MIB},
              docker={"reachable": False, "version": None, "cli": None,
                      "error": "/var/run/docker.sock does not exist (engine not installed or not running)"},
              clock={"offset": 5.25, "uncertainty": 0.3})
    r = records(p, container_engine_install=False)
    assert {c: status(x) for c, x in r.items()} == {
        "cluster.python": "fail", "cluster.disk": "fail", "cluster.shm": "fail", "cluster.memlock": "pass",
        "cluster.docker": "fail", "cluster.clock": "fail"}
    assert r["cluster.python"]["fix"] == "Install Python >= 3.8 and point ansible_python_interpreter at it"
    assert r["cluster.disk"]["detail"] == ("/srv/out (not created yet, measured /srv): 5.0 GiB free of 100.0 GiB, "
                                           "need 10 GiB")
    assert r["cluster.disk"]["fix"] == ("Free space on the filesystem of /srv, move cluster_output_root to a larger "
                                        "disk, or lower cluster_preflight.min_free_gb")
    assert r["cluster.shm"]["detail"] == "/dev/shm 64 MiB (60 MiB free), need 512 MiB"
    assert r["cluster.shm"]["fix"].startswith("Enlarge /dev/shm (mount -o remount,size=<N>G /dev/shm")
    assert r["cluster.docker"]["detail"] == ("engine not answering: /var/run/docker.sock does not exist (engine not "
                                             "installed or not running); CLI missing")
    assert r["cluster.docker"]["fix"] == ("Install and start the docker engine (or set container_engine_install true "
                                          "so the container role does)")
    assert r["cluster.docker"]["data"] == {"drift": {"docker": "-"}}
    # The node's offset from the median (5.25 - 0.25), less its window and the widest one: 5.0 - 0.3 - 0.2.
    assert r["cluster.clock"]["detail"] == ("clock +5.00 s from the median of the nodes (at least 4.50 s after the "
                                            "measurement error of ±0.30 s), allowed 2.0 s")
    assert r["cluster.clock"]["fix"].startswith("Run NTP on every node")
    assert r["cluster.clock"]["data"] == {"clock_offset_s": 5.0}


def test_memlock_fails_under_rdma_and_warns_elsewhere():
    p = probe(limits={"memlock_soft_kb": 8192, "memlock_hard_kb": 8192})
    warn = records(p)["cluster.memlock"]
    assert warn["status"] == "warn" and warn["detail"] == ("memlock soft 8192 KiB, hard 8192 KiB; need unlimited "
                                                           "(a warning with nccl_env_profile tcp)")
    fail = records(p, nccl_env_profile="ib")["cluster.memlock"]
    assert fail["status"] == "fail" and fail["detail"].endswith("(fatal for nccl_env_profile ib)")
    assert fail["fix"].startswith("Add '* - memlock unlimited' to /etc/security/limits.d/99-trainyard.conf")
    enough = records(p, thresholds=dict(PF, min_memlock_kb=8192))["cluster.memlock"]
    assert enough["status"] == "pass" and "need 8192 KiB" in enough["detail"]
    assert enough["data"] == {"drift": {"memlock_kb": 8192}}


def test_docker_skips_where_no_engine_is_needed_and_warns_while_the_container_role_installs_it():
    p = probe(docker={"reachable": False, "version": None, "cli": "/usr/bin/docker", "error": "GET /_ping answered 500"})
    later = records(p)["cluster.docker"]
    assert later["status"] == "warn"
    assert later["detail"] == ("engine not answering: GET /_ping answered 500; CLI /usr/bin/docker; the container role "
                               "installs it")
    skip = records(p, launch_runtime="host")["cluster.docker"]
    assert skip["status"] == "skip" and skip["detail"] == "not needed (launch_runtime host, cluster_preflight.docker auto)"
    required = records(p, launch_runtime="host", thresholds=dict(PF, docker="required"))["cluster.docker"]
    assert required["status"] == "fail"  # required: the container role's install is no excuse
    assert records(p, thresholds=dict(PF, docker="skip"))["cluster.docker"]["status"] == "skip"


def test_a_container_without_an_engine_says_what_runs_instead_or_fails():
    init = {"systemd": False, "pid1": "sshd", "container": "docker", "container_evidence": "/.dockerenv exists"}
    p = probe(docker={"reachable": False, "cli": None, "version": None, "error": "no socket"},
              ansible_facts={"trainyard_init": init})
    host = records(p, launch_runtime="host", container_enabled=False)["cluster.container"]
    assert host["status"] == "skip" and host["fix"] == ""
    assert host["detail"] == ("docker container (/.dockerenv exists), PID 1 sshd, no systemd, no docker engine: the job "
                              "runs on the node (launch_runtime host); the janitor as a sidecar of the job; driver, "
                              "fabric manager and MTU persistence belong to the provider host (verified, never "
                              "installed)")
    assert host["data"] == {"drift": {"node": "docker container"}}
    docker = records(p)["cluster.container"]
    assert docker["status"] == "fail"
    assert docker["detail"].endswith("no docker engine: container_enabled True and launch_runtime docker need one here")
    assert docker["fix"] == ("set container_enabled: false and launch_runtime: host (inventory/example-rented-overlay): "
                             "an engine cannot be installed inside the container")
    # An engine that answers, or a machine that is no container: no record.
    assert "cluster.container" not in records(probe(ansible_facts={"trainyard_init": init}))
    assert "cluster.container" not in records()


def test_a_probe_that_did_not_run_fails_python_and_skips_the_rest():
    r = hb.host_basics_records({"failed": True, "msg": "/usr/bin/python3: not found " + "x " * 200}, None, OPTS)
    assert [x["check"] for x in r] == ["cluster.python", "cluster.disk", "cluster.shm", "cluster.memlock",
                                       "cluster.docker", "cluster.clock"]
    assert r[0]["ok"] is False and r[0]["detail"].startswith("/usr/bin/python3: not found x x")
    assert r[0]["detail"].endswith("...") and len(r[0]["detail"]) <= 300
    assert r[0]["fix"] == ("Install python3 (>= 3.8) on the node, or point ansible_python_interpreter at a working "
                           "one")
    assert all(x["status"] == "skip" and x["detail"] == "the host probe did not run (see cluster.python)"
               for x in r[1:])
    assert hb.host_basics_records({"failed": True}, None, OPTS)[0]["detail"] == "the probe failed"


def test_clock_reference_is_the_median_and_the_widest_window():
    clocks = [{"offset": 3.0, "uncertainty": 0.1}, {"offset": -1.0, "uncertainty": 0.5},
              {"offset": 0.5, "uncertainty": 0.2}, {"offset": 0.7, "uncertainty": 0.05}]
    # An even count takes the upper median, as the report always did.
    assert hb.clock_reference(clocks) == {"median": 0.7, "uncertainty": 0.5, "nodes": 4}
    assert hb.clock_reference(clocks[:3]) == {"median": 0.5, "uncertainty": 0.5, "nodes": 3}
    assert hb.clock_reference([]) is None and hb.clock_reference([None, {}]) is None


def test_no_per_node_task_of_the_preflight_templates_over_every_host():
    """A cross-node value is taken once (run_once): a per-node task that maps over hostvars costs O(n) per node."""
    tasks = yaml.safe_load((REPO / "roles/cluster/tasks/preflight.yml").read_text())
    for task in tasks:
        if not task.get("run_once"):
            assert "hostvars" not in json.dumps(task), task["name"]


def test_the_role_records_every_node_and_takes_the_median_once(tmp_path):
    """roles/cluster/tasks/preflight.yml by the real ansible-playbook over three local hosts; n3's Python does not
    exist, so its probe fails: cluster.python names the error, the rest are skipped, and the clock median is over the
    two nodes that answered. The records of every node come from one task (run_once on n1), each with the node's own
    options: n1's own cluster_preflight (a host variable) fails its disk check and no other node's."""
    pb = tmp_path / "pb.yml"
    pb.write_text("""
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.import_role: {name: trainyard_defaults}
    - ansible.builtin.import_role: {name: cluster, tasks_from: preflight}
    - ansible.builtin.debug: {var: preflight_results}
""")
    inv = tmp_path / "hosts.yml"
    pf = {"min_free_gb": 0.001, "min_shm_mb": 1, "min_memlock_kb": 0, "docker": "skip"}
    inv.write_text(yaml.safe_dump({"all": {"hosts": {
        "n1": {"cluster_preflight": dict(pf, min_free_gb=10 ** 9)}, "n2": {},
        "n3": {"ansible_python_interpreter": "/nonexistent/python3"}},
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "cluster_output_root": f"{tmp_path}/out", "cluster_preflight": pf}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(pb)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    out, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index("{"):])
    tasks = {t["task"]["name"]: t["hosts"] for t in out["plays"][0]["tasks"]}
    basics = tasks["cluster : Record the host basics of every node (once, each clock against the median of the nodes)"]
    assert len(basics) == 1 and next(iter(basics.values()))["clocks"]["nodes"] == 2, basics
    results = {h: {r["check"]: r for r in v["preflight_results"]} for h, v in tasks["ansible.builtin.debug"].items()}
    for node in ("n1", "n2"):
        # docker: skip, unless an engine answers on this machine (then it says so).
        docker = "pass" if results[node]["cluster.docker"]["detail"].startswith("docker ") else "skip"
        assert {c: r["status"] for c, r in results[node].items()} == {
            "cluster.python": "pass", "cluster.disk": "fail" if node == "n1" else "pass", "cluster.shm": "pass",
            "cluster.memlock": "pass", "cluster.docker": docker, "cluster.clock": "pass"}, results[node]
        assert results[node]["cluster.clock"]["host"] == node
        assert results[node]["cluster.clock"]["detail"].startswith("clock ")
    bad = results["n3"]
    assert bad["cluster.python"]["status"] == "fail" and bad["cluster.python"]["detail"], bad
    assert all(bad[c]["status"] == "skip" for c in bad if c != "cluster.python"), bad
