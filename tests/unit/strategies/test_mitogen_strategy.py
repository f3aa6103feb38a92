"""The opt-in strategy strategy_plugins/mitogen_linear.py runs a real play through Mitogen, and says how to fix a
controller without the package instead of a traceback."""

import os
import re
import subprocess
import sys

from helpers import BIN, REPO

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Run a command on the node
      ansible.builtin.command:
        argv: [echo, through-mitogen]
      register: out
      changed_when: false
    - name: Show its output
      ansible.builtin.debug:
        msg: "{{ out.stdout }}"
"""


def run_play(tmp_path, **env_extra):
    (tmp_path / "play.yml").write_text(PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STRATEGY="mitogen_linear",
               ANSIBLE_NOCOLOR="1", **env_extra)
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def test_a_play_runs_under_mitogen(tmp_path):
    r = run_play(tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert re.search(r"localhost +: ok=2 +changed=0 +unreachable=0 +failed=0", r.stdout), r.stdout[-2000:]
    assert '"msg": "through-mitogen"' in r.stdout, r.stdout[-2000:]
    # The strategy that ran is Mitogen's: ansible-core names the third-party strategy in its deprecation warning.
    assert "strategy plugins not included in ansible.builtin" in r.stderr.replace("\n", " "), r.stderr[-2000:]


def test_a_controller_without_mitogen_gets_the_fix(tmp_path):
    # An empty package named ansible_mitogen first on the path stands for a Python without the pinned package.
    shadow = tmp_path / "shadow"
    (shadow / "ansible_mitogen").mkdir(parents=True)
    (shadow / "ansible_mitogen" / "__init__.py").write_text("")
    r = run_play(tmp_path, PYTHONPATH=str(shadow))
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "ANSIBLE_STRATEGY=mitogen_linear needs the mitogen package" in out and "make venv" in out, out[-2000:]
    assert "Traceback" not in out
