# -*- coding: utf-8 -*-
"""Inventory plugin: the trainers of a cluster rented from a GPU marketplace (vast.ai), read from the JSON its
CLI exports. Never calls the provider: the user writes the files with the CLI and this plugin reads them."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: vast_instances
short_description: Trainers from the instance list of vast.ai's CLI (C(vastai show instances --raw))
description:
  - Builds the C(trainers) group from the JSON that C(vastai show instances --raw) prints (a list of instance
    objects), optionally with C(vastai show overlays --raw) (a list of overlay networks with their subnet and
    member instance ids). No network call; write the files with the CLI, then run Ansible.
  - Per instance, C(ansible_host) and C(ansible_port) come from the instance's direct SSH port mapping
    (C(public_ipaddr) and C(ports["22/tcp"][0].HostPort)) when it has one, otherwise from the SSH proxy
    (C(ssh_host), C(ssh_port); +1 for Jupyter-launched instances), as the CLI's C(ssh-url) command does.
  - The data address (C(data_address)) is the instance's address inside the overlay subnet, taken from its
    C(local_ipaddrs). Instances that are not in I(statuses), are on another overlay, or have no address in the
    overlay's subnet are left out, each with its reason printed as a warning.
  - Node ranks follow I(order_by) (ties by instance id), so the same files give the same ranks on every run.
  - The configuration file's name must end in C(vast_instances.yml) or C(vast_instances.yaml).
options:
  plugin:
    description: The name of this plugin.
    type: str
    required: true
    choices: [vast_instances]
  instances_file:
    description: >-
      Output of C(vastai show instances --raw) (relative paths are relative to this configuration file).
    type: str
    required: true
  overlays_file:
    description: >-
      Output of C(vastai show overlays --raw). With it, I(overlay) names the overlay and its C(internal_subnet)
      and member list decide who is in; without it, I(overlay_subnet) is required.
    type: str
    default: ""
  overlay:
    description: >-
      Name or id of the overlay network the job uses (C(vastai create overlay CLUSTER_ID NAME)). May be left empty when the overlays file holds exactly one overlay with instances of this list.
    type: str
    default: ""
  overlay_subnet:
    description: The overlay's subnet (CIDR) when no overlays file is given, e.g. C(10.0.0.0/24).
    type: str
    default: ""
  statuses:
    description: Values of C(actual_status) an instance must have to be a trainer.
    type: list
    elements: str
    default: [running]
  order_by:
    description: >-
      Instance field that orders node ranks (C(id), C(label), C(machine_id), C(start_date), ...); ties and
      instances without the field are ordered by C(id), the latter after the others.
    type: str
    default: id
  hostname_field:
    description: Field that names each inventory host (C(id) or C(label)); a missing or empty label falls back to the id.
    type: str
    default: id
    choices: [id, label]
  hostname_prefix:
    description: Prefix of every inventory host name.
    type: str
    default: vast-
  ssh_mode:
    description: >-
      C(auto) as C(vastai ssh-url) (direct port when the instance has one, else the proxy), C(direct) (leave
      out instances without a direct SSH port), C(proxy) (always C(ssh_host):C(ssh_port)).
    type: str
    default: auto
    choices: [auto, direct, proxy]
  ssh_user:
    description: SSH user (vast.ai instances log in as root).
    type: str
    default: root
  group:
    description: Group the instances are put in.
    type: str
    default: trainers
  host_vars:
    description: Variables set on every host of the group (e.g. C(ansible_ssh_private_key_file)).
    type: dict
    default: {}
"""

EXAMPLES = r"""
# inventory/mycluster/cluster.vast_instances.yml, after
#   vastai show instances --raw > inventory/mycluster/instances.vast.json
#   vastai show overlays --raw > inventory/mycluster/overlays.vast.json
plugin: vast_instances
instances_file: instances.vast.json
overlays_file: overlays.vast.json
overlay: trainnet
order_by: label
"""

import ipaddress
import json
import os
import re

try:
    from ansible.errors import AnsibleParserError
    from ansible.plugins.inventory import BaseInventoryPlugin
except ImportError:  # unit tests import the pure functions without Ansible
    AnsibleParserError = ValueError
    BaseInventoryPlugin = object

_NAME_OK = re.compile(r"[^A-Za-z0-9_.-]+")


class VastError(ValueError):
    """Bad input: the message names the file or option and the fix."""


