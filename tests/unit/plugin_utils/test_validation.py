"""Inventory validation as pure functions: every problem named "Stop if …" with host, variable, value and fix."""

from __future__ import annotations


import pytest
import yaml

from ansible_collections.trainyard.core.plugins.plugin_utils import cluster_model as cm
from helpers import REPO

ROLES = cm.load_role_specs(REPO / "roles")
CLUSTER_DEFAULTS = yaml.safe_load((REPO / "roles/cluster/defaults/main.yml").read_text())
VARS = yaml.safe_load((REPO / "roles/cluster/vars/main.yml").read_text())


def run(hostvars: dict, groups: dict | None = None, lenient: dict | None = None, roles=None) -> list[str]:
    groups = groups if groups is not None else {"all": list(hostvars), "trainers": list(hostvars)}
    return cm.validate(groups, hostvars, roles=ROLES if roles is None else roles, defaults=CLUSTER_DEFAULTS,
                       removed=VARS["_cluster_removed_vars"], reserved=VARS["_cluster_reserved_facts"],
                       lenient=lenient)


def three(**common) -> dict:
    return {f"n{i}": {"ansible_host": f"198.51.100.{i}", **common} for i in (1, 2, 3)}


def test_good_inventory_has_no_problem():
    assert run(three(cluster_data_mtu=9000, cluster_data_iface="eth1", cluster_preflight={"min_shm_mb": 64})) == []


def test_every_line_starts_with_stop_if_and_has_a_fix():
    problems = run(three(cluster_data_mtu="9000", cluster_rendezvous_port=22, master_port=1, cluster_data_iface="lo"))
    assert len(problems) == 4
    assert all(p.startswith("Stop if ") and ". Fix: " in p for p in problems)


def test_problems_on_all_hosts_are_merged_into_one_line():
    problems = run(three(cluster_data_mtu=100))
    assert problems == ["Stop if cluster_data_mtu is outside 1280–9216 on all 3 trainers (cluster_data_mtu = 100). "
                        "Fix: set cluster_data_mtu to 9000 (jumbo frames) or 1500, or 0 to measure it (an overlay)"]
    assert run(three(cluster_data_mtu=0)) == []  # 0: measured on the nodes (an overlay)


def test_missing_group_suggests_the_nearest_group_name():
    (line,) = run({"a": {}}, groups={"all": ["a"], "trainer": ["a"]})
    assert "no group 'trainers'" in line and "'trainer' looks like a typo" in line


@pytest.mark.parametrize("value,msg", [
    ("8", "is a string but must be an integer"),
    (8.5, "is a number but must be an integer"),
    (True, "is a boolean but must be an integer"),
    ([8], "is a list but must be an integer"),
    (None, "is empty (null)"),
])
def test_int_typing_is_strict_for_yaml(value, msg):
    (line,) = run(three(cluster_gpus_per_node=value))
    assert f"cluster_gpus_per_node {msg}" in line


def test_untyped_sources_are_coerced_like_ansible():
    hv = three(cluster_gpus_per_node="8", container_engine_install="false")
    lenient = {h: {"cluster_gpus_per_node", "container_engine_install"} for h in hv}
    assert run(hv, lenient=lenient) == []
    hv = three(cluster_gpus_per_node="eight")
    (line,) = run(hv, lenient={h: {"cluster_gpus_per_node"} for h in hv})
    assert "is a string but must be an integer" in line


def test_numbers_are_accepted_where_strings_are_expected_but_bools_are_not():
    assert run(three(cluster_job_name=42)) == []
    (line,) = run(three(cluster_job_name=True))
    assert "cluster_job_name is a boolean but must be a string" in line


def test_nested_unknown_key_names_the_nearest_and_the_valid_keys():
    (line,) = run(three(cluster_preflight={"max_clock_skew": 1.0}))
    assert "cluster_preflight has the unknown key 'max_clock_skew'" in line
    assert "did you mean 'max_clock_skew_s'?" in line and "Valid keys: docker, max_clock_skew_s" in line


def test_nested_choices_and_types():
    problems = run(three(cluster_preflight={"docker": "maybe", "min_free_gb": "10"}))
    assert any("cluster_preflight.docker is not one of auto, required, skip" in p for p in problems)
    assert any("cluster_preflight.min_free_gb is a string but must be a number" in p for p in problems)


