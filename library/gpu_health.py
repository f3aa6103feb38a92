#!/usr/bin/python
# -*- coding: utf-8 -*-
# trainyard: Xid events in the kernel log, ECC and clock-slowdown state of every GPU, in one read-only call.
from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_health
short_description: Read a node's GPU health (kernel log Xid events, ECC / row remaps, clock slowdowns)
description:
  - Reads the kernel log (C(journalctl -k), else C(dmesg --time-format iso)) since I(since) and parses NVIDIA Xid
    events, OOM kills and segfaults (module_utils/gpu_health.py); a log it may not read is reported as
    C(kernel.skipped) with the reason, never as healthy.
  - Runs C(nvidia-smi -q -x) once and returns per GPU the uncorrectable ECC counters, retired pages, row-remap
    state, recovery action, clocks event reasons, temperature, utilisation and memory.
  - Read-only; the same in check mode.
options:
  since:
    description: Epoch seconds; kernel log lines older than this are left out (0 reads the whole log).
    type: float
    default: 0
  kernel_log:
    description: Read the kernel log.
    type: bool
    default: true
  nvidia_smi:
    description: The nvidia-smi program (name on the PATH or a path); an empty string skips it.
    type: str
    default: nvidia-smi
  return_xml:
    description: Also return the raw C(nvidia-smi -q -x) output (capped at I(max_bytes)).
    type: bool
    default: false
  max_bytes:
    description: Cap on the kernel log text and the XML returned (the newest part of the log is kept).
    type: int
    default: 1048576
  timeout:
    description: Seconds each command may take (a hung GPU makes nvidia-smi hang); 0 waits forever.
    type: int
    default: 60
extends_documentation_fragment: [trainyard.core.attributes]
author: trainyard
"""

EXAMPLES = r"""
- name: Read the GPU health since the job started
  gpu_health:
    since: "{{ launch_started_at | default(0) }}"
  register: __nvidia_driver_health
"""

RETURN = r"""
kernel:
  description: The kernel log read.
  returned: always
  type: dict
  contains:
    source: {description: "C(journalctl -k) or C(dmesg); null when skipped.", type: str}
    skipped: {description: Why the log could not be read (empty when it was)., type: str}
    events: {description: "Xid events (code, pci, pid, meaning, severity, fix, time, line), OOM kills, segfaults.",
             type: list}
    text: {description: The log text read (last I(max_bytes))., type: str}
    truncated: {description: Whether older lines were cut off., type: bool}
gpus:
  description: "Per GPU: index, pci, uuid, volatile/aggregate_uncorrectable, retired_pages, remap_pending,
    remap_failure, recovery_action, throttle (active clocks event reasons), temp_c, util_pct, mem_used_mib."
  returned: always
  type: list
smi_error:
  description: Why nvidia-smi gave no health (empty when it did).
  returned: always
  type: str
xml:
  description: The raw nvidia-smi -q -x output (only with I(return_xml)).
  returned: when return_xml
  type: str
"""

import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils.gpu_health import (
    parse_health_xml, parse_kernel_log, read_kernel_log,
)

SEARCH_DIRS = ["/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/usr/sbin", "/bin", "/sbin"]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            since=dict(type="float", default=0),
            kernel_log=dict(type="bool", default=True),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            return_xml=dict(type="bool", default=False),
            max_bytes=dict(type="int", default=1 << 20),
            timeout=dict(type="int", default=60),
        ),
        supports_check_mode=True,
    )
    p = module.params
    host = socket.gethostname()
    timeout_bin = module.get_bin_path("timeout") if p["timeout"] > 0 else None

    def run(argv):
        if timeout_bin:
            argv = [timeout_bin, "-k", "5", str(p["timeout"])] + argv
        return module.run_command(argv, environ_update={"LC_ALL": "C"}, errors="surrogate_or_replace")

    result = {"changed": False, "node": host, "smi_error": "", "gpus": []}
    if p["kernel_log"]:
        kernel = read_kernel_log(run, module.get_bin_path("journalctl"),
                                 module.get_bin_path("dmesg"), p["since"] or None,
                                 p["max_bytes"])
        kernel["events"] = parse_kernel_log(kernel["text"], since=p["since"] or None)
    else:
        kernel = {"source": None, "text": "", "truncated": False, "events": [], "skipped": "kernel_log is false"}
    result["kernel"] = kernel

    smi = None
    if p["nvidia_smi"]:
        smi = module.get_bin_path(p["nvidia_smi"], opt_dirs=SEARCH_DIRS) if "/" not in p["nvidia_smi"] \
            else p["nvidia_smi"]
    if not smi:
        result["smi_error"] = "nvidia-smi not found" if p["nvidia_smi"] else "nvidia_smi is empty"
    else:
        rc, out, err = run([smi, "-q", "-x"])
        if rc != 0:
            first = ((out or "") + (err or "")).strip().splitlines()
            result["smi_error"] = "exit %s: %s" % (rc, first[0][:300] if first else "no output")
        else:
            try:
                result["gpus"] = parse_health_xml(out)
            except ValueError as e:
                result["smi_error"] = str(e)
        if p["return_xml"]:
            result["xml"] = (out or "")[:p["max_bytes"]]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
