"""Malformed inventories stop `ansible-playbook site.yml` in the validation play, before any host is contacted.

Table-driven: each case writes a small YAML (or INI) inventory whose hosts sit in 198.51.100.0/24 where no
machine answers, runs the real site.yml and asserts: non-zero exit, the expected "Stop if …" text, the failure
is the validation task of the first play, and no trainer host was contacted (no later play started, no
UNREACHABLE, the recap lists localhost only).

No simulated cluster is needed: these tests never request the `cluster` fixture. Run them alone with
    .venv/bin/pytest -q tests/integration/test_validation.py
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from helpers import REPO, parse_recap, run_playbook

VALIDATE_TASK = "TASK [cluster : Stop if the inventory or the variables are wrong"
NET = "198.51.100"


def hosts(n: int = 3, **per_host) -> dict:
    """n trainers node1..n in 198.51.100.0/24; per_host={"node2": {"node_rank": 5}} adds host vars."""
    out = {}
    for i in range(1, n + 1):
        name = f"node{i}"
        out[name] = {"ansible_host": f"{NET}.{10 + i}", **per_host.get(name, {})}
    return out


GOOD = {
    "cluster_gpus_per_node": 8,
    "cluster_data_mtu": 9000,
    "cluster_rendezvous_port": 39500,
    "cluster_output_root": "/srv/outputs",
    "cluster_shared_root": "/srv/shared",
    "cluster_code_dir": "/srv/code",
    "container_image": "example/train:1",
}


def gv(**over) -> dict:
    out = dict(GOOD)
    for k, v in over.items():
        if v is _DROP:
            out.pop(k, None)
        else:
            out[k] = v
    return out


_DROP = object()

# id, trainers hosts (None: no trainers group), group_vars, extra CLI args, expected substrings
CASES = [
    ("no-trainers-group", None, gv(), [], ["Stop if the inventory has no group 'trainers'", "typo"]),
    ("empty-trainers", {}, gv(), [], ["Stop if the group 'trainers' has no hosts"]),
    ("duplicate-rank", hosts(node1={"node_rank": 0}, node2={"node_rank": 0}, node3={"node_rank": 1}), gv(), [],
     ["Stop if node_rank 0 is given to more than one trainer (node1, node2)", "unused ranks: 2"]),
    ("rank-out-of-range", hosts(node1={"node_rank": 0}, node2={"node_rank": 1}, node3={"node_rank": 3}), gv(), [],
     ["Stop if node_rank is out of range 0..2 (3 trainers) on node3 (node_rank = 3)"]),
    ("rank-negative", hosts(node1={"node_rank": -1}, node2={"node_rank": 1}, node3={"node_rank": 2}), gv(), [],
     ["node_rank is out of range 0..2", "on node1 (node_rank = -1)"]),
    ("rank-on-some-hosts", hosts(node1={"node_rank": 0}), gv(), [],
     ["Stop if node_rank is set on some trainers (node1) but not on node2, node3"]),
    ("rank-string", hosts(node1={"node_rank": "0"}, node2={"node_rank": 1}, node3={"node_rank": 2}), gv(), [],
     ["Stop if node_rank is a string, not an integer on node1 (node_rank = '0')", "write node_rank: 0 without quotes"]),
    ("same-ansible-host", hosts(node3={"ansible_host": f"{NET}.11"}), gv(), [],
     ["Stop if the inventory names node1, node3 all reach the same address 198.51.100.11"]),
    ("same-data-address", hosts(node1={"data_address": "172.30.9.1"}, node2={"data_address": "172.30.9.1"}), gv(),
     [], ["Stop if the trainers node1, node2 have the same data address 172.30.9.1"]),
    ("bad-data-ip", hosts(node2={"data_address": "10.0.0.300"}), gv(), [],
     ["Stop if data_address is not a valid IP address on node2 (data_address = '10.0.0.300')"]),
    ("mtu-string", hosts(), gv(cluster_data_mtu="9000"), [],
     ["Stop if cluster_data_mtu is a string but must be an integer", "write cluster_data_mtu: 9000 without quotes"]),
    ("mtu-null", hosts(), gv(cluster_data_mtu=None), [], ["Stop if cluster_data_mtu is empty (null)"]),
    ("mtu-too-big", hosts(), gv(cluster_data_mtu=9500), [],
     ["Stop if cluster_data_mtu is outside 1280–9216", "(cluster_data_mtu = 9500)"]),
    ("mtu-too-small", hosts(), gv(cluster_data_mtu=576), [], ["Stop if cluster_data_mtu is outside 1280–9216"]),
    ("port-privileged", hosts(), gv(cluster_rendezvous_port=80), [],
     ["Stop if cluster_rendezvous_port is outside 1024–65535", "(cluster_rendezvous_port = 80)"]),
    ("port-too-big", hosts(), gv(cluster_rendezvous_port=70000), [], ["cluster_rendezvous_port is outside 1024–65535"]),
    ("master-not-head", hosts(), gv(cluster_master_addr=f"{NET}.12"), [],
     ["Stop if cluster_master_addr is not the data address of the head node1 (198.51.100.11)",
      "that is node2, not the head"]),
    ("iface-lo", hosts(), gv(cluster_data_iface="lo"), [],
     ["Stop if cluster_data_iface is loopback or a container/VM bridge interface", "(cluster_data_iface = 'lo')"]),
    ("iface-docker0", hosts(), gv(cluster_data_iface="docker0"), [], ["(matches docker.*)"]),
    ("iface-veth-one-host", hosts(node3={"cluster_data_iface": "veth12ab"}), gv(), [],
     ["cluster_data_iface is loopback or a container/VM bridge interface (matches veth.*) on node3"]),
    ("iface-bridge", hosts(), gv(cluster_data_iface="br-5f2c1a"), [], ["(matches br-.*)"]),
    ("unknown-cluster-var", hosts(), gv(cluster_gpu_per_node=8), [],
     ["Stop if cluster_gpu_per_node is not a variable of the role cluster", "did you mean 'cluster_gpus_per_node'?"]),
    ("unknown-role-var", hosts(), gv(container_imagee="x/y:1"), [],
     ["container_imagee is not a variable of the role container", "did you mean 'container_image'?"]),
    ("unknown-nested-key", hosts(), gv(cluster_preflight={"min_shm_mbb": 1024}), [],
     ["Stop if cluster_preflight has the unknown key 'min_shm_mbb'", "did you mean 'min_shm_mb'?"]),
    ("nested-type", hosts(), gv(cluster_preflight={"min_shm_mb": "64"}), [],
     ["Stop if cluster_preflight.min_shm_mb is a string but must be an integer"]),
    ("removed-master-port", hosts(), gv(master_port=29500), [],
     ["Stop if the removed variable master_port is set", "rename master_port to cluster_rendezvous_port"]),
    ("removed-socket-ifname", hosts(), gv(nccl_socket_ifname="eth1"), [],
     ["rename nccl_socket_ifname to cluster_data_iface"]),
    ("removed-gpus-per-node", hosts(), gv(gpus_per_node=8), [], ["rename gpus_per_node to cluster_gpus_per_node"]),
    ("bool-as-string", hosts(), gv(container_engine_install="yes"), [],
     ["Stop if container_engine_install is a string but must be a boolean",
      "write container_engine_install: true without quotes"]),
    ("bad-choice", hosts(), gv(nccl_env_profile="rdma"), [],
     ["Stop if nccl_env_profile is not one of tcp, ib", "(nccl_env_profile = 'rdma')"]),
    # The roles keep no assert of their own for choices and types: the spec is checked here, once.
    ("bad-choice-debug", hosts(), gv(nccl_env_debug="LOUD"), [], ["Stop if nccl_env_debug is not one of"]),
    ("bad-choice-deepspeed", hosts(), gv(deepspeed_config_profile="zero4"), [],
     ["Stop if deepspeed_config_profile is not one of"]),
    ("overrides-not-a-dict", hosts(), gv(deepspeed_config_overrides="stage3"), [], ["deepspeed_config_overrides"]),
    ("nproc-over-gpus", hosts(), gv(cluster_gpus_per_node=4, cluster_nproc_per_node=8), [],
     ["Stop if cluster_nproc_per_node is more than cluster_gpus_per_node (4)"]),
    ("cpu-without-nproc", hosts(), gv(cluster_gpus_per_node=0), [],
     ["Stop if cluster_gpus_per_node is 0 and cluster_nproc_per_node is not set"]),
    ("output-relative", hosts(), gv(cluster_output_root="outputs"), [],
     ["Stop if cluster_output_root is not an absolute path", "/outputs"]),
    ("output-root-slash", hosts(), gv(cluster_output_root="/"), [],
     ["Stop if cluster_output_root normalises to /, a system directory"]),
    ("janitor-root-dotdot", hosts(), gv(janitor_root="/srv/..//tmp/"), [],
     ["Stop if janitor_root contains '..'", "(janitor_root = '/srv/..//tmp/')", "Fix: write the path without '..'"]),
    ("state-dir-in-outputs", hosts(), gv(cluster_state_dir="/srv//outputs/./state/"), [],
     ["Stop if cluster_state_dir is inside a directory the training container mounts",
      "cluster_output_root /srv/outputs", "Fix: put cluster_state_dir outside every mounted directory"]),
    ("var-differs-per-host", hosts(node2={"cluster_data_mtu": 1500}), gv(), [],
     ["Stop if cluster_data_mtu differs between trainers", "node2 = 1500"]),
    ("deepspeed-differs-per-host", hosts(node3={"deepspeed_config_overrides": {"steps_per_print": 1}}), gv(), [],
     ["Stop if deepspeed_config_overrides differs between trainers", "node3 = {'steps_per_print': 1}"]),
    ("bad-job-name", hosts(), gv(cluster_job_name="my job"), [], ["Stop if cluster_job_name is not a valid job name"]),
    ("reserved-fact", hosts(), gv(cluster_model={"node_rank": 0}), [],
     ["Stop if cluster_model is set in the inventory but is a fact computed by the role cluster"]),
    ("cli-extra-var-coerced", hosts(), gv(), ["-e", "cluster_rendezvous_port=80"],
     ["cluster_rendezvous_port is outside 1024–65535"]),
    # Role rules the argument specs cannot state (plugin_utils/cluster_model.py check_role_rules), once on the
    # controller instead of an assert on every node.
    ("bf16-and-fp16", hosts(), gv(deepspeed_config_bf16=True, deepspeed_config_fp16=True), [],
     ["Stop if deepspeed_config_bf16 and deepspeed_config_fp16 are both true on all 3 trainers", "choose one"]),
    ("driver-version-of-another-branch", hosts(node2={"nvidia_driver_version": "570.86"}), gv(), [],
     ["Stop if the driver options disagree (nvidia_driver_branch '580', nvidia_driver_version '570.86'",
      "on node2", "the version a full version of that branch"]),
    ("sidecar-without-argv", hosts(), gv(launch_sidecars_extra=[{"name": "mon"}]), [],
     ["Stop if a sidecar of launch_sidecars_extra has no name or no argv list", "argv: [program, arg, ...]"]),
    ("all-problems-at-once", hosts(node2={"node_rank": 7}), gv(cluster_data_mtu=100, master_port=1), [],
     ["Stop if cluster_data_mtu is outside", "Stop if the removed variable master_port", "Stop if node_rank",
      "4 problem(s)"]),
]


def write_inventory(root: Path, trainers, group_vars: dict) -> Path:
    inv = root / "inv"
    (inv / "group_vars").mkdir(parents=True)
    if trainers is None:
        doc = {"all": {"children": {"trainer": {"hosts": hosts(2)}}}}
    else:
        doc = {"all": {"children": {"trainers": {"hosts": trainers or None}}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars, sort_keys=False))
    return inv


def assert_stopped_in_validation(r, expected: list[str]) -> None:
    out = r.stdout
    assert r.returncode != 0, out[-3000:]
    for text in expected:
        assert text in out, f"missing {text!r} in:\n{out[-4000:]}"
    assert VALIDATE_TASK in out, out[-3000:]
    # The failing task is the validation task of the first play, and nothing ran after it.
    tail = out[out.rindex(VALIDATE_TASK):]
    assert "fatal: [localhost]: FAILED!" in tail, tail[-3000:]
    assert "PLAY [Prepare the nodes]" not in out and "TASK [" not in tail[len(VALIDATE_TASK):], tail[-3000:]
    # No host contacted: no UNREACHABLE, and the recap lists localhost only.
    assert "UNREACHABLE" not in out
    recap = parse_recap(out)
    assert set(recap) == {"localhost"}, recap


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_inventory_stops_in_validation(tmp_path, case):
    _, trainers, group_vars, extra, expected = case
    inv = write_inventory(tmp_path, trainers, group_vars)
    r = run_playbook(inv, "site.yml", *extra, timeout=120)
    assert_stopped_in_validation(r, expected)


def test_ini_inventory_strings_are_typed_like_ansible(tmp_path):
    """INI cannot quote types: digits become ints (accepted), a word where an int is needed is still an error."""
    inv = tmp_path / "hosts.ini"
    inv.write_text(textwrap.dedent(f"""\
        [trainers]
        node1 ansible_host={NET}.11
        node2 ansible_host={NET}.12

        [trainers:vars]
        cluster_data_mtu=9000
        cluster_rendezvous_port=high
        container_engine_install=false
        """))
    r = run_playbook(inv, "site.yml", timeout=120)
    assert_stopped_in_validation(r, ["Stop if cluster_rendezvous_port is a string but must be an integer"])
    assert "cluster_data_mtu" not in r.stdout.split(VALIDATE_TASK)[-1]
    assert "container_engine_install" not in r.stdout.split(VALIDATE_TASK)[-1]


def test_cli_extra_vars_are_coerced_and_pass(tmp_path):
    """-e key=value is always a string; it is converted as Ansible's argument spec does, then checked."""
    inv = write_inventory(tmp_path, hosts(), gv())
    r = run_playbook(inv, "playbooks/validate.yml", "-e", "cluster_data_mtu=1500", "-e",
                     "container_engine_install=false", timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]


