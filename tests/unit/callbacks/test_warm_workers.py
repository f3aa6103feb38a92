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
    from ansible_collections.trainyard.core.plugins.plugin_utils import template_cache
    with open(os.environ["PROBE_LOG"] + ".frozen", "a") as f:
        f.write("%d %d\\n" % (os.getpid(), gc.get_freeze_count()))
    # and whether this task's template was compiled before the worker was forked
    compiled = sorted(k[0] for k in template_cache._cache if "probe_import" in k[0])
    with open(os.environ["PROBE_LOG"] + ".compiled", "a") as f:
        f.write("%d %s\\n" % (os.getpid(), "|".join(compiled)))
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


def compiled_in_workers(tmp_path) -> list[str]:
    return [line.split(" ", 1)[1] if " " in line else "" for line in
            (tmp_path / "imports.log.compiled").read_text().splitlines()]


def test_workers_inherit_the_tasks_templates_compiled(tmp_path):
    # The workers of the last task find every task's template compiled: ansible-playbook compiled each before it
    # forked that task's workers (a worker's own compiling would leave only its task's template in its copy).
    done, _pids, _main_pid = run_playbook(tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    seen = compiled_in_workers(tmp_path)
    assert len(seen) == 6, seen
    every = "|".join("{{ '%s' | probe_import }}" % letter for letter in "abc")
    assert seen[-2:] == [every, every], seen


def test_compiled_templates_off_leaves_compiling_to_each_worker(tmp_path):
    done, _pids, _main_pid = run_playbook(tmp_path, TRAINYARD_COMPILED_TEMPLATES="false")
    assert done.returncode == 0, done.stdout[-2000:]
    assert compiled_in_workers(tmp_path) == [""] * 6
