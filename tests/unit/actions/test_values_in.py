"""The actions that compare the nodes take values, never a variable's name (docs/architecture.md 'Where code goes'):
nvidia_driver_check, host_basics and nccl_env_validate refuse a name where a value goes with one line that says what to pass, and their
once-per-play calls build what the per-node calls compare from the values given."""

import pytest
from ansible.errors import AnsibleActionFail

from helpers import facts_of, load

NDC = load("action_plugins/nvidia_driver_check.py", "nvidia_driver_check_action")
HB = load("action_plugins/host_basics.py", "host_basics_action")


def decide(mod, args):
    """The action's decide() on args, without a play: these paths read no task variable."""
    return object.__new__(mod.ActionModule).decide(args, {"inventory_hostname": "n1"})


PEERS_OF = {"hosts": ["n1"], "facts": [None], "visible": [""]}


@pytest.mark.parametrize("args", [{"peers_of": PEERS_OF, "nodes": ["n1"], "results": "__nvidia_driver_gpu"},
                                  {"peers_of": PEERS_OF, "nodes": "ansible_play_hosts", "results": [{}]},
                                  {"peers_of": PEERS_OF, "nodes": ["n1"], "results": ["__nvidia_driver_gpu"]}])
def test_nvidia_driver_check_refuses_a_name_where_the_value_goes(args):
    with pytest.raises(AnsibleActionFail) as err:
        decide(NDC, args)
    assert "as values" in str(err.value) and "\n" not in str(err.value)


def test_nvidia_driver_check_peers_of_takes_every_nodes_facts_once():
    a, b = facts_of(), facts_of()
    b["gpus"] = [dict(g, uuid=g["uuid"][:-1] + "x") for g in b["gpus"]]
    assert NDC.peers_of({"hosts": ["n1", "n2", "n3"], "facts": [a, b, None], "visible": ["", "", ""]}) == {
        "n1": {"driver": a["driver_version"], "uuids": []}, "n2": {"driver": b["driver_version"], "uuids": []},
        "n3": None}


@pytest.mark.parametrize("arg, why", [
    ("__nvidia_driver_gpu", "must be a dict of three lists"),
    ({"hosts": ["n1", "n2"], "facts": [None], "visible": ["", ""]}, "different lengths (2, 1, 2)"),
    ({"hosts": ["n1"], "facts": ["__x"], "visible": [""]}, "(a dict) or None"),
])
def test_nvidia_driver_check_peers_of_refuses_bad_shapes(arg, why):
    with pytest.raises(AnsibleActionFail, match=r".*" + why.replace("(", r"\(").replace(")", r"\)")):
        decide(NDC, {"peers_of": arg})


def test_host_basics_takes_the_nodes_and_their_probes_as_values():
    with pytest.raises(AnsibleActionFail, match=r"'nodes' must be the list of the nodes to record"):
        decide(HB, {"nodes": "ansible_play_hosts", "probes": []})
    with pytest.raises(AnsibleActionFail, match=r"'probes' must be each node's registered host_facts result, one per"):
        decide(HB, {"nodes": ["n1", "n2"], "probes": "__cluster_host"})
    with pytest.raises(AnsibleActionFail, match=r"n1 has no probe result with the options it kept"):
        decide(HB, {"nodes": ["n1", "n2"], "probes": [{"kept": {}}, {"failed": True}]})  # n1 kept nothing


def test_nccl_env_validate_compare_takes_each_hosts_results_as_values():
    nev = load("action_plugins/nccl_env_validate.py", "nccl_env_validate_action")
    with pytest.raises(AnsibleActionFail, match=r"needs validated, write, plugin: one registered result per host"):
        decide(nev, {"compare": {"hosts": ["n1", "n2"]}})
    with pytest.raises(AnsibleActionFail, match=r"needs plugin: .* \(2\)"):
        decide(nev, {"compare": {"hosts": ["n1", "n2"], "validated": [{}, {}], "write": [{}, {}], "plugin": [{}]}})
    out = decide(nev, {"compare": {"hosts": ["n1", "n2"], "validated": [{}, None], "write": [{}, {}],
                                   "plugin": [{}, {}]}})
    assert set(out["records"]) == {"n1", "n2"}