def test_example_inventory_passes():
    r = run_playbook(REPO / "inventory/example-3x8-a100", "playbooks/validate.yml", timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "3 trainers, 8 processes each, world size 24, head a100-node1" in r.stdout
    assert "UNREACHABLE" not in r.stdout


def test_sim_inventory_passes(cluster):
    """The inventory the simulated cluster writes (inventory/sim for `make sim-up`, inventory/sim-<name> here)."""
    assert (cluster.inventory / "hosts.yml").is_file() and (cluster.inventory / "group_vars/all.yml").is_file()
    r = run_playbook(cluster.inventory, "playbooks/validate.yml", timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    n = len(cluster.nodes)
    assert f"{n} trainers, 1 processes each, world size {n}, head {cluster.head}" in r.stdout


def test_cluster_model_is_set_on_every_trainer_without_contacting_them(tmp_path):
    """node_rank reorders the ranks; the model lands on every trainer as a fact; no host is contacted."""
    inv = write_inventory(tmp_path, hosts(node1={"node_rank": 2}, node2={"node_rank": 0},
                                          node3={"node_rank": 1, "data_address": "172.30.9.13"}),
                          gv(cluster_gpus_per_node=4, cluster_nproc_per_node=2))
    play = tmp_path / "show.yml"
    play.write_text(textwrap.dedent(f"""\
        - name: Validate
          ansible.builtin.import_playbook: {REPO}/playbooks/validate.yml
        - name: Show
          hosts: localhost
          gather_facts: false
          tasks:
            - name: Dump the models
              ansible.builtin.copy:
                content: "{{{{ groups['trainers'] | map('extract', hostvars, 'cluster_model') | list | to_json }}}}"
                dest: {tmp_path}/models.json
                mode: "0644"
        """))
    r = run_playbook(inv, str(play), timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    import json
    models = json.loads((tmp_path / "models.json").read_text())
    assert [m["node_rank"] for m in models] == [2, 0, 1]
    assert all(m["hosts_by_rank"] == ["node2", "node3", "node1"] for m in models)
    assert all(m["head"] == "node2" and m["master_addr"] == f"{NET}.12" for m in models)
    assert all(m["nnodes"] == 3 and m["nproc_per_node"] == 2 and m["world_size"] == 6 for m in models)
    assert models[2]["data_address"] == "172.30.9.13" and models[0]["data_address"] == f"{NET}.11"
    assert "UNREACHABLE" not in r.stdout and set(parse_recap(r.stdout)) == {"localhost"}
