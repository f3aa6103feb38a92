"""library/nvidia_gpu_facts.py run by real Ansible (ad hoc, local connection) against the stand-in nvidia-smi."""

import json
import os
import socket
import subprocess
import sys

import pytest

from helpers import BIN, REPO
ANSIBLE = BIN / "ansible"


def run_module(tmp_path, args="", faults=(), path_extra=True, check=False):
    fault = tmp_path / "fault"
    fault.write_text("".join(f + "\n" for f in faults))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1",
               TRAINYARD_STANDIN_DATA=str(REPO / "tests/data/nvidia-smi/h200x4"),
               TRAINYARD_STANDIN_FAULT=str(fault), TRAINYARD_STANDIN_HOST="n1",
               PATH=(f"{REPO / 'tests/sim/standin'}:" if path_extra else "") + "/usr/bin:/bin")
    argv = [str(ANSIBLE), "localhost", "-c", "local", "-i", "localhost,", "-m", "nvidia_gpu_facts", "-a", args,
            "-e", "ansible_python_interpreter=" + sys.executable]
    if check:
        argv.append("--check")
    r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    head, sep, body = r.stdout.partition(" => ")
    assert sep, r.stdout + r.stderr
    res = json.loads(body)
    res["failed"] = "FAILED!" in head  # the ad hoc line says it; 2.19 leaves the key out of the printed result
    return res


pytestmark = pytest.mark.skipif(not ANSIBLE.exists(), reason="needs the controller venv (make venv)")


def test_facts_from_the_stand_in_in_check_mode(tmp_path):
    res = run_module(tmp_path, check=True)
    assert not res.get("failed") and res["changed"] is False
    assert "ansible_facts" not in res  # nothing for the persistent fact cache
    f = res["nvidia_gpu_facts"]
    assert (f["driver_version"], f["cuda_version"], f["gpu_count"]) == ("580.159.04", "13.0", 4)
    assert [g["pci_bus_id"] for g in f["gpus"]] == [f"00000000:00:0{i}.0" for i in (6, 7, 8, 9)]
    assert f["gpus"][0]["nvlink"]["active"] == 18
    assert f["fabricmanager_version"] == "580.159.04" and f["fabricmanager_source"] == "binary"
    assert f["nvswitch"]["present"] and f["fabric_applicable"]
    assert f["nvidia_smi"].endswith("tests/sim/standin/nvidia-smi")


def test_driver_not_loaded_names_the_node_and_cause(tmp_path):
    res = run_module(tmp_path, faults=["error"])
    assert res["failed"]
    assert res["msg"].startswith(socket.gethostname() + ":")
    assert "kernel module is not loaded" in res["cause"] and "exit 9" in res["msg"] and "Fix:" in res["msg"]


def test_missing_nvidia_smi(tmp_path):
    res = run_module(tmp_path, args="nvidia_smi=/nonexistent/nvidia-smi")
    assert res["failed"] and "not installed" in res["msg"]


def test_no_fabric_manager_and_no_nvlink_call(tmp_path):
    res = run_module(tmp_path, args="nvlink=false", faults=["fabricmanager=absent"])
    f = res["nvidia_gpu_facts"]
    assert f["fabricmanager_version"] is None and f["gpus"][0]["nvlink"] is None


def test_bytes_that_are_not_utf8_do_not_crash_the_module(tmp_path):
    res = run_module(tmp_path, faults=["bad-bytes"])
    assert not res["failed"], res
    f = res["nvidia_gpu_facts"]
    assert f["gpu_count"] == 4 and f["gpus"][0]["name"] == "NVIDIA H200 \ufffd\ufffd\ufffd"


def test_mig_mode_reaches_the_facts(tmp_path):
    f = run_module(tmp_path, faults=["mig=Enabled@2"])["nvidia_gpu_facts"]
    assert [g["mig_mode"] for g in f["gpus"]] == ["Disabled", "Disabled", "Enabled", "Disabled"]
    assert [g["mig_devices"] for g in f["gpus"]] == [0, 0, 1, 0]


def test_one_call_keeps_the_device_order_and_reads_the_health(tmp_path):
    env = tmp_path / "environment"
    env.write_text('PATH="/usr/bin"\nexport CUDA_DEVICE_ORDER=FASTEST_FIRST\n')
    args = f"environment_file={env} set_device_order=true health=true"
    res = run_module(tmp_path, args, check=True)  # check mode: says it would write, writes nothing
    assert res["changed"] and res["device_order"] == "FASTEST_FIRST" and "FASTEST_FIRST" in env.read_text()
    res = run_module(tmp_path, args)
    assert not res.get("failed") and res["changed"] and res["device_order"] == "PCI_BUS_ID"
    assert env.read_text() == 'PATH="/usr/bin"\nCUDA_DEVICE_ORDER=PCI_BUS_ID\n'
    health = res["health"]
    assert health["smi_error"] == "" and len(health["gpus"]) == 4 and "events" in health["kernel"]
    assert run_module(tmp_path, f"environment_file={env}")["device_order"] == "PCI_BUS_ID"


def test_health_and_device_order_come_back_when_nvidia_smi_fails(tmp_path):
    env = tmp_path / "environment"
    res = run_module(tmp_path, f"environment_file={env} set_device_order=true health=true", faults=["error"])
    assert res["failed"] and "exit 9" in res["health"]["smi_error"] and res["health"]["gpus"] == []
    assert res["device_order"] == "PCI_BUS_ID" and env.read_text() == "CUDA_DEVICE_ORDER=PCI_BUS_ID\n"


def test_identity_and_gpudirect_read_come_back_also_when_nvidia_smi_fails(tmp_path):
    ok = run_module(tmp_path, "gpudirect=true", faults=["nvlink-errors=2@3"])
    assert [g["serial"] for g in ok["nvidia_gpu_facts"]["gpus"]][0] == "1654924120994"
    assert ok["gpudirect"]["nvlink_errors"]["3"]["0"]["Recovery Errors"] == 2
    raw = next((open(p).read().strip() for p in ("/etc/machine-id", "/var/lib/dbus/machine-id")
                if os.path.exists(p) and open(p).read().strip()), None)
    if raw:  # machine-id(5): the id itself never leaves the machine, a keyed hash of it does
        assert ok["machine_id"] and len(ok["machine_id"]) == 32 and raw not in json.dumps(ok)
    failed = run_module(tmp_path, "gpudirect=true", faults=["error"])
    assert failed["failed"] and "machine_id" in failed and "ib_ports" in failed["gpudirect"]
