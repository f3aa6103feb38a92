"""The stand-in nvidia-smi / nv-fabricmanager (tests/sim/standin/): every argument form the product uses, and
each fault of the fault file, parsed back with module_utils/nvidia_smi.py."""

import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi as ns

REPO = Path(__file__).resolve().parents[3]
STANDIN = REPO / "tests/sim/standin"
DATA = REPO / "tests/data/nvidia-smi/h200x4"


@pytest.fixture
def smi(tmp_path):
    fault = tmp_path / "fault"

    def run(*args, faults=(), host="node1", prog="nvidia-smi"):
        if faults:
            fault.write_text("".join(f + "\n" for f in faults))
        elif fault.exists():
            fault.unlink()
        env = {"TRAINYARD_STANDIN_DATA": str(DATA), "TRAINYARD_STANDIN_FAULT": str(fault),
               "TRAINYARD_STANDIN_HOST": host, "PATH": "/usr/bin:/bin"}
        return subprocess.run([sys.executable, str(STANDIN / prog), *args], env=env, capture_output=True, text=True,
                              timeout=30)
    return run


def facts(r):
    assert r.returncode == 0, r.stderr
    return ns.parse_query_xml(r.stdout)


def test_names_itself_a_stand_in(smi):
    r = smi("--version")
    assert "STAND-IN" in r.stdout and "not NVIDIA software" in r.stdout and "580.159.04" in r.stdout
    for prog in ("nvidia-smi", "nv-fabricmanager"):
        assert "STAND-IN" in (STANDIN / prog).read_text().splitlines()[2]
    assert "stand-in" in (STANDIN / "README.md").read_text().lower()


def test_healthy_replay_is_the_capture_except_the_per_node_uuids(smi):
    real = ns.parse_query_xml((DATA / "nvidia-smi-q.xml").read_text())
    f = facts(smi("-q", "-x"))
    strip = [{k: v for k, v in g.items() if k != "uuid"} for g in f["gpus"]]
    assert strip == [{k: v for k, v in g.items() if k != "uuid"} for g in real["gpus"]]
    assert [g["uuid"][:-12] for g in f["gpus"]] == [g["uuid"][:-12] for g in real["gpus"]]
    assert not set(g["uuid"] for g in f["gpus"]) & set(g["uuid"] for g in real["gpus"])
    other = facts(smi("-q", "-x", host="node2"))
    assert not set(g["uuid"] for g in f["gpus"]) & set(g["uuid"] for g in other["gpus"])
    assert facts(smi("-q", "-x", faults=["uuid-from=captured"]))["gpus"] == real["gpus"]


def test_list_csv_topo_nvlink_text_agree_with_the_xml(smi):
    f = facts(smi("-q", "-x"))
    assert smi("-L").stdout.splitlines() == [f"GPU {g['index']}: NVIDIA H200 (UUID: {g['uuid']})" for g in f["gpus"]]
    csv = smi("--query-gpu=index,uuid,pci.bus_id,name,driver_version,memory.total,fabric.state,fabric.status",
              "--format=csv,noheader").stdout
    real_csv = (DATA / "nvidia-smi-query-gpu.csv").read_text()
    for g in f["gpus"]:
        csv = csv.replace(g["uuid"], "U")
    for line in real_csv.splitlines():
        real_csv = real_csv.replace(line.split(", ")[1], "U")
    assert csv == real_csv
    assert smi("topo", "-m").stdout == (DATA / "nvidia-smi-topo-m.txt").read_text()
    links = ns.parse_nvlink_status(smi("nvlink", "-s").stdout)
    assert [v["active"] for v in links.values()] == [18] * 4
    text = smi("-q").stdout
    assert all(g["uuid"] in text for g in f["gpus"]) and "Driver Version" in text


def test_unknown_form_and_field_fail_like_nvidia_smi(smi):
    assert smi("--bogus").returncode == 2
    r = smi("--query-gpu=nope", "--format=csv")
    assert r.returncode == 2 and 'Field "nope" is not a valid field to query.' in r.stderr


@pytest.mark.parametrize("fault, check", [
    ("fabric=In Progress", lambda f: {(g["fabric"]["state"], g["fabric"]["status"]) for g in f["gpus"]}
     == {("In Progress", "N/A")}),
    ("fabric=Failure", lambda f: {g["fabric"]["status"] for g in f["gpus"]} == {"Failure"}),
    ("fabric=Failure@2", lambda f: [ns.fabric_ok(g) for g in f["gpus"]] == [True, True, False, True]),
    ("driver=570.86.15", lambda f: f["driver_version"] == "570.86.15"),
    ("gpus=3", lambda f: len(f["gpus"]) == 3 and f["attached_gpus"] == 3),
    ("duplicate-pci", lambda f: ns.duplicates([g["pci_bus_id"] for g in f["gpus"]]) == ["00000000:00:06.0"]),
])
def test_each_fault_shows_in_the_xml(smi, fault, check):
    assert check(facts(smi("-q", "-x", faults=[fault])))


def test_faults_follow_into_the_other_forms(smi):
    faults = ["gpus=2", "driver=570.86.15", "fabric=In Progress@1"]
    assert len(smi("-L", faults=faults).stdout.splitlines()) == 2
    rows = smi("--query-gpu=index,driver_version,fabric.state", "--format=csv,noheader", faults=faults).stdout
    assert rows == "0, 570.86.15, Completed\n1, 570.86.15, In Progress\n"
    topo = smi("topo", "-m", faults=faults).stdout.splitlines()
    assert topo[1].split("\t")[:3] == ["GPU0", " X ", "NV18"] and not any(line.startswith("GPU2") for line in topo)
    text = smi("-q", faults=faults).stdout
    assert "570.86.15" in text and text.count("\nGPU 0000") == 2 and "In Progress" in text
    assert len(ns.parse_nvlink_status(smi("nvlink", "-s", faults=faults).stdout)) == 2
    down = ns.parse_nvlink_status(smi("nvlink", "-s", faults=["nvlink=down@3"]).stdout)
    assert [v["inactive"] for v in down.values()] == [0, 0, 0, 18]


@pytest.mark.parametrize("fault, rc, text", [
    ("error", 9, "couldn't communicate with the NVIDIA driver"),
    ("missing", 9, "couldn't communicate with the NVIDIA driver"),
    ("no-devices", 6, "No devices were found"),
    ("nonsense", 2, "unknown fault 'nonsense'"),
])
def test_failing_faults_exit_like_nvidia_smi(smi, fault, rc, text):
    r = smi("-q", "-x", faults=[fault])
    assert r.returncode == rc and text in r.stdout + r.stderr
    cause, _ = ns.classify_failure(r.returncode, r.stdout + r.stderr)
    assert cause


def test_fabric_manager_version_follows_the_fault_file(smi):
    assert ns.parse_fabricmanager_version(smi("--version", prog="nv-fabricmanager").stdout) == "580.159.04"
    r = smi("--version", prog="nv-fabricmanager", faults=["driver=570.86.15"])
    assert ns.parse_fabricmanager_version(r.stdout) == "570.86.15"
    r = smi("--version", prog="nv-fabricmanager", faults=["fabricmanager=580.95.05"])
    assert ns.parse_fabricmanager_version(r.stdout) == "580.95.05"
    assert smi("--version", prog="nv-fabricmanager", faults=["fabricmanager=absent"]).returncode == 127
