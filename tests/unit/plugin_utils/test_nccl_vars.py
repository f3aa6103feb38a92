"""Pure helpers of role nccl_env (plugin_utils/nccl_vars.py) and the render filters."""

import pytest

from ansible_collections.trainyard.core.plugins.plugin_utils import ds_config
from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars as nv
from helpers import adhoc, load

render = load("filter_plugins/render.py")


@pytest.mark.parametrize("typo,nearest", [
    ("NCCL_SOCKET_IFNAM", "NCCL_SOCKET_IFNAME"),
    ("NCLL_DEBUG", "NCCL_DEBUG"),
    ("nccl_debug", "NCCL_DEBUG"),
    ("NCCL_IB_HCAS", "NCCL_IB_HCA"),
    ("NCCL_NSOCK_PERTHREAD", "NCCL_NSOCKS_PERTHREAD"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLNG", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ("GLOO_SOCKET_IFACE", "GLOO_SOCKET_IFNAME"),
    ("OMP_NUM_THREAD", "OMP_NUM_THREADS"),
    ("PYTORCH_CUDA_ALLOC_CONFIG", "PYTORCH_CUDA_ALLOC_CONF"),
    ("CUDA_DEVICE_ORDR", "CUDA_DEVICE_ORDER"),
])
def test_typo_names_the_nearest_variable(typo, nearest):
    msg = nv.check_name(typo)
    assert msg is not None and f"did you mean {nearest}?" in msg


@pytest.mark.parametrize("name", ["NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_NSOCKS_PERTHREAD", "NCCL_DEBUG_SUBSYS",
                                  "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_DISTRIBUTED_DEBUG", "GLOO_SOCKET_IFNAME",
                                  "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "DEEPSPEED_TIMEOUT",
                                  "NCCL_CROSS_NIC", "NCCL_NET_GDR_LEVEL", "HF_HUB_OFFLINE"])
def test_real_variables_are_known(name):
    assert nv.check_name(name) is None


def test_no_macro_names_in_the_known_list():
    bad = [n for n in nv.KNOWN if n.startswith(("CUDA_ERROR_", "NCCL_LOG_", "TORCH_LIBRARY", "TORCH_CHECK"))]
    assert bad == []


def test_unknown_name_without_near_match_points_to_the_escape_hatch():
    msg = nv.check_name("MYLAB_SEED")
    assert "did you mean" not in msg and "nccl_env_allow_unknown" in msg


def test_allow_unknown_takes_names_and_patterns():
    assert nv.check_name("MYLAB_SEED", ["MYLAB_*"]) is None
    assert nv.check_name("MYLAB_SEED", ["MYLAB_SEED"]) is None
    assert nv.check_name("MYLAB_SEED", ["OTHER_*"]) is not None


@pytest.mark.parametrize("name", ["1NCCL", "NCCL-DEBUG", "A B", ""])
def test_invalid_names(name):
    assert "not a valid variable name" in nv.check_name(name)


@pytest.mark.parametrize("value,text", [(True, "1"), (False, "0"), (4, "4"), (1.5, "1.5"), ("INFO", "INFO"),
                                        ("expandable_segments:True", "expandable_segments:True"),
                                        ("=mlx5_0:1,mlx5_1:1", "=mlx5_0:1,mlx5_1:1"), ("^docker,lo", "^docker,lo")])
def test_values_written_as_text(value, text):
    assert nv.check_value("X", value) == (text, None)


@pytest.mark.parametrize("value", ["'q'", '"q"', "a\nb", "a\\b", " a", "a ", "a\0b", None, [1], {"a": 1}])
def test_values_an_env_file_cannot_carry(value):
    text, why = nv.check_value("X", value)
    assert text is None and why


def _sections():
    return [{"title": "rendezvous", "vars": {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": 2}},
            {"title": "nccl", "vars": {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": None, "NCCL_IB_GID_INDEX": ""}}]


def test_build_env_drops_null_and_empty_role_values_and_keeps_order():
    sections, env, errors = nv.build_env(_sections())
    assert errors == []
    assert [s["title"] for s in sections] == ["rendezvous", "nccl"]
    assert env == {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "2", "NCCL_DEBUG": "INFO"}


def test_extras_override_role_values_but_not_the_rendezvous():
    sections, env, errors = nv.build_env(_sections(), {"NCCL_DEBUG": "WARN", "NODE_RANK": 7})
    assert env["NCCL_DEBUG"] == "WARN"
    by_title = {s["title"]: s["vars"] for s in sections}
    assert "nccl" not in by_title  # its only line moved to the user's section
    assert sections[-1]["title"].startswith("user variables") and sections[-1]["vars"]["NCCL_DEBUG"] == "WARN"
    assert by_title["rendezvous"]["NODE_RANK"] == "2"
    assert any("NODE_RANK comes from the cluster model" in e for e in errors)


def test_extras_section_is_last_and_every_bad_name_is_reported():
    _, _, errors = nv.build_env(_sections(), {"NCCL_SOCKET_IFNAM": "eth1", "NCCL_IB_HCAS": "mlx5_0", "OK_": 1})
    assert len(errors) == 3
    assert any("NCCL_SOCKET_IFNAME" in e for e in errors) and any("NCCL_IB_HCA?" in e for e in errors)


def test_parse_and_normalise_ignore_comments_order_and_export():
    a = "# c\nB=2\nA=1\nNODE_RANK=0\n"
    b = "export A=1\n\n# other comment\nB=2\nNODE_RANK=5\n"
    assert nv.normalise(a) == nv.normalise(b) == ["A=1", "B=2"]
    env, bad = nv.parse_env("A=1\ngarbage line\n")
    assert env == {"A": "1"} and bad == ["garbage line"]
    assert nv.normalise("A=1\ngarbage\n") == ["A=1", "?? garbage"]


def test_consistency_names_the_odd_node_and_shows_the_diff():
    base = "NCCL_IB_DISABLE=1\nNCCL_DEBUG=INFO\nNODE_RANK={}\n"
    files = {"n1": base.format(0), "n2": base.format(1).replace("IB_DISABLE=1", "IB_DISABLE=0"), "n3": base.format(2)}
    r = nv.consistency(files)
    assert r["n1"]["consistent"] and r["n3"]["consistent"] and not r["n2"]["consistent"]
    assert r["n2"]["reference_hosts"] == ["n1", "n3"]
    assert "-NCCL_IB_DISABLE=1" in r["n2"]["diff"] and "+NCCL_IB_DISABLE=0" in r["n2"]["diff"]


def test_consistency_tie_goes_to_the_lowest_rank_and_missing_files_fail():
    r = nv.consistency({"n1": "A=1\n", "n2": "A=2\n", "n3": None})
    assert r["n1"]["consistent"] and not r["n2"]["consistent"]
    assert r["n3"]["missing"] and not r["n3"]["consistent"]


def test_per_node_lines_are_checked_against_each_nodes_expected_values():
    files = {"n1": "A=1\nNODE_RANK=0\nNCCL_SOCKET_IFNAME=eth1\n", "n2": "A=1\nNODE_RANK=0\nNCCL_SOCKET_IFNAME=ens5\n"}
    per_node = ["NODE_RANK", "NCCL_SOCKET_IFNAME"]
    expected = {"n1": {"NODE_RANK": "0", "NCCL_SOCKET_IFNAME": "eth1"},
                "n2": {"NODE_RANK": "1", "NCCL_SOCKET_IFNAME": "ens5"}}
    r = nv.consistency(files, per_node, expected)
    assert r["n1"]["consistent"]
    assert not r["n2"]["consistent"] and "NODE_RANK=0 on this node, expected NODE_RANK=1" in r["n2"]["diff"]


def test_argv_from_options_and_extras():
    opts = {"--a": "x", "--flag": True, "--off": False, "--none": None, "--list": ["q", "k"], "--n": 3}
    assert render.argv(opts, ["--seed", 42]) == ["--a", "x", "--flag", "--list", "q,k", "--n", "3", "--seed", "42"]
    # an option the user gives replaces the profile's, in both --opt value and --opt=value forms
    assert render.argv({"--a": "x", "--b": "y"}, ["--a=z"]) == ["--b", "y", "--a=z"]
    assert render.argv({"--a": "x", "--b": "y"}, ["--b", "w"]) == ["--a", "x", "--b", "w"]


@pytest.mark.parametrize("zero,ft,overrides,status,variable", [
    ({"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}, "lora", {}, "pass", ""),
    ({"stage": 3, "stage3_gather_16bit_weights_on_model_save": False}, "lora", {},
     "fail", "deepspeed_config_gather_16bit_weights_on_model_save"),
    ({"stage": 3, "stage3_gather_16bit_weights_on_model_save": True, "gather_16bit_weights_on_model_save": False},
     "lora", {"zero_optimization": {"gather_16bit_weights_on_model_save": False}},
     "fail", "deepspeed_config_overrides.zero_optimization.gather_16bit_weights_on_model_save"),
    ({"stage": 3}, "lora", {}, "fail", "deepspeed_config_gather_16bit_weights_on_model_save"),
    ({"stage": 3, "stage3_gather_16bit_weights_on_model_save": "false"}, "lora", {}, "fail",
     "deepspeed_config_gather_16bit_weights_on_model_save"),
    ({"stage": 3, "stage3_gather_16bit_weights_on_model_save": False}, "full", {}, "skip", ""),
    ({"stage": 2}, "lora", {}, "skip", ""),
])
def test_lora_gather_rule(zero, ft, overrides, status, variable):
    r = ds_config.lora_gather({"zero_optimization": zero}, overrides, ft)
    assert r["status"] == status and r["variable"] == variable


def test_the_action_runs_on_the_controller_and_answers_without_a_change():
    """nccl_env_validate through the real `ansible` (plugin_utils/bases.py's ControllerAction): the verdict comes
    back as the task's result, never a change; a wrong argument type is one line naming the variable."""
    sections = [{"title": "t", "vars": {"NCCL_DEBUG": "WARN"}}]
    r = adhoc("nccl_env_validate", {"sections": sections, "extra": {"NCCL_DEBGU": "INFO"}, "allow_unknown": "MYLAB_*"})
    assert r["changed"] is False and r["ok"] is False and "NCCL_DEBUG" in r["errors"][0], r
    r = adhoc("nccl_env_validate", {"sections": sections, "extra": {"MYLAB_X": "1"}, "allow_unknown": "MYLAB_*"})
    assert r["changed"] is False and r["ok"] is True and r["env"] == {"NCCL_DEBUG": "WARN", "MYLAB_X": "1"}, r
    r = adhoc("nccl_env_validate", {"sections": sections, "extra": ["NCCL_DEBUG=INFO"]})
    assert r.get("failed") and r["msg"] == "nccl_env_extra (NAME: value) must be a dict, not list", r


def test_the_action_records_its_check_publishes_facts_and_stops_on_what_is_missing():
    """nccl_env_validate records nccl_env.variables itself (no task of its own), sets the facts it is given, and
    fails naming what is missing (the cluster model, the data interface) before building."""
    sections = [{"title": "t", "vars": {"NCCL_DEBUG": "WARN"}}]
    ok = {"model": {"node_rank": 0, "master_addr": "10.0.0.1"}, "ifname": "eth1"}
    r = adhoc("nccl_env_validate", {**ok, "sections": sections, "extra": {"NCCL_DEBGU": "INFO"}, "profile": "tcp",
                                    "fix": "Correct the names", "publish": {"nccl_env_file": "/x/nccl.env"}})
    rec = r["preflight_record"]
    assert rec["check"] == "nccl_env.variables" and rec["status"] == "fail" and "NCCL_DEBUG" in rec["detail"], r
    assert rec["fix"] == "Correct the names" and rec["data"]["drift"] == {"nccl_env_profile": "tcp"}
    # Published for the callback preflight_records to set as a host variable (the run's ansible.cfg loads it): not a fact.
    assert r["trainyard_vars"] == {"hosts": ["localhost"], "vars": {"nccl_env_file": "/x/nccl.env"}}, r
    # The records go back as the task's new records, for the same callback: not a fact either.
    assert [x["check"] for x in r["preflight_records"]] == ["nccl_env.variables"]
    assert "ansible_facts" not in r, r
    r = adhoc("nccl_env_validate", {**ok, "sections": sections, "profile": "tcp"})
    assert r["preflight_record"]["status"] == "pass"
    assert r["preflight_record"]["detail"] == "1 variables, profile tcp, NCCL_DEBUG=WARN", r
    r = adhoc("nccl_env_validate", {"sections": [], "model": {"node_rank": 0}, "ifname": ""})
    assert r["failed"] and "preflight_record" not in r, r
    assert r["msg"].startswith("localhost: cluster_model is not set.") and "localhost: no data interface" in r["msg"]
