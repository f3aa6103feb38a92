"""module_utils/burnin.py: the tiers' time on a cluster (with the source of each estimate), the nvidia_driver.burnin
record (skip with the reason on the CPU sim, DCGM's verdict where dcgmi ran) and the gpu_burnin module's docs."""

import json
from pathlib import Path

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import burnin

DATA = Path(__file__).resolve().parents[2] / "data/dcgm"

# A dcgmi diag -j result written after DCGM 3.x's layout ("DCGM GPU Diagnostic", test categories, tests with results
# per GPU), not a capture (the capture, all passing, is tests/data/dcgm/): the parser relies only on objects with a
# name and a list of results carrying a status. One GPU fails the memory test.
DCGM = {"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]},
    {"category": "Hardware", "tests": [{"name": "GPU Memory", "results": [
        {"gpu_id": "0", "status": "Pass"},
        {"gpu_id": "1", "status": "Fail", "warnings": [{"warning": "Found 4 uncorrectable memory errors"}]}]}]}]}}


def test_estimate_sums_the_documented_per_node_times_over_rounds_of_forks():
    q = burnin.estimate("quick", 3, 64)
    assert q["seconds"] == 10 and q["rounds"] == 1 and "benchmarks" in q["sources"]["quick"]
    s = burnin.estimate("standard", 130, 64)
    assert s["rounds"] == 3 and s["seconds"] == 3 * 130 and "about 6 min" in s["text"]
    assert "two minutes" in s["sources"]["standard"] and "docs.nvidia.com" in s["sources"]["standard"]
    assert burnin.estimate("long", 2, 64)["per_node_s"] == 910
    with pytest.raises(ValueError, match="cluster_burnin_tier is 'slow'. Fix"):
        burnin.estimate("slow", 2)


def test_estimate_covers_the_built_in_stress_where_dcgmi_is_absent():
    s = burnin.estimate("standard", 2, 64, gpus=8, stress_s=20)
    # 8 x (20 + 0.5) + 10 = 174 s, longer than DCGM level 2's 120 s: it counts.
    assert s["per_node_s"] == 10 + 174 and "built-in stress 8 GPU(s) x 20 s = 174 s" in s["text"]
    assert "wall_s 81.1" in s["sources"]["stress"]
    long = burnin.estimate("long", 2, 64, gpus=4, stress_s=300)
    assert long["per_node_s"] == 10 + 1212 and "about 20 min" in long["text"]
    assert burnin.estimate("standard", 2, 64, gpus=1, stress_s=20)["per_node_s"] == 130  # DCGM's 120 s is longer
    assert "stress" not in burnin.estimate("quick", 2, 64, gpus=8, stress_s=20)["text"]


def test_burnin_record_skips_with_the_reason_without_gpu_or_dcgmi():
    assert burnin.burnin_record("n", "quick", True)["status"] == "skip"
    rec = burnin.burnin_record("cpu1", "standard", False)
    assert rec["status"] == "skip" and "no GPU device" in rec["detail"] and "level 2" in rec["detail"]
    rec = burnin.burnin_record("g1", "long", True, dcgmi=None)
    assert rec["status"] == "skip" and "dcgmi is not installed" in rec["detail"] and "level 3" in rec["detail"]
    assert "built-in matmul/HBM stress runs instead" in rec["detail"] and "nccl_check.gpu_stress" in rec["detail"]


def test_dcgm_failure_names_the_test_and_gpu():
    rec = burnin.burnin_record("g1", "standard", True, "/usr/bin/dcgmi", 226, json.dumps(DCGM))
    assert rec["status"] == "fail"
    assert "GPU Memory GPU 1 Fail: Found 4 uncorrectable memory errors" in rec["detail"]
    ok = json.loads(json.dumps(DCGM))
    ok["DCGM GPU Diagnostic"]["test_categories"][1]["tests"][0]["results"][1] = {"gpu_id": "1", "status": "Pass"}
    assert burnin.burnin_record("g1", "standard", True, "/usr/bin/dcgmi", 0, json.dumps(ok))["status"] == "pass"
    bad = burnin.burnin_record("g1", "standard", True, "/usr/bin/dcgmi", 1, "Error: unable to connect to host engine")
    assert bad["status"] == "fail" and "nv-hostengine" in bad["fix"]
    assert burnin.dcgm_argv("/usr/bin/dcgmi", "long") == ["/usr/bin/dcgmi", "diag", "-r", "3", "-j"]


def test_dcgm_real_output_with_text_before_the_document_passes():
    # NVIDIA's own "real output" of dcgmi diag -j (DCGM 3.1.0, 8 GPUs; tests/data/dcgm/README.md): a warning line
    # before the JSON, null entries between the tests, gpu_ids as a list in a string and as numbers.
    text = (DATA / "dcgmi-diag-3.1.0-8gpu.out").read_text()
    rec = burnin.burnin_record("h1", "standard", True, "/usr/bin/dcgmi", 0, text)
    assert rec["status"] == "pass", rec
    assert "17 test result(s), none failed" in rec["detail"]
    tests = {(r["test"], r["gpu"]) for r in rec["data"]["results"]}
    assert ("Inforom", "0,1,2,3,4,5,6,7") in tests and ("software", "7") in tests
    # The same output with one GPU's software test failing names that GPU.
    failing = text.replace('"gpu_ids": 5,\n\t\t\t\t\t\t\t\t"status": "PASS"', '"gpu_ids": 5,\n\t\t\t\t\t\t\t\t"status": "FAIL"')
    assert failing != text
    bad = burnin.burnin_record("h1", "standard", True, "/usr/bin/dcgmi", 226, failing)
    assert bad["status"] == "fail" and "software GPU 5 FAIL" in bad["detail"]
