#!/usr/bin/python
# -*- coding: utf-8 -*-
"""What the NVIDIA stack of one node says: driver, CUDA, every GPU (UUID, PCI bus id, fabric state, NVLink),
NVSwitches and the fabric manager's version. One ``nvidia-smi -q -x`` answers nearly all of it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: Read the driver, CUDA, GPU, fabric and NVSwitch facts of a node
description:
  - Runs C(nvidia-smi -q -x) once and parses it (driver and CUDA versions; per GPU its index, UUID, PCI bus id,
    name, memory, persistence mode, MIG mode and fabric state/status).
  - With I(nvlink), also runs C(nvidia-smi nvlink -s) (one short extra call) for the number of active links
    per GPU.
  - Reads C(/proc/driver/nvidia/version) when present (the loaded kernel module's version) and lists
    C(/proc/driver/nvidia-nvswitch/devices) (NVSwitches visible to this node).
  - With I(fabricmanager), reads the fabric manager's version from C(nv-fabricmanager --version), or from the
    installed C(nvidia-fabricmanager*) package when the binary is absent; C(None) when neither exists.
  - Returns the facts as C(nvidia_gpu_facts) in the result (register it). It does not return C(ansible_facts),
    so nothing lands in the persistent fact cache where it could go stale between runs.
  - Fails with the node's name, the likely cause (driver not loaded, version mismatch, no devices,
    permissions, hung GPU) and the fix when nvidia-smi is missing or errors.
  - With I(health), also reads the kernel log since I(since) (C(journalctl -k), else C(dmesg --time-format iso)) and
    takes the GPU health (ECC, row remaps, clock slowdowns) from the same C(nvidia-smi -q -x) output
    (module_utils/gpu_health.py); returned as C(health), also when nvidia-smi fails.
  - With I(service), also returns the node's service manager (C(systemd) when it runs the node, else PID 1's name)
    and, under systemd, that unit's state (C(systemctl show)) as C(service_facts) names it.
  - With I(environment_file), returns the value of C(CUDA_DEVICE_ORDER) set there (C(device_order)); with
    I(set_device_order) it first writes C(CUDA_DEVICE_ORDER=PCI_BUS_ID) there (root-owned, 0644; the last such line
    is replaced, else one is appended), the module's only change. In check mode it writes nothing and says whether
    it would (C(changed)).
options:
  nvidia_smi:
    description: The nvidia-smi to run (a name searched on PATH, /usr/bin, /usr/local/bin, /usr/local/nvidia/bin, or a path).
    type: str
    default: nvidia-smi
  nvlink:
    description: Also run C(nvidia-smi nvlink -s) and return the active/inactive NVLink count per GPU.
    type: bool
    default: true
  fabricmanager:
    description: Look up the fabric manager's version (binary, then package).
    type: bool
    default: true
  timeout:
    description: Seconds each nvidia-smi call may take (a hung GPU makes nvidia-smi hang); 0 waits forever.
    type: int
    default: 60
  health:
    description: Also read the kernel log's Xid events and the GPUs' ECC / row-remap / clock-slowdown state.
    type: bool
    default: false
  since:
    description: With I(health), epoch seconds; kernel log lines older than this are left out (0 reads this boot).
    type: float
    default: 0
  gpudirect:
    description: Also read what the quick burn-in tier's GPUDirect checks need (module_utils/gpudirect.py), returned as
      C(gpudirect) also when nvidia-smi fails - C(nvidia-smi nvlink -e), the ports of /sys/class/infiniband,
      /proc/modules, /proc/cmdline, the count of /sys/kernel/iommu_groups and C(lspci -vvv) where lspci is installed.
    type: bool
    default: false
  service:
    description: A systemd unit (without C(.service)) whose state is returned, e.g. nvidia-fabricmanager.
    type: str
  environment_file:
    description: An /etc/environment style file whose C(CUDA_DEVICE_ORDER) is returned as C(device_order).
    type: path
  set_device_order:
    description: Write C(CUDA_DEVICE_ORDER=PCI_BUS_ID) into I(environment_file) first.
    type: bool
    default: false
  burnin:
    description:
      - The burn-in tier (cluster_burnin_tier) to run first, as C(gpu_burnin) does (module_utils/burnin.py
        C(run_tier)), its C(nvidia_driver.burnin) record returned as I(burnin_record), also when nvidia-smi fails.
        Not given, no burn-in.
    type: str
    choices: [quick, standard, long]
  burnin_timeout:
    description: Seconds dcgmi may run before it is stopped (0 waits forever).
    type: int
    default: 3600
  keep:
    description:
      - Values of this node to keep in the result as C(kept), unchanged (the action keeps them; they are not sent to
        the node). The nvidia_driver role keeps the options each node's records use, as the node's own variables give
        them, for the task that records every node's at once.
    type: dict
extends_documentation_fragment: [trainyard.core.attributes]
author: trainyard
"""

