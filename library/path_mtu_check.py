#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Prove the data path from this node to every peer: don't-fragment pings at the full payload and at 1472."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: path_mtu_check
short_description: Don't-fragment pings from this node to its peers in parallel, and a TCP connect to the head
description:
  - For every peer, one C(ping -M do -c 1 -W <wait> -s <size>) at the full payload (MTU - 28) and one at
    1472 bytes (what any Ethernet path carries), all peers and both sizes at once in threads.
  - A jumbo-frame mismatch drops only large frames, silently; the 1472 probe tells it apart from a dead path.
  - A failed probe is repeated I(retries) times before it counts (a single lost echo on a loaded host is
    not a finding).
  - With I(connect), in the same call one TCP connect to the rendezvous port on the head with a timeout (as
    C(port_check) C(mode=connect)); a timeout (packets dropped, e.g. a firewall DROP rule) is told from a refusal,
    an ICMP unreachable and a local blackhole/prohibit route.
  - Read-only (ICMP echo and one TCP connect), so it runs the same in check mode.
  - The network role calls it through its C(network_checks) action, which picks the peers (a full mesh up to
    C(network_path_mtu_full_mesh_max) nodes, above it a ring, seeded random rings and one pair per data subnet
    pair) and records the checks.
options:
  peers:
    description: Peers to probe, C({name, address}); empty pings nothing.
    type: list
    elements: dict
    default: []
  payload:
    description: Full ICMP payload in bytes (cluster_data_mtu - 28).
    type: int
    required: true
  base:
    description: The small payload that any Ethernet path carries.
    type: int
    default: 1472
  wait:
    description: Seconds to wait for each reply.
    type: int
    default: 1
  retries:
    description: Extra attempts for a probe that failed.
    type: int
    default: 1
  workers:
    description: Most pings in flight at once.
    type: int
    default: 64
  connect:
    description: C({address, port, timeout}) of the rendezvous port to connect to once (timeout in seconds).
    type: dict
extends_documentation_fragment: [trainyard.core.attributes]
author: trainyard
"""

EXAMPLES = r"""
- name: Prove the path to two peers and connect to the head's rendezvous port
  path_mtu_check:
    peers: [{name: node2, address: 10.0.0.12}, {name: node3, address: 10.0.0.13}]
    payload: 8972
    connect: {address: 10.0.0.11, port: 39500, timeout: 3}
  register: __network_path
"""

RETURN = r"""
probes:
  description: Per peer, the C(full) and C(base) results (C(ok), C(outcome), C(mtu_hint), C(message)).
  returned: always
  type: dict
  sample: {node3: {address: 10.0.0.13, full: {ok: false, outcome: lost}, base: {ok: true, outcome: ok}}}
failed_peers:
  description: Peers where either probe failed.
  returned: always
  type: list
seconds:
  description: Wall time of all probes.
  returned: always
  type: float
reach:
  description: The connect's C(outcome) (ok, timeout, refused, unreachable, blocked, error), C(seconds), C(message).
  returned: with I(connect)
  type: dict
  sample: {outcome: ok, seconds: 0.002, message: ""}
"""

import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils.netcheck import parse_ping, ping_argv
from ansible_collections.trainyard.core.plugins.module_utils.netprobe import connect


def main():
    module = AnsibleModule(
        argument_spec=dict(
            peers=dict(type="list", elements="dict", default=[]),
            payload=dict(type="int", required=True),
            base=dict(type="int", default=1472),
            wait=dict(type="int", default=1),
            retries=dict(type="int", default=1),
            workers=dict(type="int", default=64),
            connect=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    target = p["connect"]
    if target is not None and not (target.get("address") and str(target.get("port") or "").isdigit()):
        module.fail_json(msg="connect needs address and port, got %r" % (target,))
    ping = module.get_bin_path("ping", required=True) if p["peers"] else "ping"
    peers = []
    for peer in p["peers"]:
        if not peer.get("name") or not peer.get("address"):
            module.fail_json(msg="each peer needs name and address, got %r" % (peer,))
        peers.append((str(peer["name"]), str(peer["address"])))
    sizes = {"full": p["payload"], "base": p["base"]}

    def one(job):
        name, address, kind = job
        res = None
        for _ in range(max(1, p["retries"] + 1)):
            argv = ping_argv(address, sizes[kind], p["wait"])
            argv[0] = ping
            rc, out, err = module.run_command(argv)
            res = parse_ping(rc, out, err)
            # A local "message too long" or a blocked route will not change on a retry.
            if res["ok"] or res["outcome"] in ("too_big", "blocked"):
                break
        res["size"] = sizes[kind]
        return name, address, kind, res

    jobs = [(n, a, k) for n, a in peers for k in ("full", "base")]
    t0 = time.time()
    probes = {}
    if jobs:
        with ThreadPoolExecutor(max_workers=max(1, min(p["workers"], len(jobs)))) as pool:
            for name, address, kind, res in pool.map(one, jobs):
                probes.setdefault(name, {"address": address})[kind] = res
    failed = sorted(n for n, r in probes.items() if not (r["full"]["ok"] and r["base"]["ok"]))
    result = dict(changed=False, probes=probes, failed_peers=failed, seconds=round(time.time() - t0, 3))
    if target is not None:
        outcome, took, message = connect(str(target["address"]), int(target["port"]),
                                         float(target.get("timeout") or 3.0))
        result["reach"] = {"outcome": outcome, "seconds": took, "message": message}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