def test_lists_of_dicts_with_options_are_checked_element_by_element(tmp_path):
    spec = {"argument_specs": {"main": {"options": {"demo_mounts": {
        "type": "list", "elements": "dict",
        "options": {"source": {"type": "str", "required": True}, "read_only": {"type": "bool"}}}}}}}
    (tmp_path / "demo/meta").mkdir(parents=True)
    (tmp_path / "demo/meta/argument_specs.yml").write_text(yaml.safe_dump(spec))
    roles = cm.load_role_specs(tmp_path)
    problems = run(three(demo_mounts=[{"source": "/a"}, {"sorce": "/b", "read_only": "no"}]), roles=roles)
    assert any("demo_mounts[1] has the unknown key 'sorce'" in p and "did you mean 'source'?" in p for p in problems)
    assert any("demo_mounts[1] lacks the required key 'source'" in p for p in problems)
    assert any("demo_mounts[1].read_only is a string but must be a boolean" in p for p in problems)


def test_unknown_variable_uses_the_longest_matching_role_prefix():
    (line,) = run(three(nccl_env_profil="tcp"))
    assert "nccl_env_profil is not a variable of the role nccl_env" in line
    assert "did you mean 'nccl_env_profile'?" in line


@pytest.mark.parametrize("var,value", [("launch_collect_timeout", 30), ("launch_status_stall_s", 600),
                                       ("launch_recover_resume", "weights")])
def test_a_variable_is_checked_by_the_role_that_owns_it_whatever_its_prefix(var, value):
    """The job and recover roles keep the launch_ names they had in the launch role: known, and typed by their spec."""
    assert run(three(**{var: value})) == []
    (line,) = run(three(launch_recover_resume="all"))
    assert "launch_recover_resume" in line and "full" in line


def test_a_typo_of_a_moved_variable_names_the_nearest_one():
    (line,) = run(three(launch_collect_timout=30))
    assert "did you mean 'launch_collect_timeout'?" in line and "roles/job/meta/argument_specs.yml" in line


def test_role_without_spec_is_not_checked():
    assert run(three(fabricmanager_anything=1), roles={k: v for k, v in ROLES.items() if k != "fabricmanager"}) == []


def test_defaults_only_variables_are_known():
    roles = {"cluster": {"options": {}, "defaults": {"cluster_x"}}}
    assert run(three(cluster_x=1), roles=roles) == []


@pytest.mark.parametrize("old,new", [("master_port", "cluster_rendezvous_port"),
                                     ("nccl_socket_ifname", "cluster_data_iface"),
                                     ("gpus_per_node", "cluster_gpus_per_node"), ("data_mtu", "cluster_data_mtu")])
def test_removed_variables_name_the_new_one(old, new):
    (line,) = run(three(**{old: 1}))
    assert line.startswith(f"Stop if the removed variable {old} is set") and f"rename {old} to {new}" in line


def test_rank_checks():
    hv = three()
    hv["n1"]["node_rank"] = 0
    hv["n2"]["node_rank"] = 0
    hv["n3"]["node_rank"] = 5
    problems = run(hv)
    assert any("node_rank 0 is given to more than one trainer (n1, n2)" in p for p in problems)
    assert any("node_rank is out of range 0..2 (3 trainers) on n3" in p for p in problems)


def test_same_ssh_address_on_different_ports_is_allowed():
    hv = three()
    for i, h in enumerate(hv):
        hv[h].update(ansible_host="198.51.100.1", ansible_port=2200 + i, data_address=f"172.30.0.{i + 1}")
    assert run(hv) == []
    hv["n3"]["ansible_port"] = 2200
    assert any("n1, n3 all reach the same address 198.51.100.1 (port 2200)" in p for p in run(hv))


def test_master_addr_must_be_the_heads_data_address():
    hv = three(cluster_master_addr="198.51.100.1")
    assert run(hv) == []
    hv = three(cluster_master_addr="198.51.100.3")
    (line,) = run(hv)
    assert "not the data address of the head n1 (198.51.100.1) (that is n3, not the head)" in line


@pytest.mark.parametrize("iface", ["lo", "docker0", "veth9a8b", "br-1234abcd", "virbr0", "cni0", "flannel.1",
                                   "cali1234"])
def test_bad_data_interfaces(iface):
    (line,) = run(three(cluster_data_iface=iface))
    assert "cluster_data_iface is loopback or a container/VM bridge interface" in line


@pytest.mark.parametrize("iface", ["eth1", "ens1f0np0", "ib0", "bond0", "enp65s0"])
def test_good_data_interfaces(iface):
    assert run(three(cluster_data_iface=iface)) == []


def test_cluster_values_must_agree_across_hosts_except_the_interface():
    hv = three(cluster_data_iface="eth1")
    hv["n2"]["cluster_data_iface"] = "ens1"
    assert run(hv) == []
    hv["n2"]["cluster_rendezvous_port"] = 40000
    (line,) = run(hv)
    assert "cluster_rendezvous_port differs between trainers" in line and "n2 = 40000" in line


