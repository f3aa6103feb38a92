#!/usr/bin/python
# -*- coding: utf-8 -*-
"""What the NVIDIA container toolkit's CLI would give a container, read from the node in one call: the GPU device
nodes, the driver's user-space libraries in the ld cache and the files they resolve to, and nvidia-smi."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: container_gpu_paths
short_description: Read the NVIDIA device nodes, the driver's libraries in the ld cache and nvidia-smi of a node
description:
  - For the container role's gpu mode C(devices) (an engine without the NVIDIA runtime), read the way
    nvidia-container-cli finds them. The action C(container_engine_probe) runs it and turns the answer into the
    container's devices and read-only mounts (C(plugin_utils/container_checks.py) C(gpu_paths)).
  - C(device_nodes), the entries C(/dev/nvidia*) (not recursive).
  - C(libraries), the driver's 64-bit user-space libraries in C(ldconfig -p) (CUDA, NVML, PTX JIT, OpenCL, NVVM and
    the like; a name once, the first path, as the loader takes it), each with whether its path exists and, for a
    symbolic link, the file it resolves to (as C(stat) gives C(islnk) and C(lnk_source)). An ld cache that cannot
    be read gives no libraries and C(ldconfig_error).
  - C(nvidia_smi), the first of these that exists, else empty, the bin directory beside the driver's libraries first
    (a driver under C(/usr/local/nvidia) has its nvidia-smi in C(/usr/local/nvidia/bin); C(/usr/bin/nvidia-smi) may
    be a wrapper script that calls it), then I(nvidia_smi_paths).
  - Reads only; runs in check mode too.
options:
  nvidia_smi_paths:
    description: Where else to look for nvidia-smi, in order.
    type: list
    elements: path
    default: [/usr/bin/nvidia-smi]
  ldconfig:
    description: The ldconfig to ask for the cache.
    type: path
    default: /sbin/ldconfig
author: trainyard
"""

EXAMPLES = r"""
- name: Read what gpu mode devices gives the container
  container_gpu_paths:
    nvidia_smi_paths: [/usr/bin/nvidia-smi, /usr/local/nvidia/bin/nvidia-smi]
"""

RETURN = r"""
device_nodes:
  description: The paths of C(/dev/nvidia*), sorted.
  returned: always
  type: list
libraries:
  description: The driver's libraries in the ld cache, in cache order, C({name, path, exists, islnk, lnk_source}).
  returned: always
  type: list
nvidia_smi:
  description: The nvidia-smi found, empty when none.
  returned: always
  type: str
ldconfig_error:
  description: Why the ld cache could not be read.
  returned: when it could not
  type: str
"""

import fnmatch
import os

from ansible.module_utils.basic import AnsibleModule

# The driver's user-space libraries a CUDA container needs (nvidia-container-cli's compute and utility sets).
DRIVER_LIB_STEMS = (
    "libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq",  # utility
    "libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-ptxjitcompiler",
    "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler", "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3", "libnvidia-nvvm",  # compute
)


def ldcache_driver_libs(ldconfig_stdout, arch="x86-64"):
    """`ldconfig -p` output -> [{name, path}] of the driver's libraries for this architecture, in cache order.

    An entry looks like `libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1`; 32-bit entries
    (`(libc6)`) and other architectures are left out, and a name is kept once (the first path, as the loader does).
    """
    out, seen = [], set()
    for line in (ldconfig_stdout or "").splitlines():
        name, sep, path = line.strip().partition(" => ")
        if not sep:
            continue
        name, _, tag = name.partition(" (")
        if arch not in tag:
            continue
        stem = name.split(".so", 1)[0]
        if stem in DRIVER_LIB_STEMS and name not in seen and ".so" in name:
            seen.add(name)
            out.append({"name": name, "path": path.strip()})
    return out


def resolved(path):
    """{exists, islnk, lnk_source} of path, as the stat module gives them (lnk_source only for a link)."""
    islnk = os.path.islink(path)
    out = {"exists": os.path.exists(path), "islnk": islnk}
    if islnk:
        out["lnk_source"] = os.path.realpath(path)
    return out


def read(module, nvidia_smi_paths, ldconfig):
    try:
        nodes = sorted("/dev/" + n for n in os.listdir("/dev") if fnmatch.fnmatch(n, "nvidia*"))
    except OSError:
        nodes = []
    result = {"device_nodes": nodes, "libraries": [], "nvidia_smi": ""}
    rc, out, err = module.run_command([ldconfig, "-p"]) if os.path.exists(ldconfig) else (None, "", "")
    if rc != 0:
        result["ldconfig_error"] = ("%s not found" % ldconfig if rc is None else
                                    "%s -p exited %s: %s" % (ldconfig, rc, (err or out).strip()[:300]))
    else:
        result["libraries"] = [dict(lib, **resolved(lib["path"])) for lib in ldcache_driver_libs(out)]
    beside = [os.path.join(os.path.dirname(os.path.dirname(lib["path"])), "bin", "nvidia-smi")
              for lib in result["libraries"] if lib["name"] == "libcuda.so.1"]
    for path in beside + list(nvidia_smi_paths or []):
        if os.path.exists(path):
            result["nvidia_smi"] = path
            break
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi_paths=dict(type="list", elements="path", default=["/usr/bin/nvidia-smi"]),
            ldconfig=dict(type="path", default="/sbin/ldconfig"),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **read(module, module.params["nvidia_smi_paths"], module.params["ldconfig"]))


if __name__ == "__main__":
    main()
