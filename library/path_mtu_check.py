#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Prove the data path from this node to every peer: don't-fragment pings at the full payload and at 1472."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: path_mtu_check
short_description: Don't-fragment pings from this node to every peer, in parallel
description:
  - For every peer, one C(ping -M do -c 1 -W <wait> -s <size>) at the full payload (MTU - 28) and one at
    1472 bytes (what any Ethernet path carries), all peers and both sizes at once in threads.
  - A jumbo-frame mismatch drops only large frames, silently; the 1472 probe tells it apart from a dead path.
  - A failed probe is repeated I(retries) times before it counts (a single lost echo on a loaded host is
    not a finding).
  - Read-only (ICMP echo only).
options:
  peers:
    description: Peers to probe, C({name, address}). One of I(peers) and I(plan) is required.
    type: list
    elements: dict
  plan:
    description:
      - The peers this node probes and the coverage of the scheme they come from, C({peers, coverage}), as the
        network role's C(network_path_plan) filter builds it (a full mesh up to C(network_path_mtu_full_mesh_max)
        nodes, above it a ring, seeded random rings and one pair per data subnet pair).
      - I(coverage) comes back in the result as it came, so the record states which pairs were proved.
    type: dict
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
extends_documentation_fragment: [trainyard.core.attributes]
author: trainyard
"""

EXAMPLES = r"""
- name: Prove the path to the peers the pair scheme gives this node
  path_mtu_check:
    plan: "{{ hostvars | network_path_plan(ansible_play_hosts, inventory_hostname, 16, 2, 0) }}"
    payload: 8972
  register: __network_path

- name: Prove the path to every other node
  path_mtu_check:
    peers: [{name: node2, address: 10.0.0.12}, {name: node3, address: 10.0.0.13}]
    payload: 8972
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
coverage:
  description: The scheme's coverage from I(plan) (scheme, pairs, full_mesh_pairs, text, ...); empty without a plan.
  returned: always
  type: dict
  sample: {scheme: ring + sample, pairs: 192, full_mesh_pairs: 2016, text: "ring + 2 seeded random rings ..."}
seconds:
  description: Wall time of all probes.
  returned: always
  type: float
"""

import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils.netcheck import parse_ping, ping_argv


def main():
    module = AnsibleModule(
        argument_spec=dict(
            peers=dict(type="list", elements="dict"),
            plan=dict(type="dict"),
            payload=dict(type="int", required=True),
            base=dict(type="int", default=1472),
            wait=dict(type="int", default=1),
            retries=dict(type="int", default=1),
            workers=dict(type="int", default=64),
        ),
        required_one_of=[("peers", "plan")],
        supports_check_mode=True,
    )
    p = module.params
    ping = module.get_bin_path("ping", required=True)
    plan = p["plan"] or {}
    peers = []
    for peer in (plan.get("peers") or []) if p["plan"] is not None else p["peers"]:
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
    module.exit_json(changed=False, probes=probes, failed_peers=failed, coverage=plan.get("coverage") or {},
                     seconds=round(time.time() - t0, 3))


if __name__ == "__main__":
    main()
