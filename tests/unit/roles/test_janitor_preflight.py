"""roles/janitor: its options (janitor_mode against the node's init system) are checked by the role's first task
(action janitor_check) before it changes anything, with no task of their own: the cluster role's host probe's answer
where it ran, else the action's own read of /run/systemd/system; janitor_mode=systemd on a node without systemd is
refused, naming the node and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import BIN, REPO

CHECK = "janitor : Create the janitor's user, copy its script"


def play(tmp_path: Path, janitor_mode: str, init: dict | None) -> tuple[int, list]:
    # A host variable, as the cluster role's host probe publishes it (plugin_utils/check_records.py, publish).
    pre = [{"ansible.builtin.set_fact": {"trainyard_init": init}, "tags": ["always"]}] \
        if init is not None else []
    (tmp_path / "play.yml").write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        "vars": {"janitor_mode": janitor_mode, "cluster_output_root": str(tmp_path / "out"),
                 "cluster_state_dir": str(tmp_path / "state")},
        "tasks": pre + [{"ansible.builtin.import_role": {"name": "trainyard_defaults"}},
                        {"ansible.builtin.import_role": {"name": "janitor", "rolespec_validate": False}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_ROLES_PATH=str(REPO / "roles"))
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "--check",
                        "--tags", "janitor_preflight,always", "-e", f"ansible_python_interpreter={sys.executable}",
                        str(tmp_path / "play.yml")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index("{"):])
    return p.returncode, [(t["task"]["name"], t["hosts"]["localhost"]) for t in out["plays"][0]["tasks"]]


def mine(tasks: list) -> list:
    return [(n, r) for n, r in tasks if n.startswith("janitor : ")]


def test_no_task_of_their_own_where_the_host_probe_answered(tmp_path: Path):
    rc, tasks = play(tmp_path, "auto", {"systemd": True, "nvidiactl": False})
    (name, r), = mine(tasks)
    assert rc == 0 and name.startswith(CHECK) and not r.get("failed"), tasks
    assert r["mode"] == "systemd" and r["systemd"] is True, r
    rc, tasks = play(tmp_path, "auto", {"systemd": False, "nvidiactl": False})
    assert rc == 0 and mine(tasks)[0][1]["mode"] == "sidecar", tasks


def test_without_the_host_probe_the_task_reads_the_init_system_itself(tmp_path: Path):
    rc, tasks = play(tmp_path, "auto", None)
    (name, r), = mine(tasks)
    here = os.path.isdir("/run/systemd/system")
    assert rc == 0 and r["systemd"] is here and r["mode"] == ("systemd" if here else "sidecar"), r


def test_systemd_asked_for_on_a_node_without_it_is_refused_before_anything(tmp_path: Path):
    rc, tasks = play(tmp_path, "systemd", {"systemd": False, "nvidiactl": False})
    failed = [(n, r) for n, r in tasks if r.get("failed")]
    assert rc != 0 and len(failed) == 1 and failed[0][0].startswith(CHECK), tasks
    r = failed[0][1]
    assert "localhost: janitor_mode=systemd but systemd is not PID 1 here" in r["msg"], r
    assert "set janitor_mode=auto or sidecar" in r["msg"] and "files" not in r and "user" not in r, r
