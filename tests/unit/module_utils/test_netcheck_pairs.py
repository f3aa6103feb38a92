"""Which pairs prove the path MTU (module_utils/netcheck.py path_pairs): a full mesh up to
network_path_mtu_full_mesh_max nodes, above it a ring, seeded random rings and one pair per data subnet pair."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from ansible_collections.trainyard.core.plugins.module_utils import netcheck as nc


def undirected(plan):
    return {tuple(sorted((s, d))) for s, peers in plan["probes"].items() for d in peers}


def degree(plan, host):
    return len(plan["probes"][host]) + sum(host in peers for peers in plan["probes"].values())


def hosts(n):
    return [f"node{i:04d}" for i in range(1, n + 1)]


def test_full_mesh_up_to_the_limit():
    plan = nc.path_pairs(hosts(16), full_mesh_max=16)
    assert plan["scheme"] == nc.FULL_MESH
    assert all(len(peers) == 15 for peers in plan["probes"].values())
    assert plan["pairs"] == plan["full_mesh_pairs"] == 120
    assert nc.coverage_text(plan) == "full mesh: 120 of 120 node pairs, each from both ends"


def test_above_the_limit_a_ring_and_samples_bounded_per_node():
    plan = nc.path_pairs(hosts(17), full_mesh_max=16, samples=2, seed=0)
    assert plan["scheme"] == nc.SAMPLED
    assert plan["full_mesh_pairs"] == 136 and plan["pairs"] <= 17 * 3
    names = hosts(17)
    # The ring in host order is always there.
    pairs = undirected(plan)
    assert all(tuple(sorted((names[i], names[(i + 1) % 17]))) in pairs for i in range(17))
    text = nc.coverage_text(plan, "node0001")
    assert text.startswith("ring + 2 seeded random rings (seed 0) + one pair per data subnet pair (0): ")
    assert f"{plan['pairs']} of 136 node pairs" in text and "this node probes" in text


def test_same_hosts_and_seed_give_the_same_pairs_another_seed_others():
    a = nc.path_pairs(hosts(64), full_mesh_max=16, samples=2, seed=7)
    b = nc.path_pairs(hosts(64), full_mesh_max=16, samples=2, seed=7)
    c = nc.path_pairs(hosts(64), full_mesh_max=16, samples=2, seed=8)
    assert a == b and undirected(a) != undirected(c)


def test_every_subnet_pair_gets_a_representative():
    names = hosts(40)
    subnets = {h: f"10.{i % 4}.0.0/24" for i, h in enumerate(names)}
    plan = nc.path_pairs(names, subnets, full_mesh_max=16, samples=0)
    assert plan["subnet_pairs_total"] == 10  # 4 within + 6 across
    pairs = undirected(plan)
    for a in set(subnets.values()):
        for b in set(subnets.values()):
            assert any(subnets[x] == a and subnets[y] == b or subnets[x] == b and subnets[y] == a for x, y in pairs)


def test_a_lone_subnet_of_one_node_needs_no_pair_within():
    names = hosts(20)
    subnets = {h: "10.0.0.0/24" for h in names}
    subnets[names[-1]] = "10.9.0.0/24"
    plan = nc.path_pairs(names, subnets, full_mesh_max=4, samples=1)
    assert plan["subnet_pairs_total"] == 2


def test_subnet_of_names_the_network_of_the_address():
    link = {"nets": ["10.1.2.3/16", "192.168.7.9/24"]}
    assert nc.subnet_of(link, "192.168.7.9") == "192.168.7.0/24"
    assert nc.subnet_of(link, "10.1.2.3") == "10.1.0.0/16"
    assert nc.subnet_of(link, "10.1.2.4") is None and nc.subnet_of({}, "x") is None


@settings(max_examples=150, deadline=None)
@given(n=st.integers(min_value=2, max_value=300), full_max=st.integers(min_value=0, max_value=40),
       samples=st.integers(min_value=0, max_value=4), nsub=st.integers(min_value=1, max_value=12),
       seed=st.integers(min_value=0, max_value=10**6))
def test_properties(n, full_max, samples, nsub, seed):
    names = hosts(n)
    subnets = {h: f"10.{i % nsub}.0.0/24" for i, h in enumerate(names)}
    plan = nc.path_pairs(names, subnets, full_mesh_max=full_max, samples=samples, seed=seed)
    pairs = undirected(plan)
    # Every node appears in a pair; no node probes itself; no pair twice.
    assert {h for p in pairs for h in p} == set(names)
    assert all(h not in peers for h, peers in plan["probes"].items())
    assert sum(len(p) for p in plan["probes"].values()) == (n * (n - 1) if plan["scheme"] == nc.FULL_MESH
                                                           else len(pairs))
    # Every pair of data subnets (and every subnet of 2+ nodes within itself) is covered.
    nets = sorted(set(subnets.values()))
    for i, a in enumerate(nets):
        for b in nets[i:]:
            if a == b and sum(v == a for v in subnets.values()) < 2:
                continue
            assert any({subnets[x], subnets[y]} == {a, b} for x, y in pairs), (a, b)
    if plan["scheme"] == nc.SAMPLED:
        # O(1) per node: 2 per ring, plus the subnet representatives spread over each subnet's nodes.
        size = min(sum(v == net for v in subnets.values()) for net in nets)
        bound = 2 * (samples + 1) + 2 * (-(-len(nets) // size) + 1)
        assert max(degree(plan, h) for h in names) <= bound
        assert plan["pairs"] <= plan["full_mesh_pairs"]
    else:
        assert n <= max(full_max, 1) and plan["pairs"] == n * (n - 1) // 2
