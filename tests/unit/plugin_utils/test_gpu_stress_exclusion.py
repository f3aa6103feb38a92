"""The built-in GPU stress takes part in the node failure policy (issue 37, docs/burn-in.md): its verdict on the REAL
capture of 4 x H100 with another process on GPU 3 (docs/gpu-acceptance/stress-h100x4/stress-hog.log) flows into the
exclusion decision (plugin_utils/bad_machines.py, the action node_exclusion's core) and the record of bad machines;
site.yml runs the stress before playbooks/exclude.yml reads the records; the stress gives the job's GPUs through the
one function nccl.env uses."""

import subprocess
import sys
from pathlib import Path

import yaml

from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi
from ansible_collections.trainyard.core.plugins.module_utils import recover
from ansible_collections.trainyard.core.plugins.plugin_utils import bad_machines as bm
from ansible_collections.trainyard.core.plugins.plugin_utils import gpu_checks
from ansible_collections.trainyard.core.plugins.plugin_utils import gpu_stress_checks as gs
from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars

REPO = Path(__file__).resolve().parents[3]
CAP = REPO / "docs" / "gpu-acceptance" / "stress-h100x4"
SMI = (REPO / "tests/data/nvidia-smi/h200x4/nvidia-smi-q.xml").read_text()
HOSTS = ["node1", "node2", "node3"]


def _registered(name):
    """The capture as the role registers the stress command: its stdout is the script's log."""
    return {"rc": 0, "stdout": (CAP / name).read_text(encoding="utf-8"), "stderr": ""}


def _ident(n):
    facts = nvidia_smi.parse_query_xml(SMI)
    for g in facts["gpus"]:
        g["uuid"] = g["uuid"][:-2] + "%02d" % n
    return gpu_checks.identity_of({"nvidia_gpu_facts": facts, "machine_id": None})


def _stress_records(run_id="r1"):
    """Every node's preflight_results after the prepare play's stress: node3 ran with another process on GPU 3.
    preflight_check stamps each record with the run id."""
    recs = gs.records_of({"node1": _registered("stress.log"), "node2": _registered("stress.log"),
                          "node3": _registered("stress-hog.log")}, {}, "auto", run_id, "standard")
    return {h: [dict(rec, host=h, run=run_id)] for h, rec in recs.items()}


def _decide(policy, run_id="r1"):
    results = _stress_records(run_id)
    failed = {h: found for h, found in ((h, recover.failed_checks(r, run_id)) for h, r in results.items()) if found}
    return bm.decide(HOSTS, failed, {h: _ident(i + 1) for i, h in enumerate(HOSTS)}, bm.load(""), policy, 1,
                     now="2026-11-27T13:00:00Z", run_id=run_id, nproc_per_node=4,
                     data_addresses={h: "10.0.0.%d" % i for i, h in enumerate(HOSTS)})


def test_the_hog_capture_leaves_its_node_out_under_exclude_and_remembers_its_gpus():
    out = _decide("exclude")
    assert out["kept"] == ["node1", "node2"]
    (ex,) = out["excluded"]
    assert (ex["host"], ex["reason"]) == ("node3", "failed")
    # The first line of the stress's record, which the exclusion keeps (160 characters), names every slow GPU.
    assert ex["checks"] == ["nccl_check.gpu_stress: slow GPU(s) on node3 (% of the fleet median or expected, the "
                            "lower): GPU 3 matmul 48% copy 49%"], ex
    assert out["models"]["node2"]["world_size"] == 8 and out["models"]["node2"]["node_rank"] == 1
    (m,) = out["record"]["machines"]
    assert m["last_host"] == "node3" and m["gpu_uuids"] == _ident(3)["gpu_uuids"] and len(m["gpu_serials"]) == 4
    assert m["checks"] == ex["checks"]
    report = {"records": [r for rs in _stress_records().values() for r in rs], "failed": True,
              "failures": [r for rs in _stress_records().values() for r in rs if r["status"] == "fail"]}
    view = bm.report_view(report, dict(out, record_path="runs/bad_machines.json"))
    assert view["failed"] is False and [r["host"] for r in view["excluded_failures"]] == ["node3"]


