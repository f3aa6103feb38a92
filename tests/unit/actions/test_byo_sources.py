"""Bring your own config, checked against the sources: the "auto" tables against the installed transformers and
accelerate, the NCCL allow lists against real published cloud settings (tests/data/byo/nccl/, sources in its
README), names a component stops on, and the tcp profile's fabric check."""

import re
import shlex
from pathlib import Path

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
from ansible_collections.trainyard.core.plugins.plugin_utils import ds_config
from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars as nv
from ansible_collections.trainyard.core.plugins.plugin_utils import render_checks
from helpers import REPO, load


dv = load("action_plugins/deepspeed_validate.py", "deepspeed_validate_byo_sources")

NCCL = REPO / "tests" / "data" / "byo" / "nccl"
# transformers and accelerate as `make venv` installs them (requirements-llamafactory.txt, beside the venv).
SITE = REPO / ".cache" / "llamafactory-site"


def _source(rel):
    path = SITE / rel
    if not path.is_file():
        pytest.skip(f"{path} is absent: `make venv` installs it (requirements-llamafactory.txt)")
    return path.read_text()


def _between(text, start, end):
    i = text.index(start)
    return text[i:text.index(end, i)]


# ------------------------------------------------------------------------------------------ "auto" tables

def test_trainer_table_is_what_the_installed_transformers_fills():
    src = _source("transformers/integrations/deepspeed.py")
    cls = _between(src, "class HfTrainerDeepSpeedConfig", "\ndef ")
    fills = set(re.findall(r'fill_(?:match|only)\(\s*"([^"]+)"', cls))
    assert "optimizer.params.betas" in fills and "scheduler.params.total_num_steps" in fills  # the parse worked
    # the Trainer also builds Accelerate's DeepSpeedPlugin on the same config (training_args.py)
    assert "DeepSpeedPlugin(hf_ds_config=self.hf_deepspeed_config)" in _source("transformers/training_args.py")
    assert set(ds_config.TRAINER_AUTO) == fills | set(ds_config.PLUGIN_AUTO)


def test_plugin_table_is_accelerates_plugin_to_config_mapping():
    src = _source("accelerate/utils/dataclasses.py")
    mapping = _between(src, "plugin_to_config_mapping = {", "}")
    assert set(ds_config.PLUGIN_AUTO) == set(re.findall(r'":\s*"([^"]+)"', mapping))


def test_accelerate_table_is_what_the_installed_accelerate_fills():
    acc = _source("accelerate/accelerator.py")
    prep = _between(acc, "def _prepare_deepspeed", "deepspeed_plugin.deepspeed_config_process(")
    kwargs = prep[prep.index("config_kwargs = {"):]
    keys = set(re.findall(r'"([a-z0-9_.]+)":', kwargs)) | set(re.findall(r'config_kwargs\["([^"]+)"\]', kwargs))
    keys |= set(re.findall(r'deepspeed_plugin\.fill_match\(\s*"([^"]+)"', prep))
    mixed = _between(_source("accelerate/utils/dataclasses.py"), "def set_mixed_precision", "def set_deepspeed_weakref")
    keys |= set(re.findall(r'self\.fill_match\("([^"]+)"', mixed))
    assert {"optimizer.params.lr", "scheduler.params.total_num_steps", "bf16.enabled"} <= keys  # the parse worked
    assert set(ds_config.ACCELERATE_AUTO) == keys | set(ds_config.PLUGIN_AUTO)


def test_both_integrations_look_keys_up_by_the_literal_path():
    src = _source("accelerate/utils/deepspeed.py")
    node = _between(src, "def find_config_node", "def get_value")
    assert 'nodes = ds_key_long.split(".")' in node and "config.get(node)" in node


def test_auto_under_another_spelling_is_refused_naming_the_spelling_that_is_filled():
    cfg = {"zero_optimization": {"stage": 3, "prefetch_bucket_size": "auto", "stage3_param_persistence_threshold":
                                 "auto"}}
    _, errors = dv.fill_auto(cfg, "trainer", "ds.json")
    assert len(errors) == 1, errors
    assert errors[0].startswith("ds.json key zero_optimization.prefetch_bucket_size:")
    assert "only under the spelling zero_optimization.stage3_prefetch_bucket_size" in errors[0]


