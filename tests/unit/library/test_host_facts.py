"""library/host_facts.py run by the real `ansible` on this machine: the probe's answers, and trainyard_init (what
the later roles of a run read instead of probing again), published by the action as a host variable, not a fact."""

from __future__ import annotations

import os
import sys

from helpers import adhoc


def init_of(r):
    """trainyard_init as the action published it for the callback preflight_records (the run's ansible.cfg loads it)."""
    assert "ansible_facts" not in r and r["trainyard_vars"]["hosts"] == ["localhost"], r
    return r["trainyard_vars"]["vars"]["trainyard_init"]


def test_probe_answers_and_publishes_the_init_system(tmp_path):
    r = adhoc("host_facts", {"paths": [str(tmp_path / "not" / "yet")]})
    assert not r.get("failed"), r
    assert r["python"]["executable"] == sys.executable
    assert r["paths"][0]["probed"] == str(tmp_path) and r["paths"][0]["exists"] is False
    init = init_of(r)
    assert init["systemd"] is os.path.isdir("/run/systemd/system")
    assert init["pid1"] == open("/proc/1/comm").read().strip()


def test_one_call_measures_the_clock_offset_and_says_whether_nvidiactl_exists():
    r = adhoc("host_facts", {"paths": []})
    clock = r["clock"]  # the action's controller readings around the module: same clock here, offset ~ 0
    assert 0 <= clock["uncertainty"] < 60 and abs(clock["offset"]) <= clock["uncertainty"] + 0.01, clock
    assert init_of(r)["nvidiactl"] is os.path.exists("/dev/nvidiactl")


def test_probe_says_whether_the_node_is_a_container():
    r = adhoc("host_facts", {"paths": []})
    init = init_of(r)
    here = os.path.exists("/.dockerenv")
    assert (init["container"] == "docker") is here, init
    assert ("/.dockerenv" in init["container_evidence"]) is here


def test_container_engine_from_what_the_engines_leave_behind():
    from helpers import load
    engine = load("library/host_facts.py", "host_facts_mod").container_engine
    assert engine(True, False, "", "") == ("docker", "/.dockerenv exists")
    assert engine(False, True, "", "")[0] == "podman"
    assert engine(False, False, "PATH=/bin\0container=lxc\0", "") == ("lxc", "PID 1 has container=lxc")
    assert engine(False, False, "", "12:pids:/kubepods/besteffort/pod1/abc\n")[0] == "kubernetes"
    assert engine(False, False, "", "0::/system.slice/docker-4f2a.scope\n")[0] == "docker"
    # A machine: no marker file, no container= variable, cgroup v2 root or a systemd slice.
    assert engine(False, False, "PATH=/bin\0", "0::/\n") == (None, "")
    assert engine(False, False, "", "0::/init.scope\n") == (None, "")


def test_probe_reads_the_login_shell_of_the_users_it_is_asked_about():
    import pwd
    name = "ty-absent-%d" % os.getpid()
    r = adhoc("host_facts", {"paths": [], "users": ["root", name]})
    assert init_of(r)["users"] == {"root": pwd.getpwnam("root").pw_shell, name: None}, r
    assert init_of(adhoc("host_facts", {"paths": []}))["users"] == {}
