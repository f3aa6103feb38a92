"""The janitor's systemd units, rendered by the role's real templates with paths that shell quoting gets wrong
for systemd (``%``, ``$``, spaces, quotes), pass ``systemd-analyze verify``; the filters escape per systemd.unit(5)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from helpers import REPO, adhoc, load

su = load("filter_plugins/systemd_unit.py", "systemd_unit")

ROOT = '/srv/out 100%z "done"; $HOME %h'
STATE = "/var/lib/trainyard %i %z"


def render(tmp_path, unit):
    cmd = ["/usr/bin/python3", f"{STATE}/train/janitor.py", "--config", f"{STATE}/train/janitor.json"]
    extra = {"cluster_job_name": "train", "janitor_root": ROOT, "janitor_interval": 60, "janitor_user": "trainyard-janitor",
             "_janitor_cmd": cmd, "_janitor_argv": cmd + ["--root", ROOT]}
    dest = tmp_path / f"trainyard-janitor-train.{unit}"
    r = adhoc("ansible.builtin.template", {"src": str(REPO / f"roles/janitor/templates/janitor.{unit}.j2"),
                                           "dest": str(dest)}, "-e", json.dumps(extra))
    assert not r.get("failed"), r
    return dest


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_rendered_units_pass_systemd_analyze_verify_with_hostile_paths(tmp_path):
    service, timer = render(tmp_path, "service"), render(tmp_path, "timer")
    r = subprocess.run(["systemd-analyze", "verify", str(service), str(timer)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trainyard-janitor-train" not in r.stderr, r.stderr  # no complaint about our units at all
    text = service.read_text()
    assert "User=trainyard-janitor" in text and "ReadWritePaths=" in text
    assert ROOT not in text.split("ExecStart=")[1]  # the output root travels in the config file, not here


def test_exec_args_are_quoted_and_specifiers_escaped():
    assert su.systemd_exec(["/usr/bin/python3", "/a b/%i/$X", 'q"\\']) == \
        '"/usr/bin/python3" "/a b/%%i/$$X" "q\\"\\\\"'
    assert su.systemd_path("/srv/out 100%") == '"/srv/out 100%%"'
    assert su.systemd_text("job 5%") == "job 5%%"


@pytest.mark.parametrize("bad", ["/srv/a\nExecStartPre=/bin/sh", "/srv/\x7f"])
def test_control_characters_are_refused_with_the_value_named(bad):
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="control character"):
        su.systemd_exec(["/usr/bin/python3", bad])
    with pytest.raises(AnsibleFilterError, match="control character"):
        su.systemd_path(bad)
