"""The vast_instances inventory plugin (inventory_plugins/vast_instances.py): the pure builder on the provider
CLI's own output format (tests/data/vast/), and the plugin run by the real ansible-inventory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, load

vast = load("inventory_plugins/vast_instances.py", "vast_instances_plugin")
DATA = REPO / "tests/data/vast"


def rows():
    return json.loads((DATA / "show-instances.json").read_text())


def overlays():
    return json.loads((DATA / "show-overlays.json").read_text())


def test_trainers_from_the_cli_output_with_the_reasons_for_what_is_left_out():
    out = vast.build(rows(), overlays(), overlay="trainnet")
    names = [n for n, _ in out["hosts"]]
    assert names == ["vast-31000377", "vast-31000412"]  # ranks by id (the default order_by)
    head = dict(out["hosts"])["vast-31000412"]
    # Direct SSH port mapping wins (as vastai ssh-url); the other one goes through the proxy.
    assert (head["ansible_host"], head["ansible_port"], head["vast_ssh"]) == ("198.51.100.40", 40022, "direct")
    worker = dict(out["hosts"])["vast-31000377"]
    assert (worker["ansible_host"], worker["ansible_port"], worker["vast_ssh"]) == ("ssh6.vast.ai", 30377, "proxy")
    assert (head["data_address"], worker["data_address"]) == ("10.0.0.1", "10.0.0.2")
    assert (head["vast_gpu_name"], head["vast_num_gpus"], head["ansible_user"]) == ("H100 SXM", 8, "root")
    assert dict(out["excluded"]) == {
        31000501: "actual_status exited (intended_status stopped), not running",
        31000502: "actual_status loading (intended_status running), not running",
        31000610: "on overlay evalnet, not trainnet"}
    assert out["warnings"] == []


def test_rank_order_follows_the_chosen_field_and_is_stable():
    by_label = vast.build(rows(), overlays(), overlay="trainnet", order_by="label", hostname_field="label")
    assert [(n, v["node_rank"]) for n, v in by_label["hosts"]] == [("vast-head", 0), ("vast-worker", 1)]
    shuffled = list(reversed(rows()))
    assert vast.build(shuffled, overlays(), overlay="211", order_by="label")["hosts"] == \
        vast.build(rows(), overlays(), overlay="trainnet", order_by="label")["hosts"]
    # start_date: the older instance first.
    assert [n for n, _ in vast.build(rows(), overlays(), overlay="trainnet", order_by="start_date")["hosts"]] == \
        ["vast-31000412", "vast-31000377"]


def test_without_the_overlays_file_the_subnet_decides():
    out = vast.build(rows(), None, overlay_subnet="10.0.0.0/24", statuses=("running", "exited"))
    assert sorted(n for n, _ in out["hosts"]) == ["vast-31000377", "vast-31000412", "vast-31000501"]
    assert dict(out["excluded"])[31000610].startswith("no address in the overlay subnet 10.0.0.0/24")


def test_ssh_modes_and_jupyter_port():
    row = dict(rows()[0], image_runtype="jupyter jupyter_direc")
    assert vast.ssh_endpoint(row, "proxy") == ("ssh6.vast.ai", 30413, "proxy")  # ssh_port + 1, as ssh-url
    no_direct = dict(rows()[1])
    assert vast.ssh_endpoint(no_direct, "direct")[0] is None
    out = vast.build(rows(), overlays(), overlay="trainnet", ssh_mode="direct")
    assert [n for n, _ in out["hosts"]] == ["vast-31000412"]
    assert "no direct SSH port" in dict(out["excluded"])[31000377]


def test_mixed_gpus_warn():
    mixed = rows()
    mixed[1] = dict(mixed[1], num_gpus=4, gpu_name="H100 PCIE")
    warnings = vast.build(mixed, overlays(), overlay="trainnet")["warnings"]
    assert len(warnings) == 1 and "4x H100 PCIE, 8x H100 SXM" in warnings[0]


@pytest.mark.parametrize("kwargs,needle", [
    ({"overlay": "nope"}, "overlay 'nope' is not in the overlays file (overlays: trainnet, evalnet)"),
    ({}, "overlay is not set and 2 overlays hold instances"),
])
def test_bad_overlay_choice_is_one_line_naming_the_fix(kwargs, needle):
    with pytest.raises(vast.VastError) as err:
        vast.build(rows(), overlays(), **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_bad_input_is_one_line():
    with pytest.raises(vast.VastError, match="neither overlays_file nor overlay_subnet"):
        vast.build(rows(), None)
    with pytest.raises(vast.VastError, match="is not a CIDR"):
        vast.build(rows(), None, overlay_subnet="10.0.0.0/33")
    with pytest.raises(vast.VastError, match="not JSON"):
        vast.load_rows("Error: 401 Unauthorized", "instances_file x", "instances")
    same = [dict(r, label="a") for r in rows()[:2]]
    with pytest.raises(vast.VastError, match="both name the host vast-a"):
        vast.build(same, overlays(), overlay="trainnet", hostname_field="label")
    # The API's {"instances": [...]} object is accepted as well as the CLI's list.
    assert vast.load_rows(json.dumps({"instances": rows()}), "x", "instances") == rows()


def inventory(tmp_path, config):
    for f in ("show-instances.json", "show-overlays.json"):
        shutil.copy(DATA / f, tmp_path / f.replace("show-", "").replace(".json", ".vast.json"))
    (tmp_path / "c.vast_instances.yml").write_text(config)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    return subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(tmp_path), "--list"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_plugin_through_ansible_inventory(tmp_path):
    r = inventory(tmp_path, "plugin: vast_instances\ninstances_file: instances.vast.json\n"
                            "overlays_file: overlays.vast.json\noverlay: trainnet\norder_by: label\n"
                            "host_vars: {ansible_ssh_private_key_file: /k}\n")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["trainers"]["hosts"] == ["vast-31000412", "vast-31000377"]
    assert data["_meta"]["hostvars"]["vast-31000377"]["ansible_ssh_private_key_file"] == "/k"
    assert "instance 31000610 left out: on overlay evalnet, not trainnet" in r.stderr
    # The raw JSON beside the configuration is the plugin's input, never parsed as an inventory itself.
    assert "Unable to parse" not in r.stderr


def test_plugin_error_names_the_file_and_the_fix(tmp_path):
    r = inventory(tmp_path, "plugin: vast_instances\ninstances_file: missing.vast.json\noverlay_subnet: 10.0.0.0/24\n")
    assert "instances_file" in r.stderr and "vastai show instances --raw >" in r.stderr
    assert "Traceback" not in r.stderr
