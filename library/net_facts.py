#!/usr/bin/python
# -*- coding: utf-8 -*-
"""One network round trip of a node: interfaces, MTUs, addresses, the route to the head, the data interface
choice, and the data interface MTU set and persisted where it differs."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: net_facts
short_description: Probe a node's network, choose the data interface, set and persist its MTU
description:
  - Runs C(ip -j -d addr show) and C(ip -j route get <target>) once and returns every interface (MTU, state,
    kind, addresses), the route to the head's data address and the chosen data interface.
  - The data interface is I(iface) when given (it must exist, be up, not be loopback/virtual), otherwise the
    interface whose route reaches I(target); on the head (I(is_head), or when I(target) is local) the
    interface that holds I(target). The node's own data address I(address) must sit on it.
  - Also finds which network configuration system manages the chosen interface (netplan, NetworkManager,
    systemd-networkd, ifupdown).
  - With I(mtu) above 0, sets the chosen interface to I(mtu) where it differs (C(ip link set)) and, with
    I(persist), writes it where that system keeps it (a netplan override, a systemd-networkd drop-in, the
    ifupdown stanza, the NetworkManager connection) only when the file or setting differs. The interface
    that carries I(mgmt_address) (Ansible's own connection) is never changed.
  - Sets the facts C(network_iface), C(network_address) and C(_network_mtu) (the MTU after any change).
options:
  target:
    description: The head's data address (or the rendezvous address); a name is resolved to IPv4 first.
    type: str
    required: true
  address:
    description: This node's data address; must be on the chosen interface. Empty skips that check.
    type: str
    default: ""
  iface:
    description: Requested data interface (cluster_data_iface); empty selects by route.
    type: str
    default: ""
  is_head:
    description: This node is the head (rank 0); the interface holding I(target) is the data interface.
    type: bool
    default: false
  mtu:
    description: MTU the data interface must have; 0 sets and persists nothing (verify only, or measure).
    type: int
    default: 0
  persist:
    description: With I(mtu), also persist it with the interface's network configuration system.
    type: bool
    default: false
  mgmt_address:
    description: The address Ansible connects to (ansible_host); the interface holding it is never changed.
    type: str
    default: ""
  refuse:
    description: A reason found on the controller not to probe (e.g. no cluster model); the module fails with it.
    type: str
    default: ""
extends_documentation_fragment: [trainyard.core.attributes]
author: trainyard
"""

EXAMPLES = r"""
- name: Probe the network
  net_facts:
    target: "{{ hostvars[cluster_model.head].cluster_model.data_address }}"
    address: "{{ cluster_model.data_address }}"
    iface: "{{ cluster_data_iface }}"
    is_head: "{{ inventory_hostname == cluster_model.head }}"
    mtu: "{{ cluster_data_mtu }}"
    persist: true
    mgmt_address: "{{ ansible_host | default(inventory_hostname) }}"
  register: __network_facts
"""

RETURN = r"""
interfaces:
  description: Every interface by name.
  returned: always
  type: dict
  sample: {eth1: {name: eth1, mtu: 9000, up: true, operstate: UP, kind: veth, ipv4: [172.29.1.11], ipv6: []}}
route:
  description: The route to I(target) (C(ok), C(dev), C(type), C(gateway), C(prefsrc), C(error)).
  returned: always
  type: dict
target_ip:
  description: I(target) as an address.
  returned: always
  type: str
selected:
  description: The chosen data interface, its address and MTU, why it was chosen, and errors (empty when fine).
  returned: always
  type: dict
  sample: {iface: eth1, address: 172.29.1.12, mtu: 9000, reason: route to the head's data address, errors: []}
bridges:
  description: Container/VM bridges on the node with their MTU (containers without host networking use them).
  returned: always
  type: list
config:
  description: >-
    How the chosen interface's MTU would be persisted: C(method) netplan, networkmanager, networkd, ifupdown or
    none, with C(path), C(section) (netplan), C(connection) and C(setting) (NetworkManager), C(text) (ifupdown).
  returned: always
  type: dict
in_container:
  description: The node is itself a container (no persistent network configuration of its own).
  returned: always
  type: bool
mgmt:
  description: The chosen interface carries I(mgmt_address) (its MTU is left alone).
  returned: always
  type: bool
mtu_set:
  description: Whether the MTU was (or in check mode would be) set, and C(ip link)'s error when it refused.
  returned: always
  type: dict
  sample: {changed: true, error: ""}
persisted:
  description: Whether the persisted configuration was (or would be) changed, and the error of that change.
  returned: always
  type: dict
  sample: {changed: false, error: ""}
"""

