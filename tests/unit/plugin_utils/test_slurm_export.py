"""playbooks/export.yml's rendering without a cluster: the health configuration pins only what a run's passing checks
recorded, the sbatch script runs the recorded command with each node's rank (bash -n parses it; every value quoted),
and the prolog compares a node against the pinned values."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from ansible_collections.trainyard.core.plugins.plugin_utils import slurm_export as se
from helpers import REPO, load

prolog = load("roles/launch/files/slurm_prolog.py", "slurm_prolog")


def rec(host, check, detail, data=None, status="pass"):
    return {"host": host, "check": check, "detail": detail, "data": data or {}, "status": status, "fix": ""}


def report():
    records = []
    for h in ("n1", "n2"):
        records += [
            rec(h, "nvidia_driver.version", "driver 580.159.04 (branch 580, no exact pin)"),
            rec(h, "nvidia_driver.gpu_count", "8 GPU(s), cluster_gpus_per_node 8"),
            rec(h, "fabricmanager.version", "fabric manager 580.159.04, driver 580.159.04",
                {"drift": {"fabricmanager": "580.159.04"}}),
            rec(h, "network.iface", "eth1 (holds the head's data address 10.0.0.1), address 10.0.0.1, MTU 9000",
                {"drift": {"data_iface": "eth1"}}),
            rec(h, "network.mtu", "eth1 MTU 9000", {"drift": {"data_mtu": 9000}}),
        ]
    records.append(rec("n2", "network.mtu", "eth1 MTU 1500", {"drift": {"data_mtu": 1500}}, status="fail"))
    records = [r for r in records if not (r["host"] == "n2" and r["check"] == "network.mtu" and r["status"] == "pass")]
    return {"run_id": "20261127T000000Z-abc", "records": records}


def test_health_pins_only_what_passing_checks_proved():
    h = se.health(report(), ["n1", "n2"], {"n2": "gpu-002"})
    assert h["run_id"] == "20261127T000000Z-abc"
    assert h["nodes"]["n1"] == {"driver_version": "580.159.04", "fabricmanager_version": "580.159.04",
                                "data_iface": "eth1", "data_mtu": 9000, "ib_rate_gbps": None, "gpu_count": 8}
    # n2's MTU check failed: nothing is pinned for it (the prolog then does not compare it); Slurm's name is used
    assert h["nodes"]["gpu-002"]["data_mtu"] is None and h["nodes"]["gpu-002"]["gpu_count"] == 8


def test_a_report_that_proves_nothing_is_a_clear_error():
    with pytest.raises(se.ExportError, match="proves nothing to pin"):
        se.health({"run_id": "x", "records": [rec("n1", "nvidia_driver.version", "driver 580.1", status="fail")]},
                  ["n1"], {})


def test_another_clusters_report_is_a_clear_error():
    """Two inventories run from one checkout: runs/latest is the other one's run; the export names it, not pins it."""
    with pytest.raises(se.ExportError, match=r"not this cluster's: it has no record of m1, m2, m3, m4 and 1 more "
                                             r"\(it checked n1, n2\).*-e export_report="):
        se.health(report(), ["m1", "m2", "m3", "m4", "m5"], {})
    with pytest.raises(se.ExportError, match=r"no record of n3(?! \()"):
        se.health(report(), ["n1", "n2", "n3"], {})  # the same cluster grown by a node since that run


COMMAND = ["torchrun", "--nnodes=3", "--nproc_per_node=8", "--node_rank=0", "--master_addr=10.0.0.1",
           "--master_port=39500", "--rdzv_backend=static", "--max_restarts=0", "/srv/code/train.py", "--lr", "1e-4",
           "--name", "it's; $(reboot)"]


def script(**kw):
    args = dict(job="train", hosts_by_rank=["n1", "n2", "n3"], names={"n3": "gpu-003"}, exclude=["n4"],
                command=COMMAND, container="trainyard-train",
                env={"NCCL_SOCKET_IFNAME": "eth1", "X": "a b;$(id)"}, run_id="r1", partition="gpu")
    args.update(kw)
    return se.sbatch_script(**args)


def test_sbatch_script_parses_and_quotes_every_value(tmp_path):
    text = script()
    path = tmp_path / "s.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert "#SBATCH --nodes=3" in text and "#SBATCH --nodelist=n1,n2,gpu-003" in text
    assert "#SBATCH --exclude=n4" in text and "#SBATCH --partition=gpu" in text
    assert "export X='a b;$(id)'" in text
    assert "    gpu-003) rank=2 ;;" in text
    run_line = next(line for line in text.splitlines() if " exec " in line and "torchrun" in line)
    # --node_rank is each node's, in torchrun's options (before the entry point), never the head's 0
    assert '--node_rank="$rank" --master_addr=10.0.0.1' in run_line and "--node_rank=0" not in run_line
    assert shlex.quote("it's; $(reboot)") in run_line


