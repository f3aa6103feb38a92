"""roles/janitor: its option checks (the systemd read and "Stop if systemd was asked for on a node without it") sit
behind one include with their shared condition: skipped as one task where the cluster role's host probe answered and
janitor_mode is not systemd, and still refusing janitor_mode=systemd on a node without systemd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import BIN, REPO


def play(tmp_path: Path, janitor_mode: str, init: dict | None) -> tuple[int, list]:
    # A host variable, as the cluster role's host probe publishes it (plugin_utils/check_records.py, publish).
    pre = [{"ansible.builtin.set_fact": {"trainyard_init": init}, "tags": ["always"]}] \
        if init is not None else []
    (tmp_path / "play.yml").write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False, "vars": {"janitor_mode": janitor_mode},
        "tasks": pre + [{"ansible.builtin.import_role": {"name": "janitor", "rolespec_validate": False}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_ROLES_PATH=str(REPO / "roles"))
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "--check",
                        "--tags", "janitor_preflight,always", "-e", f"ansible_python_interpreter={sys.executable}",
                        str(tmp_path / "play.yml")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index("{"):])
    return p.returncode, [(t["task"]["name"], t["hosts"]["localhost"]) for t in out["plays"][0]["tasks"]]


def test_one_skipped_task_where_the_host_probe_answered(tmp_path: Path):
    rc, tasks = play(tmp_path, "auto", {"systemd": True, "nvidiactl": False})
    mine = [(n, r) for n, r in tasks if "set_fact" not in n and r.get("action") != "ansible.builtin.set_fact"]
    assert rc == 0 and [n for n, _ in mine] == ["janitor : Check the janitor's options"], tasks
    assert mine[0][1].get("skipped"), mine


def test_systemd_asked_for_on_a_node_without_it_is_refused(tmp_path: Path):
    rc, tasks = play(tmp_path, "systemd", {"systemd": False, "nvidiactl": False})
    failed = [(n, r) for n, r in tasks if r.get("failed")]
    assert rc != 0 and len(failed) == 1, tasks
    assert failed[0][0].endswith("Stop if systemd was asked for on a node without it"), failed
    assert "janitor_mode=systemd but systemd is not PID 1 here" in failed[0][1]["msg"], failed