EXAMPLES = r"""
- name: Read the GPU facts
  nvidia_gpu_facts:
  register: __nvidia_driver_gpu

- name: Keep them for this run only (not in the fact cache)
  ansible.builtin.set_fact:
    nvidia_gpu_facts: "{{ __nvidia_driver_gpu.nvidia_gpu_facts }}"
"""

RETURN = r"""
kept:
  description: I(keep), as given.
  returned: when keep is given
  type: dict
health:
  description: With I(health), C({node, kernel, gpus, smi_error}) as module_utils/gpu_health.py health_records reads it
    (kernel C({source, skipped, events, text, truncated}); per GPU its ECC, row-remap and clocks event state).
  returned: when health
  type: dict
gpudirect:
  description: With I(gpudirect), C({nvlink_errors, nvlink_error, ib_ports, modules, cmdline, iommu_groups, lspci}) as
    module_utils/gpudirect.py read_node reads them.
  returned: when gpudirect
  type: dict
burnin_record:
  description: With I(burnin), the nvidia_driver.burnin record ({check, status, detail, fix, data}).
  returned: when burnin
  type: dict
service_manager:
  description: With I(service), C(systemd) when systemd runs the node (/run/systemd/system), else PID 1's name.
  returned: when service
  type: str
service:
  description: With I(service) under systemd, C({state, status}) of the unit (as service_facts names them); None when
    the unit does not exist or systemd does not run the node.
  returned: when service
  type: dict
machine_id:
  description: A keyed hash (HMAC-SHA256, this application's key) of the node's C(/etc/machine-id) (else
    C(/var/lib/dbus/machine-id)), never the id itself (machine-id(5)), None when neither is readable; with
    the GPUs' UUIDs and serials it names the machine in the record of bad machines (docs/burn-in.md). Returned also
    when nvidia-smi fails.
  returned: always
  type: str
device_order:
  description: The value of C(CUDA_DEVICE_ORDER) in I(environment_file) (after the write), None when absent.
  returned: when environment_file
  type: str
nvidia_gpu_facts:
  description: The node's NVIDIA facts.
  returned: success
  type: dict
  contains:
    driver_version:
      description: Driver version nvidia-smi reports.
      type: str
      sample: 580.159.04
    kernel_module_version:
      description: Version of the loaded kernel module (/proc/driver/nvidia/version), None when not readable.
      type: str
    cuda_version:
      description: Highest CUDA version the driver supports.
      type: str
      sample: "13.0"
    gpu_count:
      description: Number of GPUs listed.
      type: int
    attached_gpus:
      description: The attached_gpus field (may differ from gpu_count when nvidia-smi could not read a GPU).
      type: int
    gpus:
      description: One entry per GPU in nvidia-smi order (which is PCI bus order).
      type: list
      elements: dict
      sample:
        - {index: 0, uuid: GPU-14e98dc8-5831-1c29-ebc0-83958ef15f98, serial: "1654924120994", pci_bus_id: "00000000:00:06.0",
           pci_bus_id_normalized: "0000:00:06.0", name: NVIDIA H200, memory_total_mib: 143771,
           persistence_mode: Enabled, mig_mode: Disabled, mig_pending: Disabled, mig_devices: 0, minor_number: 0, module_id: "2",
           fabric: {state: Completed, status: Success, clique_id: "0", cluster_uuid: "..."},
           nvlink: {links: 18, active: 18, inactive: 0, gbps: 478.116}}
    fabric_applicable:
      description: Any GPU reports a fabric state (NVSwitch / NVLink fabric system).
      type: bool
    nvswitch:
      description: NVSwitches seen by this node (C(devices) from /proc, C(present) also true when only the fabric section shows one).
      type: dict
      sample: {present: true, local: false, devices: [], source: fabric}
    fabricmanager_version:
      description: Fabric manager version, None when not installed.
      type: str
    fabricmanager_source:
      description: Where the version came from (binary, package) or None.
      type: str
    fabricmanager_package:
      description: The installed nvidia-fabricmanager package name, when known.
      type: str
    nvidia_smi:
      description: Path of the nvidia-smi that ran.
      type: str
cause:
  description: On failure, the likely cause.
  returned: failure
  type: str
fix:
  description: On failure, what to do.
  returned: failure
  type: str
"""

