"""The fabricmanager role records every node that needs no step of its own in one task (issue 35: fewer tasks per node):
fabricmanager_check with 'nodes', run once, then meta end_role on those nodes. A real play over five local nodes runs
the role's read-only entry point (tasks/preflight.yml) and its main one's first step, and shows which nodes went on
to the per-node steps and what each node's records say."""

import json
import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi
from helpers import REPO, load

FMC = load("action_plugins/fabricmanager_check.py", "fabricmanager_check_once_test")

# n1: a VM whose NVSwitches the host manages, no systemd: nothing of its own. n2: its inventory says never. n3: no GPU
# facts in this run: it reads them itself. n4: NVSwitches on the node: it runs the fabric manager (the install path
# only). n5: the cluster role's probe kept never, over an inventory value of always (a play's value the inventory
# cannot show). n6: a fabric and systemd: the unit is read on the node.
def _inventory(vm, hgx):
    """The six nodes, their facts inline as a run's facts are (values, not templates)."""
    init, init_systemd = {"systemd": False, "pid1": "sh"}, {"systemd": True, "pid1": "systemd"}
    hosts = {
        "n1": {"nvidia_gpu_facts": vm, "trainyard_init": init},
        "n2": {"nvidia_gpu_facts": vm, "trainyard_init": init, "fabricmanager_required": "never"},
        "n3": {"trainyard_init": init},
        "n4": {"nvidia_gpu_facts": hgx, "trainyard_init": init},
        "n5": {"nvidia_gpu_facts": vm, "trainyard_init": init, "fabricmanager_required": "always",
               "__cluster_host": {"kept": {"fabricmanager_required": "never"}}},
        "n6": {"nvidia_gpu_facts": vm, "trainyard_init": init_systemd},
    }
    return {"all": {"hosts": hosts, "vars": {"ansible_connection": "local",
                                             "ansible_python_interpreter": sys.executable}}}


PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: The role's {entry}
      ansible.builtin.include_role:
        name: fabricmanager
        tasks_from: {entry}.yml
    - name: Show
      ansible.builtin.debug:
        msg: "RESULT {{{{ {{'host': inventory_hostname, 'own': __fabricmanager_once.own,
                          'records': preflight_results | default([]) | selectattr('check', 'match', 'fabricmanager')
                                     | map(attribute='host') | unique,
                          'status': preflight_results | default([]) | selectattr('check', 'match', 'fabricmanager')
                                    | items2dict('check', 'status')}} | to_json }}}}"
"""


def _facts(local):
    facts = nvidia_smi.parse_query_xml((REPO / "tests/data/nvidia-smi/h200x4/nvidia-smi-q.xml").read_text())
    facts["nvswitch"] = {"present": True, "local": local, "devices": ["0000:05:00.0"] if local else []}
    return facts


# The project's plugins without its callbacks (the records callback among them).
NO_CALLBACK_CFG = """[defaults]
library = {repo}/library
action_plugins = {repo}/action_plugins
filter_plugins = {repo}/filter_plugins
roles_path = {repo}/roles
collections_path = {repo}/collections:~/.ansible/collections
"""


def _run(tmp_path, entry, callback=True):
    (tmp_path / "inventory.json").write_text(json.dumps(_inventory(_facts(False), _facts(True))))
    (tmp_path / "pb.yml").write_text(PLAYBOOK.format(entry=entry))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    if not callback:
        (tmp_path / "ansible.cfg").write_text(NO_CALLBACK_CFG.format(repo=REPO))
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        env.update(ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    # This machine has no nvidia-smi: a node's own read fails, as on a node without the driver (its records say so).
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i",
                        str(tmp_path / "inventory.json"), "-e", "fabricmanager_install=false", str(tmp_path / "pb.yml")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    hosts, per_node = {}, set()
    task = ""
    for ln in r.stdout.splitlines():
        if ln.startswith("TASK ["):
            task = ln
        elif "Read the GPU facts (when not read yet)" in task and ln.split(":")[0] in ("ok", "changed", "failed"):
            per_node.add(ln.split("[", 1)[1].split("]", 1)[0])
        if "RESULT " in ln:
            got = json.loads(json.loads("{" + ln.strip().rstrip(",") + "}")["msg"][len("RESULT "):])
            hosts[got.pop("host")] = got
    assert r.returncode == 0 and len(hosts) == 6, r.stdout[-4000:]
    return hosts, per_node


@pytest.mark.parametrize("entry, own", [("preflight", {"n3", "n6"}), ("main", {"n3", "n4", "n6"})])
def test_one_task_records_the_nodes_that_need_nothing_of_their_own_and_the_others_go_on(tmp_path, entry, own):
    hosts, per_node = _run(tmp_path, entry)
    assert set(hosts["n1"]["own"]) == own and hosts["n1"]["own"] == hosts["n6"]["own"]
    assert per_node == own  # only these ran the per-node read; the others left the role after the one task
    for host, got in hosts.items():
        assert got["records"] == [host], (host, got)  # every node its own records, named by it
        assert set(got["status"]) == {"fabricmanager." + c for c in ("nvswitch", "version", "service", "fabric",
                                                                     "nvlink")}, (host, got)
    assert hosts["n1"]["status"]["fabricmanager.fabric"] == "pass"
    assert hosts["n1"]["status"]["fabricmanager.service"] == "skip"  # no systemd: not verifiable
    assert set(hosts["n2"]["status"].values()) == {"skip"}  # its own never, not the play's auto
    assert set(hosts["n5"]["status"].values()) == {"skip"}  # the probe's kept value over the inventory's
    assert set(hosts["n3"]["status"].values()) == {"skip"}  # its own read found no nvidia-smi


def test_without_the_records_callback_every_node_takes_its_own_steps(tmp_path):
    """Records for other nodes need the records callback: without it the one task records nothing and every node
    goes on to the per-node steps, which record its own checks as before."""
    hosts, per_node = _run(tmp_path, "preflight", callback=False)
    assert per_node == set(hosts) and set(hosts["n1"]["own"]) == set(hosts)
    assert hosts["n1"]["status"]["fabricmanager.fabric"] == "pass" and set(hosts["n2"]["status"].values()) == {"skip"}


@pytest.mark.parametrize("args, says", [
    ({"nodes": "n1"}, "'nodes' must be the play's hosts"),
    ({"nodes": ["n1", "n2"], "kept": [{}]}, "'kept' must list what the cluster role's probe kept of each node"),
    ({"nodes": ["n1"], "kept": "__cluster_host"}, "'kept' must list"),
])
def test_nodes_and_kept_of_another_shape_say_what_to_give(args, says):
    with pytest.raises(AnsibleActionFail) as err:
        object.__new__(FMC.ActionModule).decide(args, {"inventory_hostname": "n1"})
    assert says in str(err.value) and "\n" not in str(err.value)