import glob
import json
import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils.netcheck import (
    excluded_reason, networkd_matches, netplan_section, parse_ip_addr, parse_route_get, persist_text, select_iface,
)

NETWORKD_DIRS = ("/etc/systemd/network", "/run/systemd/network", "/usr/lib/systemd/network", "/lib/systemd/network")


def resolve(name):
    if not name:
        return ""
    try:
        socket.inet_pton(socket.AF_INET, name)
        return name
    except (OSError, socket.error):
        pass
    try:
        socket.inet_pton(socket.AF_INET6, name)
        return name
    except (OSError, socket.error):
        pass
    infos = socket.getaddrinfo(name, None)
    infos.sort(key=lambda i: 0 if i[0] == socket.AF_INET else 1)
    return infos[0][4][0]


def read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except (IOError, OSError):
        return None


class Probe(object):
    def __init__(self, module):
        self.module = module
        self.ip = module.get_bin_path("ip", required=True)

    def ip_json(self, args):
        rc, out, err = self.module.run_command([self.ip, "-j"] + args)
        try:
            data = json.loads(out) if out.strip() else []
        except ValueError:
            data = []
        return rc, data, err

    def netplan(self, iface):
        if not self.module.get_bin_path("netplan"):
            return None
        try:
            import yaml  # noqa: F401  (netplan itself depends on it)
        except ImportError:
            yaml = None
        for path in sorted(glob.glob("/etc/netplan/*.yaml") + glob.glob("/lib/netplan/*.yaml")
                           + glob.glob("/run/netplan/*.yaml")):
            text = read(path) or ""
            section = None
            if yaml is not None:
                try:
                    section = netplan_section(yaml.safe_load(text), iface)
                except Exception:  # a malformed file is netplan's to report; skip it here
                    section = None
            elif ("%s:" % iface) in text:
                section = "ethernets"
            if section:
                return {"method": "netplan", "path": "/etc/netplan/90-trainyard-%s.yaml" % iface,
                        "section": section, "defined_in": path}
        return None

    def networkmanager(self, iface):
        nmcli = self.module.get_bin_path("nmcli")
        if not nmcli:
            return None
        rc, out, _ = self.module.run_command([nmcli, "-t", "-g", "GENERAL.CONNECTION,GENERAL.TYPE", "device",
                                              "show", iface])
        lines = [x for x in out.splitlines() if x.strip()]
        if rc != 0 or not lines or not lines[0].strip():
            return None
        conn = lines[0].strip()
        dtype = lines[1].strip() if len(lines) > 1 else "ethernet"
        setting = {"ethernet": "802-3-ethernet.mtu", "infiniband": "infiniband.mtu", "bond": "802-3-ethernet.mtu",
                   "vlan": "802-3-ethernet.mtu"}.get(dtype, "802-3-ethernet.mtu")
        rc, out, _ = self.module.run_command([nmcli, "-t", "-g", setting, "connection", "show", conn])
        return {"method": "networkmanager", "connection": conn, "setting": setting,
                "current": out.strip() if rc == 0 else "", "path": ""}

    def networkd(self, iface):
        if not os.path.isdir("/run/systemd/netif"):
            return None
        seen = {}
        for d in NETWORKD_DIRS:
            for path in glob.glob(os.path.join(d, "*.network")):
                seen.setdefault(os.path.basename(path), path)  # /etc overrides /run overrides /usr/lib
        for name in sorted(seen):
            if networkd_matches(read(seen[name]), iface):
                return {"method": "networkd", "defined_in": seen[name],
                        "path": "/etc/systemd/network/%s.d/90-trainyard-mtu.conf" % name}
        return None

    def ifupdown(self, iface):
        if not (self.module.get_bin_path("ifup") or os.path.exists("/sbin/ifup")):
            return None  # a file nothing reads at boot would persist nothing
        paths = ["/etc/network/interfaces"] + sorted(glob.glob("/etc/network/interfaces.d/*"))
        for path in paths:
            text = read(path)
            if text is None:
                continue
            for line in text.splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[0] == "iface" and parts[1] == iface and parts[2] == "inet":
                    return {"method": "ifupdown", "path": path, "text": text}
        return None

    def config(self, iface):
        if not iface:
            return {"method": "none", "path": ""}
        for finder in (self.netplan, self.networkmanager, self.networkd, self.ifupdown):
            found = finder(iface)
            if found:
                return found
        return {"method": "none", "path": ""}


