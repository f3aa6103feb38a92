"""The container role's engine and GPU verdicts (plugin_utils/container_checks.py), as roles/container/tasks/
engine.yml records them through the role's filters."""

from __future__ import annotations

from conftest import load

from ansible_collections.trainyard.core.plugins.plugin_utils import container_checks as cc

cf = load("roles/container/filter_plugins/container_filters.py", "container_filters")

HOST = {"ServerVersion": "27.1.1", "Driver": "overlay2", "CgroupVersion": "2"}
LIBS_OK = {"libraries": ["libcuda.so.1", "libnvidia-ml.so.1"], "missing": [], "stale": [], "mounts": []}


def ctx(**kw):
    base = {"node": "node2", "engine_ok": True, "container_gpus": "auto", "container_gpu_mode": "auto",
            "gpus": True, "gpu_mode": "runtime", "runtimes": ["runc", "nvidia"], "devices": [], "driver_libs": {},
            "driver_version": None, "driver_lib_dir": "/usr/local/nvidia/lib64"}
    return dict(base, **kw)


def test_the_role_filters_are_these_functions():
    f = cf.FilterModule().filters()
    assert f["container_engine_record"] is cc.engine_record and f["container_gpus_record"] is cc.gpus_record


def test_engine_pass_names_version_storage_cgroup():
    rec = cc.engine_record(True, HOST, "")
    assert rec["check"] == "container.engine" and rec["ok"] is True
    assert rec["detail"] == "docker 27.1.1 (storage overlay2, cgroup v2)"
    assert rec["data"] == {"drift": {"docker_version": "27.1.1"}}
    assert cc.engine_record("True", {"ServerVersion": "26", "Driver": "vfs"})["detail"].endswith("cgroup v?)")


def test_engine_fail_says_why_and_how_to_start_it():
    rec = cc.engine_record(False, {}, "Error while fetching server API version: connection refused")
    assert rec["ok"] is False
    assert rec["detail"] == ("cannot talk to the docker engine: Error while fetching server API version: "
                             "connection refused")
    assert rec["fix"].startswith("Start the engine on the node (systemctl enable --now docker")
    assert "container_engine_install: true" in rec["fix"]
    assert rec["data"]["drift"]["docker_version"] is None


def test_engine_fail_without_the_python_libraries_names_the_packages():
    rec = cc.engine_record(False, None, "Failed to import the required Python library (requests)")
    assert "apt-get install python3-docker python3-requests" in rec["fix"]


def test_engine_message_is_cut_like_jinja_truncate():
    long = "word " * 100
    detail = cc.engine_record(False, {}, long)["detail"]
    assert detail.endswith("...") and len(detail) < len("cannot talk to the docker engine: ") + 300
    assert cc.truncate("a" * 305) == "a" * 305 and cc.truncate("a b " * 80).endswith("b...")


def test_gpus_skip_when_the_engine_does_not_answer():
    rec = cc.gpus_record(ctx(engine_ok=False))
    assert (rec["status"], rec["detail"]) == ("skip", "not checked: the engine does not answer")


def test_gpus_pass_without_gpus():
    assert cc.gpus_record(ctx(container_gpus="none", gpus=False))["detail"] == (
        "GPUs not requested (container_gpus: none)")
    rec = cc.gpus_record(ctx(gpus=False))
    assert rec["status"] == "pass" and "no GPUs on this node (/dev/nvidiactl absent)" in rec["detail"]
    assert rec["data"]["gpu_mode"] == "none" and rec["data"]["drift"] == {"container_gpu_mode": "none"}


def test_gpus_runtime_pass_and_fail():
    rec = cc.gpus_record(ctx())
    assert (rec["status"], rec["detail"]) == ("pass", "gpu mode runtime: all GPUs through the NVIDIA runtime")
    bad = cc.gpus_record(ctx(runtimes=["runc"], container_gpu_mode="runtime"))
    assert bad["status"] == "fail"
    assert bad["detail"] == ("gpu mode runtime (container_gpu_mode: runtime) but the engine has no NVIDIA runtime "
                             "(runtimes: runc)")
    assert "nvidia-ctk runtime configure --runtime=docker" in bad["fix"] and "container_gpu_mode: devices" in bad["fix"]
    assert bad["data"]["gpu_mode"] == "runtime"


def test_gpus_devices_pass_lists_devices_and_libraries():
    rec = cc.gpus_record(ctx(gpu_mode="devices", runtimes=["runc"], driver_version="580.95",
                             devices=["/dev/nvidia0:/dev/nvidia0:rwm", "/dev/nvidiactl:/dev/nvidiactl:rwm"],
                             driver_libs=dict(LIBS_OK, stale=["libcuda.so.1 -> /usr/lib/libcuda.so.535.1"])))
    assert rec["status"] == "pass"
    assert rec["detail"] == ("gpu mode devices (auto: the engine has no NVIDIA runtime): /dev/nvidia0 /dev/nvidiactl; "
                             "driver 580.95 libraries libcuda.so.1 libnvidia-ml.so.1 mounted read-only at "
                             "/usr/local/nvidia/lib64; left out (another driver version): "
                             "libcuda.so.1 -> /usr/lib/libcuda.so.535.1")
    assert rec["data"]["devices"][0] == "/dev/nvidia0:/dev/nvidia0:rwm"
    assert rec["data"]["driver_libraries"] == ["libcuda.so.1", "libnvidia-ml.so.1"]


def test_gpus_devices_fail_names_the_node_the_driver_and_the_fix():
    rec = cc.gpus_record(ctx(gpu_mode="devices", container_gpu_mode="devices", driver_version="580.95",
                             devices=["/dev/nvidia0:/dev/nvidia0:rwm"],
                             driver_libs={"libraries": ["libcuda.so.1"], "missing": ["libnvidia-ml"], "stale": []}))
    assert rec["status"] == "fail"
    assert rec["detail"].startswith("gpu mode devices (container_gpu_mode: devices): /dev/nvidia0;")
    assert rec["detail"].endswith("; missing libnvidia-ml")
    assert rec["fix"].startswith("The driver is incomplete on node2: ldconfig -p must list libcuda.so.1 and "
                                 "libnvidia-ml.so.1 of driver 580.95 and /dev/nvidia0 must exist")
    assert cc.gpus_record(ctx(gpu_mode="devices", devices=[], driver_libs=LIBS_OK))["status"] == "fail"
    assert "of driver ? and" in cc.gpus_record(ctx(gpu_mode="devices"))["fix"]
