"""action_plugins/container_engine_probe.py: the container role's first node call refuses where container_image is not
set (the message of the former "Stop if container_image is not set" task) before the role touches anything, install
included; otherwise it is community.docker.docker_host_info."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import BIN, REPO, adhoc

MSG = ("localhost: container_image is empty. Set it to the training image (e.g. "
       "registry.example.com/team/train:2024-11 or repo@sha256:<digest>) in the cluster's group_vars/all.yml.")


def test_refuses_with_its_lines_and_runs_nothing():
    r = adhoc("container_engine_probe", {"refuse": ["n1: first", "n1: second"]})
    assert r.get("failed") and r["refused"] and r["msg"] == "n1: first\nn1: second", r
    assert "can_talk_to_docker" not in r


def test_without_refusal_it_is_the_engine_probe():
    r = adhoc("container_engine_probe", {"refuse": []})
    assert "refused" not in r and "can_talk_to_docker" in r, r


def test_an_answer_that_talked_to_the_engine_is_not_asked_again():
    """install.yml's probe serves (no module run: the marker of the answer given stays in the result), and the result
    carries the role's reading of it (plugin_utils/container_checks.py engine_view); an answer that did not talk to
    the engine is asked again."""
    given = {"can_talk_to_docker": True, "host_info": {"Runtimes": {"runc": {}, "nvidia": {}}}, "marker": "install"}
    r = adhoc("container_engine_probe", {"answer": given, "container_gpus": "auto", "container_gpu_mode": "auto",
                                         "nvidiactl": True})
    assert r["marker"] == "install" and r["engine_ok"] is True and r["asked"] is False, r
    assert (r["gpus"], r["gpu_mode"], r["runtimes"]) == (True, "runtime", ["runc", "nvidia"]), r
    again = adhoc("container_engine_probe", {"answer": dict(given, can_talk_to_docker=False),
                                             "container_gpus": "none"})
    assert "marker" not in again and again["asked"] is True and again["gpus"] is False, again


def test_without_the_host_probe_s_answer_it_looks_for_the_nvidia_control_device_itself():
    """The role run on its own (no cluster role before it, no install): nvidiactl left out, the action stats
    /dev/nvidiactl on the node (this machine here) and container_gpus auto follows it."""
    r = adhoc("container_engine_probe", {"container_gpus": "auto", "container_gpu_mode": "runtime"})
    assert r["gpus"] is os.path.exists("/dev/nvidiactl"), r
    assert adhoc("container_engine_probe", {"container_gpus": "auto", "nvidiactl": True})["gpus"] is True


def test_the_role_refuses_an_unset_image_before_the_install(tmp_path: Path):
    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        "vars": {"container_image": " ", "container_engine_install": True},
        "tasks": [{"ansible.builtin.import_role": {"name": "container", "rolespec_validate": False}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_ROLES_PATH=str(REPO / "roles"))
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "--check",
                        "-e", f"ansible_python_interpreter={sys.executable}", str(play)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index("{"):])
    tasks = [(t["task"]["name"], t["hosts"]["localhost"]) for t in out["plays"][0]["tasks"]]
    failed = [(name, res) for name, res in tasks if res.get("failed")]
    assert p.returncode != 0 and len(failed) == 1, tasks
    name, res = failed[0]
    assert name.endswith("Stop if container_image is not set, else probe the docker engine and pull the training "
                         "image"), name
    assert res["msg"] == MSG and res["refused"], res
    assert not any(res.get("changed") for _, res in tasks), tasks
    assert all(res.get("skipped") for name, res in tasks if "Install" in name), tasks


# The engine answered (as install.yml's probe would give it): no engine needed on this machine for the pull's cases.
OK = {"can_talk_to_docker": True, "host_info": {"Runtimes": {"runc": {}}}}
# docker_image_pull refuses this argument before it talks to any engine or registry.
REFUSED_PULL = {"name": "trainyard/absent:0", "pull": "no-such-policy"}


def test_a_failed_pull_is_the_result_s_not_the_task_s_and_the_image_is_read_instead():
    """The role's records say what failed (container.image_pull); the digest comparison reads the image the node has
    (pull.image_info) where the pull gave none; without a login there is no login in the result."""
    r = adhoc("container_engine_probe", {"answer": OK, "container_gpus": "none", "pull": REFUSED_PULL})
    assert not r.get("failed") and r["changed"] is False and r["asked"] is False, r
    pull = r["pull"]
    assert "value of pull must be one of" in pull["msg"] and "image" not in pull, r
    assert "login" not in pull and "manifest" not in pull and "invocation" not in pull, r
    assert isinstance(pull["image_info"], dict) and "invocation" not in pull["image_info"], r
    assert "images" in pull["image_info"] or pull["image_info"].get("failed"), r
    r = adhoc("container_engine_probe", {"answer": OK, "container_gpus": "none", "pull": REFUSED_PULL, "read": False})
    assert "image_info" not in r["pull"], r


def test_no_pull_where_the_engine_does_not_answer_or_none_is_asked_for():
    r = adhoc("container_engine_probe", {"docker_host": "unix:///nonexistent/docker.sock", "container_gpus": "none",
                                         "pull": REFUSED_PULL})
    assert r["engine_ok"] is False and "pull" not in r and not r["changed"], r
    assert "pull" not in adhoc("container_engine_probe", {"answer": OK, "container_gpus": "none"})


def test_gpu_mode_devices_reads_the_node_s_gpu_paths_in_the_same_task(tmp_path: Path):
    """gpu mode devices (an engine without the NVIDIA runtime): the device nodes, the driver's libraries and nvidia-smi
    come back in the probe's own result (gpu_paths), read by the module container_gpu_paths in the same task; where
    the runtime serves, or the container gets no GPUs, nothing is read."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("")
    given = {"can_talk_to_docker": True, "host_info": {"Runtimes": {"runc": {}}}}
    paths = {"lib_dir": "/opt/driver/lib", "nvidia_smi_paths": [str(tmp_path / "absent"), str(smi)]}
    r = adhoc("container_engine_probe", {"answer": given, "container_gpus": "all", "container_gpu_mode": "auto",
                                         "gpu_paths": paths})
    assert r["gpu_mode"] == "devices" and r["gpus"] is True, r
    got = r["gpu_paths"]
    assert got["nvidia_smi"] == str(smi) and got["driver_lib_dir"] == "/opt/driver/lib", got
    assert got["devices"] == sorted((f"/dev/{n}:/dev/{n}:rwm" for n in os.listdir("/dev")
                                     if n.startswith("nvidia") and (n[6:].isdigit() or n[6:] in (
                                         "ctl", "-uvm", "-uvm-tools", "-modeset"))),
                                    key=lambda d: (len(d.split(":")[0]), d))
    assert set(got["driver_libs"]) == {"mounts", "libraries", "stale", "missing"}
    runtime = adhoc("container_engine_probe", {"answer": dict(given, host_info={"Runtimes": {"nvidia": {}}}),
                                               "container_gpus": "all", "gpu_paths": paths})
    none = adhoc("container_engine_probe", {"answer": given, "container_gpus": "none", "gpu_paths": paths})
    assert "gpu_paths" not in runtime and "gpu_paths" not in none, (runtime, none)