class Change(object):
    """Sets and persists the data interface MTU where it differs (check mode: says it would)."""

    def __init__(self, module):
        self.module = module

    def run(self, argv):
        rc, _, err = self.module.run_command(argv)
        return "" if rc == 0 else (err.strip() or "%s failed (rc %d)" % (argv[0], rc))

    def set_mtu(self, iface, mtu, current):
        if current == mtu:
            return {"changed": False, "error": ""}, current
        if self.module.check_mode:
            return {"changed": True, "error": ""}, current
        error = self.run([self.module.get_bin_path("ip", required=True), "link", "set", "dev", iface, "mtu", str(mtu)])
        took = read("/sys/class/net/%s/mtu" % iface)
        return {"changed": not error, "error": error}, int(took) if took and took.strip().isdigit() else current

    def persist(self, config, iface, mtu):
        method = config["method"]
        if method == "none":
            return {"changed": False, "error": ""}
        if method == "networkmanager":
            if str(config.get("current")) == str(mtu):
                return {"changed": False, "error": ""}
            error = "" if self.module.check_mode else self.run(
                [self.module.get_bin_path("nmcli", required=True), "connection", "modify", config["connection"],
                 config["setting"], str(mtu)])
            return {"changed": not error, "error": error}
        path = config["path"]
        text, mode, reload = persist_text(method, iface, mtu, config.get("section"), config.get("text"))
        if read(path) == text:
            return {"changed": False, "error": ""}
        if self.module.check_mode:
            return {"changed": True, "error": ""}
        try:
            if not os.path.isdir(os.path.dirname(path)):
                os.makedirs(os.path.dirname(path), 0o755)
            if os.path.exists(path) and method == "ifupdown":
                self.module.backup_local(path)
            tmp = "%s.trainyard-tmp" % path
            with open(tmp, "w") as fh:
                fh.write(text)
            os.chmod(tmp, mode)
            self.module.atomic_move(tmp, path)
        except (IOError, OSError) as exc:
            return {"changed": False, "error": "cannot write %s: %s" % (path, exc)}
        return {"changed": True, "error": self.run(reload) if reload else ""}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            target=dict(type="str", required=True),
            address=dict(type="str", default=""),
            iface=dict(type="str", default=""),
            is_head=dict(type="bool", default=False),
            mtu=dict(type="int", default=0),
            persist=dict(type="bool", default=False),
            mgmt_address=dict(type="str", default=""),
            refuse=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["refuse"]:
        module.fail_json(msg=p["refuse"])
    probe = Probe(module)
    try:
        target = resolve(p["target"])
        address = resolve(p["address"])
    except (OSError, socket.error) as exc:
        module.fail_json(msg="cannot resolve %s / %s on this node: %s; use addresses in the inventory "
                             "(data_address, cluster_master_addr)" % (p["target"], p["address"], exc))
    rc, records, err = probe.ip_json(["-d", "addr", "show"])
    if rc != 0:
        module.fail_json(msg="ip -j -d addr show failed: %s" % err.strip())
    links = parse_ip_addr(records)
    rc, rrecs, err = probe.ip_json(["route", "get", target])
    route = parse_route_get(rrecs, rc, err)
    selected = select_iface(links, p["iface"], route, target, address, p["is_head"])
    bridges = [{"name": n, "mtu": l["mtu"], "up": l["up"]} for n, l in sorted(links.items())
               if n != "lo" and excluded_reason(n) and not n.startswith("veth")]
    in_container = os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")
    iface = selected["iface"]
    link = links.get(iface) or {}
    mgmt = bool(iface) and p["mgmt_address"] in (link.get("ipv4", []) + link.get("ipv6", []))
    config = probe.config(iface)
    mtu_set, persisted = {"changed": False, "error": ""}, {"changed": False, "error": ""}
    if p["mtu"] > 0 and iface and not mgmt:
        change = Change(module)
        mtu_set, selected["mtu"] = change.set_mtu(iface, p["mtu"], selected["mtu"])
        link["mtu"] = selected["mtu"]
        if p["persist"]:
            persisted = change.persist(config, iface, p["mtu"])
    module.exit_json(changed=mtu_set["changed"] or persisted["changed"], interfaces=links, route=route,
                     target_ip=target, selected=selected, bridges=bridges, config=config, in_container=in_container,
                     mgmt=mgmt, mtu_set=mtu_set, persisted=persisted,
                     ansible_facts={"network_iface": iface or "", "network_address": selected.get("address") or "",
                                    "_network_mtu": selected["mtu"]})


if __name__ == "__main__":
    main()