import hashlib
import hmac
import os
import socket
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils.burnin import run_tier
from ansible_collections.trainyard.core.plugins.module_utils.gpudirect import read_node
from ansible_collections.trainyard.core.plugins.module_utils.gpu_health import (
    parse_health_xml,
    parse_kernel_log,
    read_kernel_log,
)
from ansible_collections.trainyard.core.plugins.module_utils.nvidia_smi import (
    NvidiaSmiParseError,
    classify_failure,
    fabric_applicable,
    nvswitch_devices,
    parse_driver_proc_version,
    parse_fabricmanager_package,
    parse_fabricmanager_version,
    parse_nvlink_status,
    parse_unit_show,
    parse_query_xml,
    to_text,
    undecodable,
)

SEARCH_DIRS = ["/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/usr/sbin"]
PROC_VERSION = "/proc/driver/nvidia/version"
PROC_NVSWITCH = "/proc/driver/nvidia-nvswitch/devices"
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


class GpuFacts(object):
    def __init__(self, module):
        self.module = module
        self.host = socket.gethostname()
        self.timeout = module.params["timeout"]
        self._timeout_bin = module.get_bin_path("timeout") if self.timeout > 0 else None

    def _run(self, argv, **kw):
        if self._timeout_bin:
            argv = [self._timeout_bin, "-k", "5", str(self.timeout)] + argv
        return self.module.run_command(argv, environ_update={"LC_ALL": "C"}, **kw)

    def fail(self, rc, output, missing=False, **extra):
        cause, fix = classify_failure(rc, output, missing=missing)
        first = (output or "").strip().splitlines()
        msg = "%s: %s" % (self.host, cause)
        if first and not missing:
            msg += " [nvidia-smi exit %s: %s]" % (rc, first[0][:300])
        msg += ". Fix: %s" % fix
        self.module.fail_json(msg=msg, rc=rc, cause=cause, fix=fix, node=self.host, **extra)

    def smi_path(self):
        name = self.module.params["nvidia_smi"]
        if os.sep in name:
            return name if os.access(name, os.X_OK) else None
        return self.module.get_bin_path(name, opt_dirs=SEARCH_DIRS)

    def read(self, extra):
        """The facts; fails (with `extra`: the device order, the health) when nvidia-smi is missing or errors."""
        p = self.module.params
        if p["health"]:
            extra["health"] = {"node": self.host, "kernel": self.kernel_log(), "gpus": [], "smi_error": ""}
        smi = self.smi_path()
        if p["gpudirect"]:
            extra["gpudirect"] = read_node("/", self._run, smi, self.module.get_bin_path("lspci", opt_dirs=SEARCH_DIRS))
        if not smi:
            if p["health"]:
                extra["health"]["smi_error"] = "nvidia-smi not found"
            self.fail(None, "", missing=True, **extra)
        rc, out, err = self._run([smi, "-q", "-x"])
        bad = undecodable(out or "")
        out, err = to_text(out or ""), to_text(err or "")
        if bad:
            self.module.warn("nvidia-smi -q -x printed %d byte(s) that are not UTF-8 (kept as U+FFFD); the GPU "
                             "names may be garbled: check the node's driver and VBIOS" % bad)
        if p["health"]:
            first = (out + err).strip().splitlines()
            try:
                extra["health"]["smi_error"] = "" if rc == 0 else "exit %s: %s" % (
                    rc, first[0][:300] if first else "no output")
                extra["health"]["gpus"] = parse_health_xml(out) if rc == 0 else []
            except ValueError as exc:
                extra["health"]["smi_error"] = str(exc)
        if rc != 0:
            self.fail(rc, out + err, stdout=out, stderr=err, **extra)
        try:
            facts = parse_query_xml(out)
        except NvidiaSmiParseError as exc:
            self.module.fail_json(
                msg="%s: cannot read nvidia-smi -q -x: %s. Fix: run nvidia-smi -q -x on the node; a driver this "
                    "old or this broken is not supported" % (self.host, exc), node=self.host, stdout=out[:2000],
                **extra)
        gpus = facts["gpus"]

        links = {}
        if self.module.params["nvlink"] and gpus:
            rc, lout, lerr = self._run([smi, "nvlink", "-s"])
            if rc == 0:
                links = parse_nvlink_status(to_text(lout or ""))
        for g in gpus:
            g["nvlink"] = links.get(g["index"])

        facts["kernel_module_version"] = None
        if os.path.exists(PROC_VERSION):
            try:
                with open(PROC_VERSION) as f:
                    facts["kernel_module_version"] = parse_driver_proc_version(f.read())
            except (IOError, OSError):
                pass

        devices = []
        if os.path.isdir(PROC_NVSWITCH):
            devices = nvswitch_devices(os.listdir(PROC_NVSWITCH))
        elif os.path.isfile(PROC_NVSWITCH):
            with open(PROC_NVSWITCH) as f:
                devices = nvswitch_devices(f.read().splitlines())
        applicable = fabric_applicable(gpus)
        facts["fabric_applicable"] = applicable
        facts["nvswitch"] = {
            "present": bool(devices) or applicable,
            "local": bool(devices),
            "devices": devices,
            "source": "proc" if devices else ("fabric" if applicable else None),
        }
        facts["gpu_count"] = len(gpus)
        facts.update(self.fabricmanager())
        facts["nvidia_smi"] = smi
        return facts

    def kernel_log(self):
        """The kernel log since `since` with its Xid events, OOM kills and segfaults (module_utils/gpu_health.py)."""
        since = self.module.params["since"] or None
        kernel = read_kernel_log(lambda argv: self._run(argv, errors="surrogate_or_replace"),
                                 self.module.get_bin_path("journalctl"), self.module.get_bin_path("dmesg"), since)
        kernel["events"] = parse_kernel_log(kernel["text"], since=since)
        return kernel

    def fabricmanager(self):
        none = {"fabricmanager_version": None, "fabricmanager_source": None, "fabricmanager_package": None}
        if not self.module.params["fabricmanager"]:
            return none
        fm = self.module.get_bin_path("nv-fabricmanager", opt_dirs=SEARCH_DIRS)
        if fm:
            rc, out, err = self._run([fm, "--version"])
            version = parse_fabricmanager_version((out or "") + "\n" + (err or "")) if rc == 0 else None
            if version:
                return {"fabricmanager_version": version, "fabricmanager_source": "binary",
                        "fabricmanager_package": None}
        dpkg = self.module.get_bin_path("dpkg-query")
        if dpkg:
            rc, out, err = self.module.run_command(
                [dpkg, "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n", "nvidia-fabricmanager*"],
                environ_update={"LC_ALL": "C"})
            if rc == 0:
                package, version = parse_fabricmanager_package(out)
                if version:
                    return {"fabricmanager_version": version, "fabricmanager_source": "package",
                            "fabricmanager_package": package}
        return none


