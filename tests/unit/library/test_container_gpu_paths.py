"""gpu mode devices: what the module container_gpu_paths reads of a node in one call (the NVIDIA device nodes, the
driver's libraries in the ld cache and the files they resolve to, nvidia-smi), and what the container role's probe
makes of it (plugin_utils/container_checks.py gpu_paths: the container's devices and read-only mounts)."""

from __future__ import annotations

import os
import stat

from ansible_collections.trainyard.core.plugins.plugin_utils import container_checks as cc
from helpers import adhoc, load

gp = load("library/container_gpu_paths.py", "container_gpu_paths_test")

# `ldconfig -p` of a node with driver 580.159.04, a leftover of driver 570 in the cache, and 32-bit entries.
LDCACHE = """1234 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => {d}/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => {d}/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6) => /usr/lib/i386-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-nvvm.so.4 (libc6,x86-64) => {d}/libnvidia-nvvm.so.4
\tlibnvidia-opencl.so.1 (libc6,x86-64) => {d}/libnvidia-opencl.so.1
\tlibnvidia-glcore.so.580.159.04 (libc6,x86-64) => {d}/libnvidia-glcore.so.580.159.04
\tlibcudart.so.13 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.13
\tlibcuda.so.1 (libc6,x86-64) => {d}/libcuda.so.1
\tlibcuda.so (libc6,x86-64) => {d}/libcuda.so
\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1
\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
"""
D = "/usr/lib/x86_64-linux-gnu"


def test_ldcache_driver_libs_keeps_the_drivers_64_bit_libraries_once():
    libs = gp.ldcache_driver_libs(LDCACHE.format(d=D))
    assert [x["name"] for x in libs] == ["libnvidia-ptxjitcompiler.so.1", "libnvidia-ml.so.1", "libnvidia-nvvm.so.4",
                                         "libnvidia-opencl.so.1", "libcuda.so.1", "libcuda.so"]
    assert all("/x86_64-linux-gnu/" in x["path"] for x in libs)  # no i386, no CUDA runtime, no GL


def _node(tmp_path):
    """A driver tree under tmp_path: the 580.159.04 libraries behind their soname links, a 570 leftover for NVVM,
    no OpenCL file, nvidia-smi in the bin directory beside lib/, and an ldconfig that prints the cache above."""
    lib, bin_ = tmp_path / "driver/lib", tmp_path / "driver/bin"
    lib.mkdir(parents=True)
    bin_.mkdir()
    for name, real in (("libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so.580.159.04"),
                       ("libnvidia-ml.so.1", "libnvidia-ml.so.580.159.04"),
                       ("libnvidia-nvvm.so.4", "libnvidia-nvvm.so.570.86.10"),
                       ("libcuda.so.1", "libcuda.so.580.159.04"), ("libcuda.so", "libcuda.so.1")):
        if not (lib / real).exists():
            (lib / real).write_text("")
        os.symlink(real, lib / name)
    (bin_ / "nvidia-smi").write_text("")
    ldconfig = tmp_path / "ldconfig"
    ldconfig.write_text("#!/bin/sh\ncat <<'END'\n" + LDCACHE.format(d=lib) + "END\n")
    ldconfig.chmod(ldconfig.stat().st_mode | stat.S_IXUSR)
    return lib, bin_, ldconfig


def test_one_call_reads_the_libraries_their_files_and_nvidia_smi_beside_them(tmp_path):
    lib, bin_, ldconfig = _node(tmp_path)
    got = adhoc("container_gpu_paths", {"ldconfig": str(ldconfig), "nvidia_smi_paths": [str(tmp_path / "none")]})
    assert not got.get("failed") and not got["changed"], got
    by = {x["name"]: x for x in got["libraries"]}
    assert list(by) == ["libnvidia-ptxjitcompiler.so.1", "libnvidia-ml.so.1", "libnvidia-nvvm.so.4",
                        "libnvidia-opencl.so.1", "libcuda.so.1", "libcuda.so"]
    assert by["libcuda.so"]["lnk_source"] == str(lib / "libcuda.so.580.159.04")  # through both links
    assert by["libnvidia-opencl.so.1"]["exists"] is False
    assert got["nvidia_smi"] == str(bin_ / "nvidia-smi")  # beside the driver's libraries, before the given paths
    assert got["device_nodes"] == sorted(f"/dev/{n}" for n in os.listdir("/dev") if n.startswith("nvidia"))

    paths = cc.gpu_paths(got, "580.159.04", "/usr/local/nvidia/lib64")
    libs = paths["driver_libs"]
    assert libs["libraries"] == ["libnvidia-ptxjitcompiler.so.1", "libnvidia-ml.so.1", "libcuda.so.1", "libcuda.so"]
    assert libs["stale"] == [f"libnvidia-nvvm.so.4 -> {lib}/libnvidia-nvvm.so.570.86.10"]
    assert libs["missing"] == []
    assert {"source": str(lib / "libcuda.so.580.159.04"), "target": "/usr/local/nvidia/lib64/libcuda.so.1",
            "read_only": True} in libs["mounts"]
    assert paths["nvidia_smi"] == got["nvidia_smi"] and paths["driver_version"] == "580.159.04"
    # another driver version than nvidia-smi reports: nothing fits, libcuda and NVML are named missing
    other = cc.gpu_paths(got, "590.1.2")["driver_libs"]
    assert other["mounts"] == [] and other["missing"] == ["libcuda", "libnvidia-ml"]


def test_an_ld_cache_that_cannot_be_read_gives_no_libraries_and_says_why(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("")
    got = adhoc("container_gpu_paths", {"ldconfig": str(tmp_path / "absent"), "nvidia_smi_paths": [str(smi)]})
    assert got["libraries"] == [] and "not found" in got["ldconfig_error"] and got["nvidia_smi"] == str(smi)
    assert cc.gpu_paths(got, "580.159.04")["driver_libs"]["missing"] == ["libcuda", "libnvidia-ml"]


def test_gpu_device_nodes_leave_out_caps_and_unknown_nodes():
    found = ["/dev/nvidia-caps", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm",
             "/dev/nvidia-uvm-tools", "/dev/nvidia10", "/dev/nvidia-modeset", "/dev/nvidia-fs"]
    assert cc.gpu_paths({"device_nodes": found}, "1")["devices"] == [
        "/dev/nvidia0:/dev/nvidia0:rwm", "/dev/nvidia1:/dev/nvidia1:rwm", "/dev/nvidia10:/dev/nvidia10:rwm",
        "/dev/nvidiactl:/dev/nvidiactl:rwm", "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm",
        "/dev/nvidia-modeset:/dev/nvidia-modeset:rwm", "/dev/nvidia-uvm-tools:/dev/nvidia-uvm-tools:rwm"]
