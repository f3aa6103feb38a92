"""The cluster model: node rank, nnodes, world size, head and master address, computed in one place."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from ansible_collections.trainyard.core.plugins.plugin_utils import cluster_model as cm


def hv(n: int, **extra) -> tuple[list[str], dict]:
    hosts = [f"n{i}" for i in range(1, n + 1)]
    return hosts, {h: {"ansible_host": f"198.51.100.{10 + i}", **extra.get(h, {})} for i, h in enumerate(hosts, 1)}


def test_inventory_order_without_node_rank():
    hosts, vars_ = hv(3)
    models = cm.compute_models(hosts, vars_, {"cluster_gpus_per_node": 8, "cluster_rendezvous_port": 39500})
    assert [models[h]["node_rank"] for h in hosts] == [0, 1, 2]
    m = models["n2"]
    assert m == {"node_rank": 1, "nnodes": 3, "nproc_per_node": 8, "world_size": 24, "head": "n1",
                 "master_addr": "198.51.100.11", "master_port": 39500, "hosts_by_rank": ["n1", "n2", "n3"],
                 "data_address": "198.51.100.12"}


def test_node_rank_reorders_and_head_is_rank_zero():
    hosts, vars_ = hv(3, n1={"node_rank": 2}, n2={"node_rank": 0}, n3={"node_rank": 1, "data_address": "172.30.0.3"})
    models = cm.compute_models(hosts, vars_, {"cluster_gpus_per_node": 8})
    assert models["n1"]["hosts_by_rank"] == ["n2", "n3", "n1"]
    assert models["n1"]["head"] == "n2" and models["n3"]["master_addr"] == "198.51.100.12"
    assert models["n3"]["data_address"] == "172.30.0.3"


def test_nproc_defaults_to_gpus_and_overrides_for_cpu_clusters():
    hosts, vars_ = hv(2)
    assert cm.compute_models(hosts, vars_, {"cluster_gpus_per_node": 4,
                                            "cluster_nproc_per_node": "{{ cluster_gpus_per_node }}"})["n1"][
        "world_size"] == 8
    for h in hosts:
        vars_[h].update(cluster_gpus_per_node=0, cluster_nproc_per_node=1)
    m = cm.compute_models(hosts, vars_, {})["n2"]
    assert (m["nproc_per_node"], m["world_size"]) == (1, 2)


def test_explicit_master_addr_and_port():
    hosts, vars_ = hv(2)
    for h in hosts:
        vars_[h].update(cluster_master_addr="198.51.100.11", cluster_rendezvous_port=29400)
    m = cm.compute_models(hosts, vars_, {})["n2"]
    assert (m["master_addr"], m["master_port"]) == ("198.51.100.11", 29400)


def test_data_address_falls_back_to_ansible_host_then_name():
    assert cm.data_address("x", {"data_address": " 10.1.1.1 ", "ansible_host": "10.2.2.2"}) == "10.1.1.1"
    assert cm.data_address("x", {"ansible_host": "10.2.2.2"}) == "10.2.2.2"
    assert cm.data_address("x", {}) == "x"


@given(st.permutations(list(range(6))))
def test_any_permutation_of_ranks_is_honoured(perm):
    hosts = [f"h{i}" for i in range(6)]
    vars_ = {h: {"node_rank": r, "ansible_host": f"198.51.100.{i + 1}"} for i, (h, r) in enumerate(zip(hosts, perm))}
    assert cm.validate({"trainers": hosts}, vars_, defaults={}) == []
    models = cm.compute_models(hosts, vars_, {"cluster_gpus_per_node": 8})
    assert sorted(m["node_rank"] for m in models.values()) == list(range(6))
    for h, r in zip(hosts, perm):
        assert models[h]["node_rank"] == r and models[h]["hosts_by_rank"][r] == h
        assert models[h]["world_size"] == 48


@pytest.mark.parametrize("text,ok", [("10.0.0.1", True), ("fd00::1", True), ("node-1.example.org", True),
                                     ("10.0.0.300", False), ("0.0.0.0", False), ("bad host", False), ("", False),
                                     ("224.0.0.1", False), ("-x", False)])
def test_address_problem(text, ok):
    assert (cm.address_problem(text) is None) is ok


def test_validation_refuses_every_interface_the_nodes_never_pick():
    """One deny list (module_utils/netcheck.py): what the node side never picks, the validation play refuses."""
    from ansible_collections.trainyard.core.plugins.module_utils import netcheck as nc

    names = list(nc.EXCLUDED_EXACT) + [prefix + "0" for prefix in nc.EXCLUDED_PREFIXES]
    assert "nodelocaldns0" in names and "vnet0" in names
    for name in names:
        assert nc.excluded_reason(name) and cm.bad_iface(name), name
    assert cm.bad_iface("ens5") is None and nc.excluded_reason("ens5") is None


def test_a_problem_names_at_most_eight_hosts_and_counts_the_rest():
    hosts = [f"n{i}" for i in range(20)]
    assert cm.hosts_named(hosts[:3]) == "n0, n1, n2"
    assert cm.hosts_named(hosts) == "n0, n1, n2, n3, n4, n5, n6, n7 and 12 more"
    p = cm.Problem("x is wrong", "set x", hosts=hosts[:10])
    assert p.line(hosts) == "Stop if x is wrong on n0, n1, n2, n3, n4, n5, n6, n7 and 2 more. Fix: set x"
    every = cm.Problem("x is wrong", "set x", hosts=hosts).line(hosts)
    assert every == "Stop if x is wrong on all 20 trainers. Fix: set x"


# --------------------------------------------------------------------------- the nodes site.yml's install play runs on
INSTALL_DEFAULTS = {"nvidia_driver_install": True, "container_enabled": True, "container_engine_install": True,
                    "container_image": "registry.example/train:1"}
NOTHING_TO_INSTALL = {"nvidia_driver_install": False, "container_engine_install": False}


def test_install_nodes_takes_each_nodes_own_value_else_the_default():
    hosts = ["n1", "n2", "n3"]
    own = {"n1": dict(NOTHING_TO_INSTALL), "n2": {"nvidia_driver_install": False}, "n3": {}}
    assert cm.install_nodes(hosts, own, INSTALL_DEFAULTS) == ["n2", "n3"]
    assert cm.install_nodes(hosts, {h: dict(NOTHING_TO_INSTALL) for h in hosts}, INSTALL_DEFAULTS) == []


@pytest.mark.parametrize("own, installs", [
    ({"nvidia_driver_install": "true", "container_engine_install": False}, True),   # a string from -e or an ini file
    ({"nvidia_driver_install": "False", "container_engine_install": "no"}, False),
    ({"nvidia_driver_install": False, "container_engine_install": True, "container_enabled": False}, False),
    ({"nvidia_driver_install": False, "container_engine_install": True, "container_image": "  "}, False),
    ({"nvidia_driver_install": False, "container_engine_install": True}, True),
    ({"nvidia_driver_install": "{{ lookup('env', 'INSTALL') }}", "container_engine_install": False}, True),
])
def test_install_nodes_reads_each_option_as_the_role_does(own, installs):
    assert cm.install_nodes(["n1"], {"n1": own}, INSTALL_DEFAULTS) == (["n1"] if installs else [])


def test_install_nodes_counts_in_a_node_whose_value_the_controller_could_not_read():
    own = {"n1": dict(NOTHING_TO_INSTALL), "n2": dict(NOTHING_TO_INSTALL)}
    assert cm.install_nodes(["n1", "n2"], own, INSTALL_DEFAULTS, unread={"n2": {"container_engine_install"}}) == ["n2"]
    # A name the install does not read leaves the node out.
    assert cm.install_nodes(["n1", "n2"], own, INSTALL_DEFAULTS, unread={"n2": {"network_mtu"}}) == []