def test_the_path_proofs_settings_are_one_per_cluster():
    # the network role plans the pairs and reads the ping settings once per play: a per-node value would be ignored
    hv = three(network_path_retries=2)
    assert run(hv) == []
    hv["n3"]["network_path_retries"] = 5
    (line,) = run(hv)
    assert "network_path_retries differs between trainers" in line and "n3 = 5" in line and "once for the cluster" in line
    hv["n3"]["network_path_retries"] = 1
    hv["n1"].pop("network_path_retries")
    hv["n2"].pop("network_path_retries")
    assert run(hv) == []  # the value set on n3 is the default the others take


def test_the_deepspeed_config_is_one_per_cluster_but_where_its_file_goes():
    # the config is built and validated once per play: a per-node value would be ignored, so it stops here
    hv = three(deepspeed_config_steps_per_print=10)
    hv["n3"]["deepspeed_config_overrides"] = {"steps_per_print": 1}
    (line,) = run(hv)
    assert "deepspeed_config_overrides differs between trainers" in line and "n1, n2 = {} (default)" in line
    assert "n3 = {'steps_per_print': 1}" in line and "once for the cluster" in line
    hv["n3"].pop("deepspeed_config_overrides")
    hv["n2"]["deepspeed_config_steps_per_print"] = 100
    (line,) = run(hv)
    assert "deepspeed_config_steps_per_print differs between trainers" in line and "n2 = 100" in line
    hv["n2"]["deepspeed_config_steps_per_print"] = 10
    hv["n2"]["deepspeed_config_dir"] = "/srv/other/job-ro"  # where the file goes may differ, as cluster_state_dir
    assert run(hv) == []


def test_reserved_facts_are_refused():
    (line,) = run(three(network_iface="eth1"))
    assert "network_iface is set in the inventory but is a fact computed by the role network" in line


def test_every_role_spec_loads_and_types_are_known():
    known = {"str", "int", "float", "bool", "list", "dict", "path", "raw"}
    for role, data in ROLES.items():
        for var, spec in data["options"].items():
            assert spec.get("type", "str") in known, f"{role}: {var} has type {spec.get('type')}"


