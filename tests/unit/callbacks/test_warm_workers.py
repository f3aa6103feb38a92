"""callback_plugins/warm_workers.py: the plugins a task needs are loaded once, in ansible-playbook's own process,
and the workers it forks per host and task inherit them instead of loading them again."""

import os
import subprocess
import sys

from helpers import BIN, REPO

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.debug: {msg: "{{ 'a' | probe_import }}"}
    - ansible.builtin.debug: {msg: "{{ 'b' | probe_import }}"}
    - ansible.builtin.debug: {msg: "{{ 'c' | probe_import }}"}
"""

# A filter file that notes the PID of every process that imports it.
FILTER = """
import os
with open(os.environ["PROBE_LOG"], "a") as f:
    f.write("%d\\n" % os.getpid())


def probe(value):
    # where the filter runs (a worker): how many objects sit in Python's permanent generation
    import gc
    with open(os.environ["PROBE_LOG"] + ".frozen", "a") as f:
        f.write("%d %d\\n" % (os.getpid(), gc.get_freeze_count()))
    return value


class FilterModule:
    def filters(self):
        return {"probe_import": probe}
"""


def run_playbook(tmp_path, **env_extra: str) -> tuple[subprocess.CompletedProcess, list[int], int]:
    (tmp_path / "filters").mkdir()
    (tmp_path / "filters/probe.py").write_text(FILTER)
    (tmp_path / "pb.yml").write_text(PLAYBOOK)
    log = tmp_path / "imports.log"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), PROBE_LOG=str(log),
               ANSIBLE_FILTER_PLUGINS=f"{REPO / 'filter_plugins'}:{tmp_path / 'filters'}",
               ANSIBLE_CALLBACK_PLUGINS=str(REPO / "callback_plugins"), **env_extra)
    proc = subprocess.Popen([str(BIN / "ansible-playbook"), "-i", "n1,n2,", "-c", "local",
                             "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "pb.yml")],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.communicate(timeout=180)[0]
    pids = [int(x) for x in log.read_text().split()] if log.exists() else []
    return subprocess.CompletedProcess(proc.args, proc.returncode, out), pids, proc.pid


def test_filters_load_once_in_the_playbook_process(tmp_path):
    done, pids, main_pid = run_playbook(tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    assert pids == [main_pid], f"filter file imported by {pids}, ansible-playbook is {main_pid}"


def test_switched_off_every_worker_loads_the_filters_again(tmp_path):
    # Ansible's own behaviour, the cost the callback removes: 3 tasks x 2 hosts, each worker imports the filter file.
    done, pids, main_pid = run_playbook(tmp_path, TRAINYARD_WARM_WORKERS="false")
    assert done.returncode == 0, done.stdout[-2000:]
    assert len(pids) == 6 and main_pid not in pids


def frozen_in_workers(tmp_path) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in line.split()) for line in (tmp_path / "imports.log.frozen").read_text().splitlines()]


def test_workers_start_with_the_heap_frozen(tmp_path):
    # Every worker is forked after the callback froze ansible-playbook's objects: its collector leaves them alone.
    done, _pids, main_pid = run_playbook(tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    seen = frozen_in_workers(tmp_path)
    assert len(seen) == 6 and all(pid != main_pid and n > 10000 for pid, n in seen), seen


def test_freeze_heap_off_leaves_the_heap_to_the_collector(tmp_path):
    done, _pids, _main_pid = run_playbook(tmp_path, TRAINYARD_FREEZE_HEAP="false")
    assert done.returncode == 0, done.stdout[-2000:]
    seen = frozen_in_workers(tmp_path)
    assert len(seen) == 6 and all(n == 0 for _pid, n in seen), seen
