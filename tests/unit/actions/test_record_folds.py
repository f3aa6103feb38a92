"""A role's last step records its checks and hands on what the roles after it read in the same task (issue 35: fewer
tasks per node): preflight_check's 'publish' sets facts with the records (the janitor's janitor_sidecar), and
nvidia_driver_check's 'records' records the burn-in's record with the node's GPU checks. Each runs in a real play."""

import json
import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi
from helpers import REPO, load

PC = load("action_plugins/preflight_check.py", "preflight_check_folds_test")
NDC = load("action_plugins/nvidia_driver_check.py", "nvidia_driver_check_folds_test")

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Record and publish
      preflight_check:
        records: [{check: janitor.dry_run, ok: true, detail: found}]
        publish: {janitor_sidecar: {name: janitor, argv: [python3, janitor.py, --loop]}}
    - name: Record the GPU checks of every node with each one's burn-in record, once
      nvidia_driver_check:
        peers_of: {hosts: "{{ ansible_play_hosts }}", facts: "{{ ansible_play_hosts | map('extract', _facts) | list }}",
                   visible: "{{ ansible_play_hosts | map('extract', _visible) | list }}"}
        nodes: "{{ ansible_play_hosts }}"
        results: "{{ ansible_play_hosts | map('extract', _results) | list }}"
      run_once: true
      vars:
        _facts: {n1: null, n2: "{{ _h200 }}"}
        _visible: {n1: "", n2: ""}
        _results:
          n1: {failed: true, msg: nvidia-smi not found, kept: {health: false},
               burnin_record: {check: nvidia_driver.burnin, status: skip, detail: quick tier, fix: ""}}
          n2: {nvidia_gpu_facts: "{{ _h200 }}", machine_id: m2,
               kept: {health: false, gpus_per_node: 4, nproc_per_node: 4, version: "570.2"}}
    - name: Show
      ansible.builtin.debug:
        msg: >-
          RESULT {{ {'host': inventory_hostname, 'records': preflight_results, 'sidecar': janitor_sidecar | default(none),
                     'gpu': nvidia_gpu_facts, 'identity': nvidia_gpu_identity} | to_json }}
