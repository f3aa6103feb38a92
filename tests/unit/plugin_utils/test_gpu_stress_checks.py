"""plugin_utils/gpu_stress_checks.py on the real capture of 4 x H100 80GB HBM3 (docs/gpu-acceptance/stress-h100x4/):
every GPU alone passes; with another process on GPU 3, GPU 3 is named slow with its figures, clock and throttle reason.
The CPU sim's result (no CUDA device) is a skip, never a pass."""

import json
from pathlib import Path

from ansible_collections.trainyard.core.plugins.plugin_utils import gpu_stress_checks as gs

CAP = Path(__file__).resolve().parents[3] / "docs" / "gpu-acceptance" / "stress-h100x4"


def _cap(name):
    return json.loads((CAP / name).read_text(encoding="utf-8"))


def _registered(name):
    """The capture as the nccl_check role registers the command: its stdout is the script's log."""
    return {"rc": 0, "stdout": (CAP / name).read_text(encoding="utf-8"), "stderr": ""}


def test_the_table_cites_the_datasheet_and_the_measured_fraction_for_h100_sxm():
    e = gs.expectation("NVIDIA H100 80GB HBM3")
    assert e["model"] == "H100 SXM" and e["peak_tflops"] == 989.4 and e["peak_gbps"] == 3350.0
    assert e["tflops"] == 678.0 and e["gbps"] == 3015.0
    assert "1,979 TFLOPS with sparsity" in e["source"] and "stress-h100x4/stress.json" in e["source"]
    assert gs.expectation("NVIDIA H100 PCIe")["model"] == "H100 PCIe"
    assert gs.expectation("NVIDIA H200")["model"] == "H200 SXM" and "estimate" in gs.expectation("NVIDIA H200")["source"]
    assert gs.expectation("NVIDIA A100-SXM4-80GB")["model"] == "A100 80GB SXM"
    assert gs.expectation("NVIDIA A100-PCIE-40GB")["model"] == "A100 40GB"
    assert gs.expectation("Tesla T4") is None


def test_every_gpu_alone_passes_against_the_median_and_the_table():
    rec = gs.records({"gpu1": gs.parse_output(_registered("stress.log"))})["gpu1"]
    assert rec["check"] == "nccl_check.gpu_stress" and rec["status"] == "pass", rec["detail"]
    assert "4 x NVIDIA H100 80GB HBM3 on gpu1: bf16 matmul 675.7-679.1 TFLOP/s, HBM copy 3011.1-3017 GB/s" in rec["detail"]
    assert "678 TFLOP/s and 3015 GB/s expected for H100 SXM" in rec["detail"]
    assert rec["fix"] == "" and [g["status"] for g in rec["data"]["gpus"]] == ["pass"] * 4


def test_a_gpu_shared_with_another_process_is_named_with_its_numbers():
    rec = gs.records({"gpu1": _cap("stress-hog-gpu3.json")})["gpu1"]
    assert rec["status"] == "fail"
    d = rec["detail"]
    assert "gpu1 GPU 3 (GPU-5143d391-f87c-5db8-0849-944f52c1a186)" in d
    assert "bf16 matmul 323.7 TFLOP/s = 47% of the fleet median 682.6 (4 x NVIDIA H100 80GB HBM3)" in d
    assert "48% of the 678 expected for H100 SXM" in d
    assert "HBM copy 1469.8 GB/s = 49% of the fleet median" in d
    assert "SM clock 1410/1980 MHz, throttle reasons 0x4 (SW power cap)" in d
    assert "GPU 0" not in d and "GPU 2 " not in d
    assert [g["status"] for g in rec["data"]["gpus"]] == ["pass", "pass", "pass", "fail"]
    assert "exclude" in rec["fix"]


def test_the_fleet_median_spans_nodes_so_a_node_of_slow_gpus_is_named():
    good, slow = _cap("stress.json"), _cap("stress-hog-gpu3.json")
    for g in slow["gpus"]:  # every GPU of one node at GPU 3's figures: its own median would hide it
        g.update(matmul=dict(g["matmul"], tflops=600.0), hbm_copy=dict(g["hbm_copy"], gbps=2000.0))
    recs = gs.records({"n1": good, "n2": good, "n3": slow})
    assert recs["n1"]["status"] == "pass" and recs["n3"]["status"] == "warn"
    assert "n3 GPU 0" in recs["n3"]["detail"] and "2000 GB/s = 66% of the fleet median" in recs["n3"]["detail"]