def test_the_hog_capture_under_fail_leaves_nobody_out_and_still_remembers_the_machine():
    out = _decide("fail")
    assert out["excluded"] == [] and out["kept"] == HOSTS
    (m,) = out["record"]["machines"]
    assert m["last_host"] == "node3" and m["checks"][0].endswith("): GPU 3 matmul 48% copy 49%")
    # An earlier run's stress record in a fact cache does not count in this run.
    results = _stress_records("r0")
    assert all(recover.failed_checks(r, "r1") == [] for r in results.values())


def _tasks(path):
    return yaml.safe_load((REPO / path).read_text()) or []


def test_site_yml_stresses_the_gpus_before_the_exclusion_play():
    plays = _tasks("playbooks/site.yml")
    exclude_at = next(i for i, p in enumerate(plays) if p.get("ansible.builtin.import_playbook") == "exclude.yml")
    burnin_at = [i for i, p in enumerate(plays) for t in p.get("tasks") or []
                 if (t.get("ansible.builtin.import_role") or {}).get("name") == "nccl_check"
                 and t["ansible.builtin.import_role"].get("tasks_from") == "burnin.yml"]
    # The trainers (the parent of a sharded run selects none: docs/sharding.md).
    hosts = plays[burnin_at[0]]["hosts"]
    assert burnin_at and burnin_at[0] < exclude_at and hosts.endswith("else 'trainers' }}") and "trainyard_sharded" in hosts
    # burnin.yml -> stress_step.yml -> stress.yml (the stress and its verdict).
    steps = [t.get("ansible.builtin.include_tasks") for t in _tasks("roles/nccl_check/tasks/burnin.yml")]
    assert "stress_step.yml" in steps
    assert "stress.yml" in [t.get("ansible.builtin.include_tasks") for t in _tasks("roles/nccl_check/tasks/stress_step.yml")]
    # The role's own run (play "Measure the data path", playbooks/nccl_check.yml) stresses only when this run has not.
    again = next(t for t in _tasks("roles/nccl_check/tasks/enabled.yml")
                 if t.get("ansible.builtin.include_tasks") == "stress_step.yml")
    assert "not (_nccl_check_stress_recorded | bool)" in again["when"]


def test_recorded_counts_only_this_runs_stress():
    recs = [{"check": "nccl_check.gpu_stress", "status": "skip", "run": "r0"}, {"check": "other", "run": "r1"}]
    assert gs.recorded(recs, "r1") is False
    assert gs.recorded(recs + [{"check": "nccl_check.gpu_stress", "status": "fail", "run": "r1"}], "r1") is True
    assert gs.recorded(None, "r1") is False


def test_the_stress_and_nccl_env_give_the_job_the_same_gpus():
    section = next(s for s in nccl_vars.role_sections({}, "eth1", {"visible_devices": "2,3"})
                   if s["title"] == "devices and processes")
    assert {k: section["vars"][k] for k in ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES")} == nccl_vars.job_devices("2,3")
    assert gs.env_args("2,3") == ["--env", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "--env", "CUDA_VISIBLE_DEVICES=2,3"]
    # Empty: every GPU (nccl.env leaves the line out, the stress does not set it).
    assert nccl_vars.job_devices("")["CUDA_VISIBLE_DEVICES"] is None
    assert gs.env_args("") == ["--env", "CUDA_DEVICE_ORDER=PCI_BUS_ID"]


def test_gpu_stress_rejects_a_malformed_env_in_one_line():
    r = subprocess.run([sys.executable, str(REPO / "roles/nccl_check/files/gpu_stress.py"), "--env", "NOVALUE"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--env NOVALUE: give KEY=VALUE (e.g. --env CUDA_VISIBLE_DEVICES=0,1)" in r.stderr


def test_the_first_line_names_every_slow_gpu_and_a_broken_result():
    cap = gs.parse_output(_registered("stress-hog.log"))
    cap["gpus"][1]["hbm_copy"]["equal"] = False
    first = gs.records({"n": cap})["n"]["detail"].splitlines()[0]
    assert first == ("slow GPU(s) on n (% of the fleet median or expected, the lower): GPU 1 matmul 101% copy 100% "
                     "broken result; GPU 3 matmul 47% copy 49%")
