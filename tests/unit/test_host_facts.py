"""library/host_facts.py run by the real `ansible` on this machine: the probe's answers, and the init-system fact
the later roles of a run read instead of probing again."""

from __future__ import annotations

import os
import sys

from conftest import adhoc


def test_probe_answers_and_publishes_the_init_system(tmp_path):
    r = adhoc("host_facts", {"paths": [str(tmp_path / "not" / "yet")]})
    assert not r.get("failed"), r
    assert r["python"]["executable"] == sys.executable
    assert r["paths"][0]["probed"] == str(tmp_path) and r["paths"][0]["exists"] is False
    init = r["ansible_facts"]["trainyard_init"]
    assert init["systemd"] is os.path.isdir("/run/systemd/system")
    assert init["pid1"] == open("/proc/1/comm").read().strip()


def test_clock_only_is_just_the_clock():
    r = adhoc("host_facts", {"clock_only": True})
    assert isinstance(r["time"], float) and "ansible_facts" not in r and "python" not in r