def test_plugin_keys_are_filled_under_both_and_amp_no_longer():
    cfg = {"zero_optimization": {"stage": "auto", "offload_param": {"device": "auto"},
                                 "stage3_gather_16bit_weights_on_model_save": "auto"}}
    for filler in ("trainer", "accelerate"):
        filled, errors = dv.fill_auto(cfg, filler)
        assert errors == [] and filled["zero_optimization"]["stage"] == 2
        assert filled["zero_optimization"]["offload_param"]["device"] == "none"
        assert filled["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is False
    _, errors = dv.fill_auto({"amp": {"enabled": "auto"}}, "trainer", "ds.json")
    assert errors and "neither" in errors[0]


# ------------------------------------------------------------------------------------------ published NCCL settings

def _shell_exports(text):
    env = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"] and "=" in words[1]:
            key, _, value = words[1].partition("=")
            env[key] = value
    return env


def _aws_fsdp():
    return _shell_exports((NCCL / "aws_fsdp_llama2_13b_env.lines28-47.txt").read_text())


def _gcp_tcpx_with_env():
    text = (NCCL / "gcp_tcpx_config-with-env.yaml.txt").read_text()
    return {m.group(1): shlex.split(m.group(2))[0] for m in re.finditer(r"-x (\w+)=(\S+) \\", text)
            if m.group(1) != "LD_LIBRARY_PATH"}


def _olmo_a3_mega():
    text = (NCCL / "olmo-core_augusta_env.lines114-161.txt").read_text()
    env = dict(re.findall(r'set_env_var\(\s*"(\w+)",\s*"([^"]*)"', text))
    # the one value computed at run time: the collective timeout in milliseconds
    assert re.search(r'"NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS", str\(', text)
    env["NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS"] = "1800000"
    return env


def _azure_ndv5():
    text = (NCCL / "azure_ndv5_nccl-conf.lines10-15.txt").read_text()
    return dict(line.split("=", 1) for line in _between(text, "<<'EOF'\n", "EOF\n").splitlines()[1:])


def _azure_ndv4():
    text = (NCCL / "azure_ndv4_test-nccl.lines31-64.txt").read_text()
    words = " ".join(re.findall(r'"([^"]*)"', text)).split()
    env = {}
    for flag, arg in zip(words, words[1:]):
        if flag == "-x" and "=" in arg:
            key, _, value = arg.partition("=")
            env[key] = value
    env.pop("LD_LIBRARY_PATH")
    return env


PUBLISHED = {"aws-fsdp-efa": (_aws_fsdp, {"FI_PROVIDER", "FI_EFA_SET_CUDA_SYNC_MEMOPS", "NCCL_SOCKET_IFNAME"}),
             "gcp-a3-high-tcpx": (_gcp_tcpx_with_env, {"NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX",
                                                       "NCCL_GPUDIRECTTCPX_FORCE_ACK",
                                                       "NCCL_GPUDIRECTTCPX_TX_COMPLETION_NANOSLEEP"}),
             "gcp-a3-mega-tcpxo": (_olmo_a3_mega, {"NCCL_USE_SNAP", "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY",
                                                   "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE"}),
             "azure-ndv5": (_azure_ndv5, {"NCCL_IB_PCI_RELAXED_ORDERING", "NCCL_TOPO_FILE", "NCCL_IGNORE_CPU_AFFINITY"}),
             "azure-ndv4": (_azure_ndv4, {"UCX_TLS", "UCX_NET_DEVICES", "UCX_IB_PCI_RELAXED_ORDERING", "NCCL_SHM_DISABLE"})}


@pytest.mark.parametrize("case", sorted(PUBLISHED))
def test_published_cloud_settings_pass_unchanged_and_round_trip(case, tmp_path):
    parse, must_have = PUBLISHED[case]
    env = parse()
    assert must_have <= set(env), sorted(env)
    _, flat, errors = nv.build_env([], env, (), "ib" if case.startswith("azure") else "tcp")
    assert errors == [] and flat == env
    path = tmp_path / "nccl.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in flat.items()))
    read, problems = tr.parse_env_file(path.read_text(), str(path))
    assert problems == [] and read == env


def test_the_published_values_that_carry_list_separators_are_kept():
    assert _aws_fsdp()["NCCL_SOCKET_IFNAME"] == "^docker,lo,veth,eth"
    assert _gcp_tcpx_with_env()["NCCL_GPUDIRECTTCPX_RX_BINDINGS"].count(";") == 3
    assert _olmo_a3_mega()["NCCL_FASTRAK_IFNAME"] == "enp6s0,enp7s0,enp13s0,enp14s0,enp134s0,enp135s0,enp141s0,enp142s0"


# Names the lists carried before they were checked against the components' source; none of them is read by any
# libfabric release from 1.14 to 2.6, aws-ofi-nccl or UCX.
@pytest.mark.parametrize("name", ["FI_EFA_DEVICE_RDMA", "FI_EFA_ENABLE_WRITE_IN_ORDER", "FI_EFA_HOMOGENEOUS_PEERS",
                                  "FI_EFA_MAX_RNR_BACKOFF_WAIT_TIME_CAP", "FI_EFA_READ_SEGMENT_SIZE",
                                  "FI_EFA_RNR_RETRY", "FI_EFA_USE_SHM", "FI_EFA_WAIT_FOR_REMOTE_ACK",
                                  "OFI_NCCL_TRACE", "UCX_TCP_CM_REUSEADDR"])
def test_names_no_component_reads_are_unknown(name):
    assert name not in nv.KNOWN and "nccl_env_allow_unknown" in nv.check_name(name)


@pytest.mark.parametrize("name", ["FI_EFA_IFACE", "FI_HMEM_CUDA_USE_GDRCOPY", "FI_TCP_IFACE", "FI_VERBS_IFACE",
                                  "FI_OFI_RXM_USE_SRX", "OFI_NCCL_FORCE_PRODUCT_NAME", "NCCL_SHARP_DISABLE",
                                  "NCCL_UCX_TLS", "SHARP_COLL_ENABLE_MCAST", "HF_HUB_ETAG_TIMEOUT"])
def test_names_read_by_the_components_are_known(name):
    assert nv.check_name(name) is None


def test_a_name_the_plugin_stops_on_is_refused_with_its_replacement():
    why = nv.check_name("OFI_NCCL_RDMA_MIN_POSTED_BOUNCE_BUFFERS")
    assert "removed from aws-ofi-nccl" in why and "OFI_NCCL_RDMA_MIN_POSTED_CONTROL_BUFFERS" in why


def test_the_efa_profile_leaves_device_rdma_to_libfabric():
    from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars

    assert nccl_vars.role_sections({}, "eth0", {"profile": "efa"})[2]["vars"] == {"FI_PROVIDER": "efa"}


# ------------------------------------------------------------------------------------------ tcp fabric check

@pytest.mark.parametrize("spec,chosen", [("eth1", ["eth1"]), ("=eth", []), ("eth", ["eth0", "eth1"]),
                                         ("^docker,lo,veth,eth", ["ens5"]), ("^=eth0", ["docker0", "ens5", "eth1",
                                                                                         "lo"])])
def test_socket_ifname_selects_as_nccl_does(spec, chosen):
    assert render_checks.socket_ifaces(spec, ["lo", "eth0", "eth1", "docker0", "ens5"]) == chosen


@pytest.mark.parametrize("ifname,ifaces,status,text", [
    ("eth1", ["lo", "eth0", "eth1"], "pass", "sockets over eth1"),
    ("ens5", ["lo", "eth0", "eth1"], "fail", "NCCL_SOCKET_IFNAME=ens5 selects no interface of the node"),
    ("eth1", None, "skip", "not listed"),
    ("", ["eth0"], "skip", "NCCL picks"),
])
def test_tcp_fabric_verdict(ifname, ifaces, status, text):
    v = render_checks.nccl_fabric("tcp", ifname=ifname, net_ifaces=ifaces)
    assert v["status"] == status and text in v["detail"], v
    assert bool(v["fix"]) == (status == "fail")
    if status == "fail":
        assert "nccl_env_socket_ifname" in v["fix"]


def test_corpus_readme_names_every_file():
    readme = (REPO / "tests" / "data" / "byo" / "README.md").read_text()
    for path in Path(NCCL).iterdir():
        assert f"`nccl/{path.name}`" in readme, path.name