def env_value(text, name):
    """The value of NAME=value in an /etc/environment style text (quotes and `export` removed), None when absent."""
    value = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[7:].lstrip()
        key, sep, val = line.partition("=")
        if sep and key.strip() == name:
            value = val.strip().strip("'\"")
    return value


def with_device_order(text, value="PCI_BUS_ID"):
    """The text with its last CUDA_DEVICE_ORDER line set to CUDA_DEVICE_ORDER=<value> (appended when absent)."""
    lines = text.splitlines()
    want = "CUDA_DEVICE_ORDER=" + value
    found = [i for i, line in enumerate(lines) if env_value(line, "CUDA_DEVICE_ORDER") is not None]
    if found:
        lines[found[-1]] = want
    else:
        lines.append(want)
    return "\n".join(lines) + "\n"


def device_order(module):
    """{changed, device_order (CUDA_DEVICE_ORDER of environment_file), diff}: writes CUDA_DEVICE_ORDER=PCI_BUS_ID
    when asked."""
    path = module.params["environment_file"]
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = None
    except (IOError, OSError) as exc:
        module.fail_json(msg="%s: cannot read %s: %s. Fix: make it a readable file" % (socket.gethostname(), path, exc))
    if not module.params["set_device_order"]:
        return {"changed": False, "device_order": env_value(text or "", "CUDA_DEVICE_ORDER")}
    new = with_device_order(text or "")
    changed = new != text
    out = {"diff": {"before": text or "", "after": new, "before_header": "%s (content)" % path,
                    "after_header": "%s (content)" % path}} if changed and module._diff else {}
    if changed and not module.check_mode:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".trainyard-")
        with os.fdopen(fd, "w") as f:
            f.write(new)
        module.atomic_move(tmp, path)
    args = module.load_file_common_arguments(dict(path=path, owner="root", group="root", mode="0644"))
    if text is not None or not module.check_mode:
        changed = module.set_fs_attributes_if_different(args, changed)
    return dict(out, changed=changed, device_order=env_value(text or "" if module.check_mode else new,
                                                            "CUDA_DEVICE_ORDER"))