def load_rows(text, what, key):
    """The CLI's --raw output: a JSON list (the API's {key: [...]} object is accepted too)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise VastError("%s is not JSON (%s): write it with the CLI's --raw option" % (what, exc))
    if isinstance(data, dict) and isinstance(data.get(key), list):
        data = data[key]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise VastError("%s is not a list of objects: write it with the CLI's --raw option" % what)
    return data


def choose_overlay(overlays, wanted, instance_ids):
    """The overlay dict named or numbered `wanted`, or the only one holding instances of this list."""
    if wanted:
        for ov in overlays:
            if str(ov.get("name")) == str(wanted) or str(ov.get("overlay_id")) == str(wanted):
                return ov
        raise VastError("overlay %r is not in the overlays file (overlays: %s): set overlay to one of them"
                        % (wanted, ", ".join(str(o.get("name")) for o in overlays) or "none"))
    used = [ov for ov in overlays if set(ov.get("instances") or []) & set(instance_ids)]
    if len(used) != 1:
        raise VastError("overlay is not set and %d overlays hold instances of this list (%s): set overlay to "
                        "the name of the job's overlay" % (len(used), ", ".join(str(o.get("name")) for o in used)
                                                            or "none"))
    return used[0]


def overlay_address(local_ipaddrs, subnet):
    """The first address of `local_ipaddrs` (a whitespace-separated string, or a list) inside `subnet`."""
    items = local_ipaddrs.split() if isinstance(local_ipaddrs, str) else list(local_ipaddrs or [])
    for item in items:
        try:
            if ipaddress.ip_address(str(item).strip()) in subnet:
                return str(item).strip()
        except ValueError:
            continue
    return None


def ssh_endpoint(row, mode):
    """(host, port, how) as `vastai ssh-url` derives it, or (None, None, reason)."""
    mapping = (row.get("ports") or {}).get("22/tcp") if isinstance(row.get("ports"), dict) else None
    if mode in ("auto", "direct") and mapping and row.get("public_ipaddr"):
        try:
            return str(row["public_ipaddr"]).strip(), int(mapping[0]["HostPort"]), "direct"
        except (KeyError, IndexError, TypeError, ValueError):
            pass
    if mode == "direct":
        return None, None, "no direct SSH port (ports has no 22/tcp mapping with a public_ipaddr)"
    if not row.get("ssh_host") or row.get("ssh_port") in (None, ""):
        return None, None, "no SSH endpoint (ssh_host/ssh_port empty, no direct 22/tcp mapping)"
    port = int(row["ssh_port"])
    if "jupyter" in str(row.get("image_runtype") or ""):
        port += 1  # as vastai ssh-url: Jupyter-launched instances take SSH on the next proxy port
    return str(row["ssh_host"]).strip(), port, "proxy"


def _order_key(row, field):
    value = row.get(field)
    if value is None or value == "":
        return (2, 0, "", row.get("id") or 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return (1, 0, str(value), row.get("id") or 0)
    return (0, value, "", row.get("id") or 0)


def host_name(row, field, prefix):
    if field == "label" and str(row.get("label") or "").strip():
        return prefix + _NAME_OK.sub("-", str(row["label"]).strip())
    return "%s%s" % (prefix, row.get("id"))


def build(instances, overlays=None, overlay="", overlay_subnet="", statuses=("running",), order_by="id",
          hostname_field="id", hostname_prefix="vast-", ssh_mode="auto", ssh_user="root"):
    """Instance rows (and overlay rows) -> {hosts: [(name, vars)], excluded: [(id, reason)], warnings: [..]}.

    Pure: no I/O. Raises VastError with a one-line message for input it cannot use."""
    ids = [r.get("id") for r in instances]
    members = None
    if overlays is not None:
        ov = choose_overlay(overlays, overlay, ids)
        subnet_text = ov.get("internal_subnet") or ov.get("subnet") or overlay_subnet
        members = set(ov.get("instances") or [])
        ov_name = str(ov.get("name"))
        if not subnet_text:
            raise VastError("overlay %s has no internal_subnet in the overlays file: set overlay_subnet" % ov_name)
    else:
        subnet_text, ov_name = overlay_subnet, overlay or "the overlay"
        if not subnet_text:
            raise VastError("neither overlays_file nor overlay_subnet is set: write `vastai show overlays --raw` "
                            "to a file and set overlays_file, or set overlay_subnet to the overlay's CIDR")
    try:
        subnet = ipaddress.ip_network(str(subnet_text), strict=False)
    except ValueError:
        raise VastError("overlay subnet %r is not a CIDR: set overlay_subnet like 10.0.0.0/24" % subnet_text)
    where = {}
    for other in overlays or []:
        for iid in other.get("instances") or []:
            where.setdefault(iid, str(other.get("name")))

    kept, excluded = [], []
    for row in sorted(instances, key=lambda r: (r.get("id") is None, r.get("id") or 0)):
        iid = row.get("id")
        status = row.get("actual_status")
        if status not in statuses:
            excluded.append((iid, "actual_status %s (intended_status %s), not %s" % (
                status, row.get("intended_status"), " or ".join(statuses))))
            continue
        if members is not None and iid not in members:
            excluded.append((iid, "on overlay %s, not %s" % (where[iid], ov_name) if iid in where
                             else "not on overlay %s (vastai join overlay %s %s)" % (ov_name, ov_name, iid)))
            continue
        address = overlay_address(row.get("local_ipaddrs"), subnet)
        if address is None:
            excluded.append((iid, "no address in the overlay subnet %s (local_ipaddrs: %s)" % (
                subnet, str(row.get("local_ipaddrs") or "none").strip())))
            continue
        host, port, how = ssh_endpoint(row, ssh_mode)
        if host is None:
            excluded.append((iid, how))
            continue
        kept.append((row, address, host, port, how))

    kept.sort(key=lambda k: _order_key(k[0], order_by))
    hosts, warnings, names = [], [], {}
    for rank, (row, address, host, port, how) in enumerate(kept):
        name = host_name(row, hostname_field, hostname_prefix)
        if name in names:
            raise VastError("instances %s and %s both name the host %s: set hostname_field to id, or give them "
                            "distinct labels (vastai label instance ID LABEL)" % (names[name], row.get("id"), name))
        names[name] = row.get("id")
        hosts.append((name, {
            "ansible_host": host, "ansible_port": port, "ansible_user": ssh_user, "data_address": address,
            "node_rank": rank, "vast_instance_id": row.get("id"), "vast_machine_id": row.get("machine_id"),
            "vast_label": row.get("label"), "vast_gpu_name": row.get("gpu_name"),
            "vast_num_gpus": row.get("num_gpus"), "vast_ssh": how,
        }))
    gpus = sorted({"%sx %s" % (v["vast_num_gpus"], v["vast_gpu_name"]) for _, v in hosts})
    if len(gpus) > 1:
        warnings.append("the instances rent different GPUs (%s): cluster_gpus_per_node is one number for every "
                        "node; rent the same GPU count and model or set cluster_nproc_per_node to the smallest"
                        % ", ".join(gpus))
    if not hosts:
        warnings.append("no instance of %d is a trainer (every one left out, reasons above)" % len(instances))
    return {"hosts": hosts, "excluded": excluded, "warnings": warnings, "overlay": ov_name, "subnet": str(subnet)}


class InventoryModule(BaseInventoryPlugin):
    NAME = "vast_instances"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("vast_instances.yml", "vast_instances.yaml"))

    def _read(self, base, option, key):
        path = self.get_option(option)
        if not path:
            return None
        full = path if os.path.isabs(path) else os.path.join(base, path)
        try:
            with open(full) as fh:
                text = fh.read()
        except OSError as exc:
            raise AnsibleParserError("%s %s cannot be read (%s): write it with `vastai show %s --raw > %s`"
                                     % (option, full, exc.strerror, key, path))
        try:
            return load_rows(text, "%s %s" % (option, full), key)
        except VastError as exc:
            raise AnsibleParserError(str(exc))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        base = os.path.dirname(os.path.abspath(path))
        instances = self._read(base, "instances_file", "instances")
        overlays = self._read(base, "overlays_file", "overlays")
        try:
            result = build(instances, overlays, overlay=self.get_option("overlay"),
                           overlay_subnet=self.get_option("overlay_subnet"),
                           statuses=tuple(self.get_option("statuses")), order_by=self.get_option("order_by"),
                           hostname_field=self.get_option("hostname_field"),
                           hostname_prefix=self.get_option("hostname_prefix"),
                           ssh_mode=self.get_option("ssh_mode"), ssh_user=self.get_option("ssh_user"))
        except VastError as exc:
            raise AnsibleParserError("%s: %s" % (path, exc))
        for iid, reason in result["excluded"]:
            self.display.warning("vast_instances: instance %s left out: %s" % (iid, reason))
        for text in result["warnings"]:
            self.display.warning("vast_instances: %s" % text)
        group = self.inventory.add_group(self.get_option("group"))
        extra = self.get_option("host_vars") or {}
        for name, hostvars in result["hosts"]:
            self.inventory.add_host(name, group=group)
            for key, value in list(hostvars.items()) + list(extra.items()):
                self.inventory.set_variable(name, key, value)