"""


def _play(tmp_path):
    pb = tmp_path / "pb.yml"
    pb.write_text(PLAYBOOK)
    # A real H200 x4 node's nvidia-smi -q -x (tests/data), parsed as the module parses it.
    facts = nvidia_smi.parse_query_xml((REPO / "tests/data/nvidia-smi/h200x4/nvidia-smi-q.xml").read_text())
    (tmp_path / "h200.json").write_text(json.dumps({"_h200": facts}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "n1,n2,", "-c", "local",
                          "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'h200.json'}", str(pb)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120).stdout
    hosts = {}
    for ln in out.splitlines():
        if "RESULT " in ln:
            got = json.loads(json.loads("{" + ln.strip().rstrip(",") + "}")["msg"][len("RESULT "):])
            hosts[got.pop("host")] = got
    assert hosts, out[-3000:]
    return hosts


def test_one_record_task_publishes_the_fact_and_the_burnin_record(tmp_path):
    got = _play(tmp_path)["n1"]
    assert got["sidecar"] == {"name": "janitor", "argv": ["python3", "janitor.py", "--loop"]}
    checks = [r["check"] for r in got["records"]]
    assert checks[0] == "janitor.dry_run" and checks[-1] == "nvidia_driver.burnin"
    assert any(c.startswith("nvidia_driver.") and c != "nvidia_driver.burnin" for c in checks)
    burnin = [r for r in got["records"] if r["check"] == "nvidia_driver.burnin"]
    assert len(burnin) == 1 and burnin[0]["status"] == "skip" and burnin[0]["host"] == "n1"


def test_the_gpu_record_task_runs_once_and_gives_each_node_its_own_records_and_facts(tmp_path):
    got = _play(tmp_path)
    assert set(got) == {"n1", "n2"}
    assert got["n1"]["gpu"] is None and got["n2"]["gpu"]["driver_version"].startswith("5")
    assert got["n2"]["identity"] is not None and got["n2"]["identity"] != got["n1"]["identity"]
    for host in ("n1", "n2"):
        assert {r["host"] for r in got[host]["records"]} == {host}
    status = {r["check"]: r for r in got["n2"]["records"]}
    # n2's own kept options (version 570.2 pinned there) decide its records, not the node that ran the task.
    assert status["nvidia_driver.version"]["status"] == "fail" and "570.2" in status["nvidia_driver.version"]["detail"]
    assert len(status["nvidia_driver.gpu_map"]["data"]["gpu_map"]) == 4
    assert status["nvidia_driver.smi"]["status"] == "pass"
    assert {r["check"]: r["status"] for r in got["n1"]["records"]}["nvidia_driver.smi"] == "fail"
    assert not any(r["check"] == "nvidia_driver.burnin" for r in got["n2"]["records"])


@pytest.mark.parametrize("publish", ["janitor_sidecar", {"preflight_results": []}, {"": 1}])
def test_publish_refuses_a_name_or_the_records_fact_in_one_line(publish):
    with pytest.raises(AnsibleActionFail) as err:
        PC.ActionModule._publish(publish)
    assert "'publish' must map fact names to values" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("args", [
    {"nodes": ["n1"], "results": "__nvidia_driver_gpu"},
    {"nodes": ["n1", "n2"], "results": [{}]},
    {"results": [{}]},
])
def test_nvidia_driver_check_refuses_results_given_by_name_or_of_another_length(args):
    peers = {"peers_of": {"hosts": ["n1"], "facts": [None], "visible": [""]}}
    with pytest.raises(AnsibleActionFail) as err:
        object.__new__(NDC.ActionModule).decide(dict(peers, **args), {"inventory_hostname": "n1"})
    assert "give 'nodes'" in str(err.value) and "\n" not in str(err.value)


def test_the_gpu_facts_call_runs_the_burnin_tier_and_returns_its_record_also_when_nvidia_smi_fails():
    from helpers import adhoc
    r = adhoc("nvidia_gpu_facts", {"burnin": "quick", "nvidia_smi": "/nonexistent/nvidia-smi", "nvlink": False})
    assert r["failed"]
    assert r["burnin_record"]["check"] == "nvidia_driver.burnin" and r["burnin_record"]["status"] == "skip"
    ok = adhoc("nvidia_gpu_facts", {"nvidia_smi": "/nonexistent/nvidia-smi", "nvlink": False})
    assert "burnin_record" not in ok


NO_CALLBACK_CFG = """[defaults]
library = {repo}/library
action_plugins = {repo}/action_plugins
filter_plugins = {repo}/filter_plugins
collections_path = {repo}/collections:~/.ansible/collections
"""

ONE_NODE = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Record the GPU checks of one node, once, without the records callback
      nvidia_driver_check:
        peers_of: {hosts: [n1], facts: ["{{ _h200 }}"], visible: [""]}
        nodes: [n1]
        results: [{nvidia_gpu_facts: "{{ _h200 }}", kept: {health: false, gpus_per_node: 4, nproc_per_node: 4}}]
      run_once: true
    - name: Show
      ansible.builtin.debug:
        msg: "RESULT {{ {'host': inventory_hostname, 'gpus': ansible_facts.nvidia_gpu_facts.gpus | length,
                         'records': ansible_facts.preflight_results | map(attribute='host') | unique} | to_json }}"
"""


@pytest.mark.parametrize("hosts, ok", [("n1,", True), ("n1,n2,", False)])
def test_without_the_records_callback_one_node_gets_its_facts_and_more_nodes_a_message(tmp_path, hosts, ok):
    """An ansible.cfg without the project's callback_plugins: one node's own records and GPU facts are facts, as such a
    run reads them; records for other nodes stop the task with the fix."""
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(NO_CALLBACK_CFG.format(repo=REPO))
    play = ONE_NODE if ok else ONE_NODE.replace("nodes: [n1]", "nodes: [n1, n2]").replace(
        "results: [{", "results: [{}, {").replace("hosts: [n1], facts: [", "hosts: [n1, n2], facts: [null, ").replace(
        'visible: [""]', 'visible: ["", ""]')
    (tmp_path / "pb.yml").write_text(play)
    facts = nvidia_smi.parse_query_xml((REPO / "tests/data/nvidia-smi/h200x4/nvidia-smi-q.xml").read_text())
    (tmp_path / "h200.json").write_text(json.dumps({"_h200": facts}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(cfg), ANSIBLE_NOCOLOR="1")
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", hosts, "-c", "local",
                        "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'h200.json'}",
                        str(tmp_path / "pb.yml")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    if ok:
        line = next(ln for ln in r.stdout.splitlines() if "RESULT " in ln)
        got = json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"][len("RESULT "):])
        assert got == {"host": "n1", "gpus": 4, "records": ["n1"]}, r.stdout[-2000:]
    else:
        assert r.returncode != 0
        assert "kept by the callback preflight_records, which this run does not load" in r.stdout, r.stdout[-2000:]