def test_sbatch_script_runs_each_nodes_rank(tmp_path):
    """The task function as srun runs it on node gpu-003, with docker replaced by a recorder of its argv."""
    text = script()
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n")
    fake.chmod(0o755)
    body = text.split("srun ", 1)[0] + "task\n"
    r = subprocess.run(["bash", "-c", body], capture_output=True, text=True,
                       env={"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURMD_NODENAME": "gpu-003", "SLURM_JOB_ID": "7"})
    argv = r.stdout.splitlines()
    assert r.returncode == 0, r.stderr
    assert argv[:2] == ["exec", "-e"] and "TRAINYARD_LAUNCH_ID=slurm-7" in argv
    assert "--node_rank=2" in argv and argv[-1] == "it's; $(reboot)"
    r = subprocess.run(["bash", "-c", body], capture_output=True, text=True,
                       env={"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURMD_NODENAME": "n9", "SLURM_JOB_ID": "7"})
    assert r.returncode == 1 and "not in the validated cluster" in r.stderr


def test_recorded_command_from_either_backend_or_a_clear_error():
    assert se.recorded_command({"command": ["torchrun", "--node_rank=0"]}, None, "n1") == ["torchrun", "--node_rank=0"]
    assert se.recorded_command(None, {"argv": ["torchrun", "--node_rank=1"]}, "n1") == ["torchrun", "--node_rank=1"]
    with pytest.raises(se.ExportError, match="no job was launched on the head n1"):
        se.recorded_command(None, None, "n1")
    with pytest.raises(se.ExportError, match="no --node_rank"):
        script(command=["torchrun", "--rdzv_backend=c10d", "x.py"])


def test_env_from_text():
    assert se.env_from_text("# c\nA=1\n\nB=x=y\n") == {"A": "1", "B": "x=y"}
    with pytest.raises(se.ExportError, match="`export` is a shell word"):
        se.env_from_text("export C=2\n")


# ---------------------------------------------------------------- the prolog
def test_prolog_names_each_drifted_value_and_skips_what_was_not_proven():
    pinned = {"driver_version": "580.159.04", "gpu_count": 8, "fabricmanager_version": None, "data_iface": "eth1",
              "data_mtu": 9000, "ib_rate_gbps": None}
    assert prolog.mismatches(pinned, {"driver_version": "580.159.04", "gpu_count": 8, "data_mtu": 9000}, {}) == []
    lines = prolog.mismatches(pinned, {"driver_version": "570.1", "gpu_count": 7, "data_mtu": 1500}, {})
    assert lines == ["driver_version is 570.1, the run proved 580.159.04", "gpu_count is 7, the run proved 8",
                     "data_mtu on eth1 is 1500, the run proved 9000"]
    assert prolog.mismatches({"gpu_count": 8}, {"gpu_count": None}, {"gpu_count": "nvidia-smi: not found"}) == [
        "gpu_count: cannot read (nvidia-smi: not found); the run proved 8"]


def test_prolog_reads_mtu_and_ib_rate_from_sysfs(tmp_path):
    (tmp_path / "class/net/eth1").mkdir(parents=True)
    (tmp_path / "class/net/eth1/mtu").write_text("9000\n")
    (tmp_path / "class/infiniband/mlx5_0/ports/1").mkdir(parents=True)
    (tmp_path / "class/infiniband/mlx5_0/ports/1/rate").write_text("400 Gb/sec (4X NDR)\n")
    seen, _ = prolog.observe({"data_iface": "eth1", "data_mtu": 9000, "ib_rate_gbps": 400}, sys_root=str(tmp_path))
    assert seen == {"data_mtu": 9000, "ib_rate_gbps": 400}


def test_prolog_run_end_to_end_with_the_standin_nvidia_smi(tmp_path):
    health = {"run_id": "r1", "nodes": {"node-a": {"driver_version": "0.0.1", "gpu_count": 4}}}
    (tmp_path / "h.json").write_text(json.dumps(health))
    env = {"PATH": f"{REPO}/tests/sim/standin:/usr/bin:/bin", "TRAINYARD_HEALTH": str(tmp_path / "h.json"),
           "SLURMD_NODENAME": "node-a", "TRAINYARD_STANDIN_DATA": f"{REPO}/tests/data/nvidia-smi/h200x4"}
    r = subprocess.run([sys.executable, str(REPO / "roles/launch/files/slurm_prolog.py")], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 1 and "node-a: driver_version is " in r.stderr and "the run proved 0.0.1" in r.stderr, \
        r.stderr
    assert "gpu_count" not in r.stderr  # four GPUs, as pinned
    env["SLURMD_NODENAME"] = "other"
    assert subprocess.run([sys.executable, str(REPO / "roles/launch/files/slurm_prolog.py")], env=env).returncode == 0