def test_cluster_spec_matches_defaults():
    spec = yaml.safe_load((REPO / "roles/cluster/meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert set(options) == set(CLUSTER_DEFAULTS)
    for name, value in CLUSTER_DEFAULTS.items():
        assert options[name].get("default") == value, name
    nested = options["cluster_preflight"]["options"]
    assert {k: v["default"] for k, v in nested.items()} == VARS["_cluster_preflight_defaults"]


def test_container_off_with_the_docker_runtime_is_stopped():
    problems = run(three(container_enabled=False))
    assert len(problems) == 1
    assert problems[0].startswith("Stop if container_enabled is false while launch_runtime is docker")
    assert "on all 3 trainers (container_enabled = false)" in problems[0] and "launch_runtime: host" in problems[0]
    assert run(three(container_enabled=False, launch_runtime="host")) == []
    assert run(three(container_enabled=True)) == []


# ----------------------------------------------------------------------------------- dangerous paths
@pytest.mark.parametrize("var,value,norm", [
    ("cluster_output_root", "//", "/"),
    ("cluster_output_root", "/tmp/", "/tmp"),
    ("cluster_output_root", "/dev/./shm", "/dev/shm"),
    ("cluster_state_dir", "/var/lib/", "/var/lib"),
    ("cluster_shared_root", "/home//", "/home"),
    ("cluster_code_dir", "/usr/./", "/usr"),
    ("janitor_root", "/var/tmp", "/var/tmp"),
    ("janitor_root", "/lib64", "/lib64"),
    ("launch_log", "/proc/self/fd/1", "/proc/self/fd/1"),
    ("nccl_env_dir", "/opt", "/opt"),
    ("deepspeed_config_dir", "/root/", "/root"),
])
def test_dangerous_path_spellings_are_stopped(var, value, norm):
    (line,) = run(three(**{var: value}))
    assert line.startswith(f"Stop if {var} ") and repr(value) in line and f"normalises to {norm}" in line
    assert "Fix: " in line and "on all 3 trainers" in line


@pytest.mark.parametrize("var,value", [
    ("cluster_output_root", "/var/run/../etc"), ("janitor_root", "/bin/../share"), ("cluster_state_dir", "/srv/.."),
    ("cluster_code_dir", "/srv/trainyard/code/../../../etc/"), ("launch_log", "/srv/x/../y.log"),
    ("container_mounts_extra", [{"source": "/data/../var/lib/docker", "target": "/d"}]),
    ("launch_env_files", ["/srv/a.env", "/srv/b/../../etc/shadow"]),
])
def test_dot_dot_is_refused_in_every_path_variable(var, value):
    """'..' after a symbolic link resolves elsewhere on the node (/var/run -> /run: /var/run/../etc is /etc, and
    /bin/../share is /usr/share where /bin -> usr/bin): refused outright, whatever it would normalise to."""
    (line,) = run(three(**{var: value}))
    assert line.startswith(f"Stop if {var}") and "contains '..'" in line and "on all 3 trainers" in line, line
    assert line.endswith("Fix: write the path without '..'"), line


@pytest.mark.parametrize("var,value", [("cluster_output_root", "srv/outputs"), ("janitor_root", "./out"),
                                       ("launch_log", "torchrun.log"), ("cluster_state_dir", "~/state")])
def test_relative_paths_are_stopped(var, value):
    (line,) = run(three(**{var: value}))
    assert line.startswith(f"Stop if {var} is not an absolute path") and repr(value) in line


def test_container_mount_sources_and_env_files_are_paths_too():
    problems = run(three(container_mounts_extra=[{"source": "/etc/", "target": "/host-etc"}],
                         launch_env_files=["/srv/x.env", "relative.env"]))
    assert any(p.startswith("Stop if container_mounts_extra[0].source ") and "normalises to /etc" in p
               for p in problems)
    assert any(p.startswith("Stop if launch_env_files[1] is not an absolute path") for p in problems)
    assert len(problems) == 2


@pytest.mark.parametrize("var,value", [("cluster_output_root", "/tmp/trainyard/outputs"),
                                       ("janitor_root", "/srv/outputs/"), ("cluster_state_dir", "/var/lib/trainyard"),
                                       ("cluster_output_root", "/dev/shm/job"), ("cluster_run_dir", "runs/x"),
                                       ("container_env_file", ""), ("train_args_model_name_or_path", "org/model")])
def test_paths_below_system_roots_and_non_paths_pass(var, value):
    assert run(three(**{var: value})) == []


# ----------------------------------------------------------------------------------- secrets in messages
@pytest.mark.parametrize("var", ["launch_hf_tokn", "launch_wandb_api_key", "container_registry_pasword",
                                 "cluster_secret", "launch_passwd", "nccl_env_auth_header"])
def test_unknown_variables_are_named_but_their_values_are_not_printed(var):
    (line,) = run(three(**{var: "hunter2-s3cr3t"}))
    assert line.startswith(f"Stop if {var} is not a variable") and "hunter2-s3cr3t" not in line


@pytest.mark.parametrize("var", ["launch_secret_env", "cluster_api_token"])
def test_known_secret_looking_variables_of_the_wrong_type_hide_their_value(var):
    roles = {"launch": {"options": {"launch_secret_env": {"type": "dict"}}, "defaults": set()},
             "cluster": {"options": {"cluster_api_token": {"type": "int"}}, "defaults": set()}}
    (line,) = run(three(**{var: "hunter2-s3cr3t"}), roles=roles)
    assert var in line and "hunter2-s3cr3t" not in line and "<hidden>" in line


def test_secret_values_inside_mappings_are_not_printed():
    problems = run(three(launch_env=["HF_TOKEN=hunter2-s3cr3t"], launch_secret_env={"HF_TOKEN": ["hunter2-s3cr3t"]}))
    assert problems and not any("hunter2-s3cr3t" in p for p in problems)
    problems = run(three(cluster_preflight={"min_free_gb": 1, "api_token": "hunter2-s3cr3t"}))
    assert problems and not any("hunter2-s3cr3t" in p for p in problems)


# ----------------------------------------------------------------------------------- role rules (check_role_rules)
def run_as_plugin(hostvars: dict) -> list[str]:
    """validate() as cluster_validate calls it: a reserved fact a role documents as an input is a variable."""
    documented = {v for r in ROLES.values() for v in r["options"]}
    reserved = {k: v for k, v in VARS["_cluster_reserved_facts"].items() if k not in documented}
    return cm.validate({"all": list(hostvars), "trainers": list(hostvars)}, hostvars, roles=ROLES,
                       defaults=CLUSTER_DEFAULTS, removed=VARS["_cluster_removed_vars"], reserved=reserved)



# Rules over one role's variables that an argument spec cannot state: checked once on the controller, before any
# host is contacted, each naming the variable, the value, the host and the fix.
@pytest.mark.parametrize("variables,expect", [
    ({"nvidia_driver_branch": "58"}, "the driver options disagree (nvidia_driver_branch '58'"),
    ({"nvidia_driver_version": "570.1"}, "nvidia_driver_version '570.1'"),          # not of branch 580
    ({"nvidia_driver_version": "580.x"}, "nvidia_driver_version '580.x'"),
    ({"nvidia_driver_visible_devices": "0 1"}, "nvidia_driver_visible_devices '0 1'"),
    ({"deepspeed_config_bf16": True, "deepspeed_config_fp16": True},
     "deepspeed_config_bf16 and deepspeed_config_fp16 are both true"),
    ({"network_path_wait_s": 0}, "the probe timings are wrong (network_path_wait_s=0"),
    ({"network_listener_s": 2}, "network_listener_s=2)"),                          # shorter than the 3 s connect
    ({"nccl_env_socket_nthreads": 17}, "nccl_env_socket_nthreads=17 and nccl_env_nsocks_perthread=4 are beyond"),
    ({"nccl_env_socket_nthreads": 8, "nccl_env_nsocks_perthread": 16}, "are beyond NCCL's limits"),
    ({"nccl_env_collective_timeout_s": 0}, "the timeouts are not whole seconds (nccl_env_collective_timeout_s=0"),
    ({"nccl_env_heartbeat_timeout_s": -1}, "nccl_env_heartbeat_timeout_s=-1"),
    ({"train_args_entrypoint": "train.py"}, "train_args_entrypoint is not an absolute path"),
    ({"train_args_profile": "llamafactory", "train_args_model_name_or_path": "/m", "train_args_dataset": "d",
      "train_args_extra": ["max_steps=1", "--seed"]}, "train_args_extra holds entries that are not key=value"),
    ({"train_args_profile": "llamafactory", "train_args_dataset": "d"},
     "train_args_profile llamafactory lacks its inputs (train_args_model_name_or_path ''"),
    ({"train_args_profile": "llamafactory", "train_args_model_name_or_path": "/m", "train_args_dataset": "d",
      "train_args_finetuning_type": "qlora"}, "train_args_finetuning_type 'qlora'"),
    ({"nccl_check_expect_warn_fraction": 0.9}, "nccl_check_expect_warn_fraction (0.9) is not above 0 and at most "
                                                "nccl_check_expect_pass_fraction (0.8)"),
    ({"nccl_check_expect_warn_fraction": 0}, "nccl_check_expect_warn_fraction (0) is not above 0"),
    ({"nccl_check_expect_warn_fraction": 0.6, "nccl_check_expect_pass_fraction": 0.5},
     "nccl_check_expect_warn_fraction (0.6) is not above 0 and at most nccl_check_expect_pass_fraction (0.5)"),
    ({"janitor_interval": 0}, "janitor_interval is not above 0"),
    ({"janitor_min_size": -1}, "janitor_min_size is below 0"),
    ({"janitor_completion": "always"}, "janitor_completion is not one of marker, marker_or_superseded"),
    ({"janitor_user": "root"}, "janitor_user is not an unprivileged user name"),
    ({"janitor_user": "Bad User"}, "janitor_user is not an unprivileged user name"),
    ({"janitor_root": "/srv/out\nx"}, "janitor_root holds a control character"),
    ({"cluster_state_dir": "/srv/st\tx"}, "janitor_dir holds a control character"),
    ({"launch_sidecars_extra": [{"name": "mon"}]}, "a sidecar of launch_sidecars_extra has no name or no argv list"),
    ({"launch_sidecars_extra": [{"name": "", "argv": ["x"]}]}, "has no name or no argv list"),
    ({"container_image": "  "}, "container_image is not an image reference"),
    ({"container_image": "repo/train:1 --privileged"}, "container_image is not an image reference"),
    ({"container_shm_size": "lots"}, "container_shm_size is not a size"),
    ({"container_shm_size": "0"}, "container_shm_size is not a size"),
    ({"container_registry_password": "s3cret"}, "container_registry_password is set but container_registry_user"),
    ({"container_mounts_extra": [{"source": "data"}]}, "container_mounts_extra[0] is malformed"),
    ({"container_mounts_extra": [{"source": "/d", "target": "rel"}]}, "container_mounts_extra[0] is malformed"),
    ({"container_mounts_extra": [{"source": "/d", "ro": True}]}, "container_mounts_extra[0] is malformed"),
    ({"container_mounts_extra": [{"source": "/d", "read_only": "yes please"}]}, "is malformed"),
    ({"container_mounts_extra": [{"source": "/data", "target": "/srv/trainyard/code/"}]},  # the code mount
     "mount /srv/trainyard/code more than once"),
    ({"container_mounts": [{"source": "/a", "target": "/x"}, {"source": "/b", "target": "/x"}]}, "mount /x more"),
    ({"container_user": "trainer"}, "container_user is not uid:gid numbers"),      # a name: image vs host passwd
    ({"container_user": "1000"}, "container_user is not uid:gid numbers"),        # no gid: docker gives gid 0
    ({"container_user": "1000:0"}, "container_user is not uid:gid numbers"),      # root's group
    ({"container_user": "0:1000"}, "container_user is not uid:gid numbers"),
    ({"container_user": "1000:1000 --privileged"}, "container_user is not uid:gid numbers"),
])
def test_role_rules_stop_on_the_controller(variables, expect):
    problems = run_as_plugin({"n1": {"ansible_host": "198.51.100.1", **variables}, "n2": {"ansible_host": "198.51.100.2"}})
    line = next((p for p in problems if expect in p), None)
    assert line is not None, problems
    assert line.startswith("Stop if ") and " on n1" in line and ". Fix: " in line


@pytest.mark.parametrize("variables", [
    {"nvidia_driver_branch": "580", "nvidia_driver_version": "580.159.04", "nvidia_driver_visible_devices": "0,1"},
    {"nvidia_driver_branch": 570, "nvidia_driver_version": "570.86"},
    {"deepspeed_config_bf16": False, "deepspeed_config_fp16": True},
    {"deepspeed_config_bf16": "auto", "deepspeed_config_fp16": True},
    {"network_enabled": False, "network_path_wait_s": 0},                          # the role checks nothing when off
    {"network_listener_s": 3, "network_connect_timeout_s": 3, "network_path_retries": 0},
    {"nccl_env_socket_nthreads": 16, "nccl_env_nsocks_perthread": 4},
    {"nccl_env_profile": "ib", "nccl_env_socket_nthreads": 17},                    # socket tuning is tcp's only
    {"nccl_env_socket_nthreads": 0, "nccl_env_nsocks_perthread": 0, "nccl_env_heartbeat_timeout_s": 0},
    {"train_args_profile": "llamafactory", "train_args_model_name_or_path": "org/model", "train_args_dataset": "d",
     "train_args_extra": ["max_steps=100", "a.b=1"]},
    {"train_args_entrypoint": " /srv/code/train.py"},
    {"janitor_enabled": False, "janitor_interval": 0},
    {"nccl_check_expect_warn_fraction": 0.8, "nccl_check_expect_pass_fraction": 0.8},
    {"nccl_check_enabled": False, "nccl_check_expect_warn_fraction": 0.9},      # the role checks nothing when off
    {"janitor_completion": "marker_or_superseded", "janitor_user": "ckpt_janitor"},
    {"launch_sidecars_extra": [{"name": "mon", "argv": ["/usr/bin/true"]}]},
    {"container_image": "registry.example.com/team/train@sha256:" + "a" * 64, "container_shm_size": "512m",
     "container_registry_username": "u", "container_registry_password": "p",
     "container_mounts_extra": [{"source": "/data", "target": "/mnt/data", "read_only": True, "create": False}]},
    {"container_enabled": False, "launch_runtime": "host", "container_image": "", "container_shm_size": "lots"},
    {"container_user": "1000:1000", "container_cap_add": ["IPC_LOCK"], "container_no_new_privileges": False},
    {"container_user": "root"},                                                   # the opt-outs docs/security.md names
    {"container_user": "0:0"},
    {"container_user": ""},
])
def test_role_rules_pass_good_values(variables):
    assert run_as_plugin({"n1": {"ansible_host": "198.51.100.1", **variables},
                          "n2": {"ansible_host": "198.51.100.2", **variables}}) == []


def test_every_node_runs_the_same_image_named_once_for_all():
    hv = three(container_image="reg/train:1")
    hv["n3"]["container_image"] = "reg/train:2"
    (line,) = run(hv)
    assert line.startswith("Stop if container_image differs between nodes (reg/train:1 on n1, n2; reg/train:2 on n3)")
    assert "set container_image once in group_vars" in line


def test_a_registry_password_never_reaches_the_message():
    (line,) = run(three(container_registry_password="hunter2-secret"))
    assert "hunter2-secret" not in line


def test_llamafactory_overrides_are_key_value():
    assert cm.llamafactory_overrides_problems(["max_steps=100", "--seed", "42", "x.y=1", "=1"]) == ["--seed", "42", "=1"]


def test_a_lock_dir_the_container_mounts_stops_the_run_before_any_host_is_contacted():
    """cluster_lock_dir inside (or around) a directory the training container mounts: one line for every trainer,
    from the validate play, so the lock tasks need not carry those directories to every node."""
    (line,) = run(three(cluster_lock_dir="/var/lib/trainyard/locks"))
    assert line == ("Stop if cluster_lock_dir is inside or around a directory the training container mounts: "
                    "cluster_lock_dir /var/lib/trainyard/locks and cluster_state_dir /var/lib/trainyard on all 3 "
                    "trainers (cluster_lock_dir = '/var/lib/trainyard/locks'). Fix: put cluster_lock_dir outside it, "
                    "e.g. /var/lib/trainyard-lock")
    hosts = three(cluster_lock_dir="/data/lock")
    hosts["n2"]["cluster_state_dir"] = "/data"  # a per-host directory: the one trainer it concerns is named
    (line,) = run(hosts)
    assert "cluster_lock_dir /data/lock and cluster_state_dir /data on n2 (" in line, line
    assert run(three(cluster_lock_dir="/var/lib/trainyard-lock")) == []


# ----------------------------------------------------------------------------------- host-only paths
@pytest.mark.parametrize("hostvars,var,where,mount", [
    ({"cluster_state_dir": "/srv/trainyard/outputs/state"}, "cluster_state_dir", "is inside",
     "cluster_output_root /srv/trainyard/outputs"),
    ({"cluster_state_dir": "/srv/trainyard//outputs/./state/"}, "cluster_state_dir", "is inside",
     "cluster_output_root /srv/trainyard/outputs"),
    ({"cluster_state_dir": "/srv/trainyard"}, "cluster_state_dir", "holds", "cluster_output_root /srv/trainyard/outputs"),
    ({"cluster_state_dir": "/srv/trainyard/code"}, "cluster_state_dir", "is", "cluster_code_dir /srv/trainyard/code"),
    ({"janitor_dir": "/srv/trainyard/code/janitor"}, "janitor_dir", "is inside", "cluster_code_dir"),
    ({"janitor_dir": "/srv/trainyard/shared/"}, "janitor_dir", "is", "cluster_shared_root"),
    ({"launch_secret_env_file": "/srv/trainyard/outputs/secret.env"}, "launch_secret_env_file", "is inside",
     "cluster_output_root"),
    ({"container_mounts_extra": [{"source": "/run/trainyard", "target": "/rt"}]}, "launch_secret_env_file",
     "is inside", "container_mounts_extra[0].source /run/trainyard"),
    ({"container_mounts_extra": [{"source": "/var/lib/trainyard-lock/", "target": "/l"}]}, "cluster_lock_dir", "is",
     "container_mounts_extra[0].source /var/lib/trainyard-lock"),
    ({"container_mounts_extra": [{"source": "/var/lib/trainyard/job/", "target": "/j"}]}, "cluster_state_dir",
     "holds", "container_mounts_extra[0].source /var/lib/trainyard/job"),
    ({"container_env_file": "/srv/trainyard/code/.env"}, "container_env_file", "is inside", "cluster_code_dir"),
    ({"network_state_file": "/srv/trainyard/outputs/launch.json"}, "network_state_file", "is inside",
     "cluster_output_root"),
])
def test_host_only_paths_never_inside_a_mounted_directory(hostvars, var, where, mount):
    """Control state, locks and secrets inside (or equal to, or around) any directory the container mounts: one
    line per path with the value, the mount and the fix, from the validate play (no host contacted)."""
    (line,) = run(three(**hostvars))
    assert line.startswith(f"Stop if {var} {where} a directory the training container mounts ({var} "), line
    assert mount in line and f"Fix: put {var} outside every mounted directory" in line and "on all 3 trainers" in line


def test_only_the_jobs_own_parts_may_be_mounted_below_the_state_directory():
    """job-ro and job-rw below <cluster_state_dir>/<job> are the job's by design (the default mounts); the job's
    state directory itself is not."""
    (line,) = run(three(container_mounts_extra=[{"source": "/var/lib/trainyard/demo", "target": "/s"}],
                        cluster_job_name="demo"))
    assert line.startswith("Stop if cluster_state_dir holds a directory the training container mounts"), line
    assert run(three(cluster_state_dir="/var/lib/ty", janitor_dir="/var/lib/ty/demo", cluster_job_name="demo")) == []
    assert run(three(cluster_state_dir="/var/lib/ty/")) == []


# Fabric settings as clouds publish them, given with nccl_env_profile tcp: the profile's NCCL_IB_DISABLE=1 would turn
# each into TCP sockets without a word. GCP's gIB (RoCE) settings: the ENV lines of GoogleCloudPlatform's
# gpudirect-gib nccl-plugin-gib-diagnostic image; an InfiniBand site's (NCCL_IB_HCA, NCCL_IB_CUDA_SUPPORT,
# NCCL_IB_DISABLE=0 as FlagPerf's nvidia configs set them); an RDMA site that selects RoCE v2 (NCCL_IB_GID_INDEX=3)
# with UCX's devices named; AWS EFA (FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA as older launch scripts set it).
GIB = {"NCCL_NET": "gIB", "NCCL_CROSS_NIC": 0, "NCCL_NET_GDR_LEVEL": "PIX", "NCCL_P2P_NET_CHUNKSIZE": 131072,
       "NCCL_NVLS_CHUNKSIZE": 524288, "NCCL_IB_ADAPTIVE_ROUTING": 1, "NCCL_IB_QPS_PER_CONNECTION": 4,
       "NCCL_IB_TC": 52, "NCCL_IB_FIFO_TC": 84, "NCCL_TUNER_CONFIG_PATH": "/usr/local/gib/configs/tuner_config_a4.txtpb"}
IB = {"NCCL_IB_DISABLE": 0, "NCCL_IB_CUDA_SUPPORT": 1, "NCCL_IB_HCA": "mlx5_2,mlx5_5"}
ROCE = {"NCCL_IB_GID_INDEX": 3, "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1,mlx5_4:1,mlx5_5:1",
        "UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1,mlx5_4:1,mlx5_5:1"}
EFA = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": 1}


@pytest.mark.parametrize("env,names,profile", [
    (GIB, "NCCL_IB_ADAPTIVE_ROUTING, NCCL_IB_FIFO_TC, NCCL_IB_QPS_PER_CONNECTION, NCCL_IB_TC, NCCL_NET, "
          "NCCL_NET_GDR_LEVEL", "roce"),
    (IB, "NCCL_IB_CUDA_SUPPORT, NCCL_IB_DISABLE, NCCL_IB_HCA", "ib"),
    (ROCE, "NCCL_IB_GID_INDEX, NCCL_IB_HCA, UCX_NET_DEVICES", "roce"),
    (EFA, "FI_EFA_USE_DEVICE_RDMA, FI_PROVIDER", "efa"),
])
@pytest.mark.parametrize("var", ["nccl_env_extra", "launch_env", "container_env"])
def test_an_rdma_environment_is_never_turned_into_tcp_sockets(env, names, profile, var):
    problems = run_as_plugin({"n1": {"ansible_host": "198.51.100.1", "nccl_env_profile": "tcp"},
                              "n2": {"ansible_host": "198.51.100.2", "nccl_env_profile": "tcp", var: env}})
    line = next((p for p in problems if "configures an RDMA fabric" in p), None)
    assert line is not None, problems
    assert f"{var} configures an RDMA fabric ({names})" in line and f"set nccl_env_profile: {profile}" in line
    assert "n2" in line and "n1" not in line, line  # the node that has it


@pytest.mark.parametrize("profile,env", [
    ("roce", GIB), ("ib", IB),                                          # the profile that keeps the fabric
    ("tcp", {**IB, "NCCL_IB_DISABLE": 1}),                              # sockets, chosen and said
    ("tcp", {"NCCL_NET": "Socket", "NCCL_SOCKET_NTHREADS": 4}),         # the socket transport itself
])
def test_a_fabric_kept_or_sockets_chosen_out_loud_pass(profile, env):
    problems = run_as_plugin({"n1": {"ansible_host": "198.51.100.1", "nccl_env_profile": profile,
                                     "nccl_env_extra": env},
                              "n2": {"ansible_host": "198.51.100.2", "nccl_env_profile": profile}})
    assert not [p for p in problems if "RDMA fabric" in p], problems


# A collective timeout far above the ceiling hides a dead rank for that long (LLaMA-Factory's ZeRO-3 LoRA example
# sets ddp_timeout 180000000 s): stopped on the controller, naming where it came from, unless the user opts in.
@pytest.mark.parametrize("variables,where", [
    ({"nccl_env_collective_timeout_s": 86400}, "nccl_env_collective_timeout_s is 86400 s"),
    ({"train_args_ddp_timeout": 180000000}, "train_args_ddp_timeout is 180000000 s"),
    ({"train_args_profile": "llamafactory", "train_args_model_name_or_path": "/m", "train_args_dataset": "d",
      "train_args_llamafactory_options": {"ddp_timeout": 180000000}},
     "train_args_llamafactory_options.ddp_timeout is 180000000 s"),
    ({"train_args_profile": "llamafactory", "train_args_model_name_or_path": "/m", "train_args_dataset": "d",
      "train_args_extra": ["ddp_timeout=180000000"]}, "train_args_extra 'ddp_timeout=180000000' is 180000000 s"),
    ({"nccl_env_collective_timeout_max_s": 600}, "nccl_env_collective_timeout_s is 1800 s"),   # a lower ceiling
])
def test_a_collective_timeout_above_the_ceiling_stops_unless_kept(variables, where):
    problems = run_as_plugin({"n1": {"ansible_host": "198.51.100.1", **variables},
                              "n2": {"ansible_host": "198.51.100.2"}})
    line = next((p for p in problems if where in p), None)
    assert line is not None, problems
    assert "above the collective timeout ceiling" in line and "nccl_env_collective_timeout_above_max: true" in line
    kept = run_as_plugin({"n1": {"ansible_host": "198.51.100.1", "nccl_env_collective_timeout_above_max": True,
                                 **variables}, "n2": {"ansible_host": "198.51.100.2"}})
    assert not [p for p in kept if "ceiling" in p], kept