def test_a_broken_result_fails_whatever_the_speed():
    cap = _cap("stress.json")
    cap["gpus"][1]["hbm_copy"]["equal"] = False
    rec = gs.records({"g": cap})["g"]
    assert rec["status"] == "fail" and "g GPU 1" in rec["detail"] and "differs from its source" in rec["detail"]


def test_the_cpu_sim_and_a_run_that_did_not_complete():
    sim = gs.parse_output({"rc": 0, "stdout": 'trainyard-gpu-stress: {"seconds": 20.0, "skip": "no CUDA device '
                                              'visible to torch 2.5.1+cpu"}\n'})
    rec = gs.records({"node1": sim})["node1"]
    assert rec["status"] == "skip" and "no CUDA device visible to torch" in rec["detail"]
    rec = gs.records({"node1": gs.parse_output({"rc": 124, "stdout": "", "stderr": "Terminated"})})["node1"]
    assert rec["status"] == "fail" and "did not complete: timed out: Terminated" in rec["detail"] and rec["fix"]
    rec = gs.records({"node1": gs.parse_output({"skipped": True, "skip_reason": "Conditional result was False"})})
    assert rec["node1"]["status"] == "skip"


def test_throttle_text_decodes_the_reasons():
    assert gs.throttle_text({"clocks.sm": "1980", "clocks.max.sm": "1980",
                             "clocks_throttle_reasons.active": "0x0000000000000000"}) == \
        "SM clock 1980/1980 MHz, no throttle reason"
    assert "HW slowdown, HW thermal slowdown" in gs.throttle_text({"clocks_throttle_reasons.active": "0x48"})
    assert gs.throttle_text({}) == ""


def test_auto_skips_the_nodes_where_dcgm_ran_this_run_and_names_it():
    dcgm = [{"check": "nvidia_driver.burnin", "status": "pass", "run": "r2", "data": {"level": 2}}]
    old = [{"check": "nvidia_driver.burnin", "status": "pass", "run": "r1", "data": {"level": 2}}]
    assert "DCGM's diagnostics level 2 ran" in gs.skip_reason(dcgm, "auto", "r2")
    assert gs.skip_reason(old, "auto", "r2") == ""  # an earlier run's record in the fact cache
    assert gs.skip_reason(dcgm, "always", "r2") == ""
    assert gs.skip_reason([], "never") == "nccl_check_gpu_stress is never"
    no_dcgm = [{"check": "nvidia_driver.burnin", "status": "skip", "run": "r2", "data": {}}]
    recs = gs.records_of({"a": _registered("stress.log"), "b": {"skipped": True}}, {"a": no_dcgm, "b": dcgm},
                         "auto", "r2", "standard", "0.8", "0.5")
    assert recs["a"]["status"] == "pass" and recs["b"]["status"] == "skip" and "DCGM" in recs["b"]["detail"]


def test_the_scaled_h200_row_holds_on_a_real_h200():
    """docs/gpu-acceptance/stress-h200x1: one H200 alone, 662.0 TFLOP/s and 4271.5 GB/s, against the H200 row scaled
    from the H100 capture's fractions (678 and 4320): 98% and 99%, a pass; the only GPU is its own median."""
    reg = {"rc": 0, "stdout": (CAP.parent / "stress-h200x1" / "stress.log").read_text(encoding="utf-8")}
    rec = gs.records({"h200": gs.parse_output(reg)})["h200"]
    assert rec["status"] == "pass", rec["detail"]
    gpu = rec["data"]["gpus"][0]
    assert gpu["of_expected"] == {"tflops": 0.976, "gbps": 0.989}
    assert "1 x NVIDIA H200 on h200: bf16 matmul 662-662 TFLOP/s, HBM copy 4271.5-4271.5 GB/s" in rec["detail"]
    assert "678 TFLOP/s and 4320 GB/s expected for H200 SXM" in rec["detail"]