def service_state(module, unit):
    """(service manager, the unit's {state, status} or None) of the node."""
    if not os.path.isdir("/run/systemd/system"):
        try:
            with open("/proc/1/comm") as f:
                return f.read().strip() or None, None
        except (IOError, OSError):
            return None, None
    systemctl = module.get_bin_path("systemctl", opt_dirs=["/usr/bin", "/bin"])
    if not systemctl:
        return "systemd", None
    rc, out, err = module.run_command([systemctl, "show", unit + ".service", "-p", "LoadState", "-p", "ActiveState",
                                       "-p", "SubState", "-p", "UnitFileState"], environ_update={"LC_ALL": "C"})
    return "systemd", parse_unit_show(out) if rc == 0 else None


def machine_id(paths=MACHINE_ID_FILES):
    """An application-specific id of the node's machine id (the first readable, non-empty file of `paths`), None
    when there is none. machine-id(5) asks that the id itself never leave the machine: it is hashed with a key of
    this application (HMAC-SHA256, as systemd's sd_id128_get_machine_app_specific does), stable per machine."""
    for path in paths:
        try:
            with open(path) as f:
                value = f.read(128).strip()
        except (IOError, OSError):
            continue
        if value:
            return hmac.new(b"trainyard bad machines", value.encode(), hashlib.sha256).hexdigest()[:32]
    return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            nvlink=dict(type="bool", default=True),
            fabricmanager=dict(type="bool", default=True),
            timeout=dict(type="int", default=60),
            health=dict(type="bool", default=False),
            since=dict(type="float", default=0),
            environment_file=dict(type="path"),
            set_device_order=dict(type="bool", default=False),
            service=dict(type="str"),
            gpudirect=dict(type="bool", default=False),
            burnin=dict(type="str", choices=["quick", "standard", "long"]),
            burnin_timeout=dict(type="int", default=3600),
        ),
        required_if=[("set_device_order", True, ["environment_file"])],
        supports_check_mode=True,
    )
    extra = {"changed": False, "machine_id": machine_id()}
    if module.params["burnin"]:  # first: its record comes back also when nvidia-smi fails below
        extra["burnin_record"] = run_tier(module, module.params["burnin"], module.params["burnin_timeout"])
    if module.params["environment_file"]:
        extra.update(device_order(module))
    if module.params["service"]:
        extra["service_manager"], extra["service"] = service_state(module, module.params["service"])
    facts = GpuFacts(module).read(extra)
    module.exit_json(nvidia_gpu_facts=facts, **extra)


if __name__ == "__main__":
    main()
