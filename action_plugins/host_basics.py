# -*- coding: utf-8 -*-
"""Record the host-basics checks of a node from its host_facts probe (controller side, no round trip)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_basics
short_description: Record the host-basics checks of a node from its probe
description:
  - "Turns the registered result of C(host_facts) into the records C(cluster.python), C(cluster.disk), C(cluster.shm),
    C(cluster.memlock), C(cluster.docker), C(cluster.clock) and, on a node that is itself a container without an
    engine, C(cluster.container) (plugin_utils/host_basics.py), and records them as C(preflight_check) does."
  - "With I(median_of) (once, C(run_once: true)) it records nothing: given every node's clock (the C(clock) of each
    node's probe result, C({}) where the probe has none) it returns the clock reference (the median clock offset and
    the widest measurement error), which each node's call then takes as I(clocks). The cross-node work is O(n) in
    all."
  - A probe that failed (no Python that can run it) is recorded as a C(cluster.python) failure with its error and
    a skip of every other check.
  - Runs on the controller only; the host is not contacted.
options:
  median_of:
    description: The clock (C({offset, uncertainty})) of every node's registered C(host_facts) result, C({}) or None
      for a node without one; given, the action returns the clock reference (I(median), I(uncertainty), I(nodes)) and
      records nothing.
    type: list
    elements: raw
  probe:
    description: The node's registered C(host_facts) result (failed or not).
    type: dict
  clocks:
    description: The result of the I(median_of) call.
    type: dict
    default: {}
  output_root:
    description: C(cluster_output_root), the path C(cluster.disk) names.
    type: str
    default: ""
  thresholds:
    description: C(cluster_preflight) over its defaults (min_free_gb, min_shm_mb, min_memlock_kb, max_clock_skew_s,
      min_python, docker).
    type: dict
    default: {}
  launch_runtime:
    description: C(launch_runtime) (docker or host).
    type: str
    default: docker
  nccl_env_profile:
    description: C(nccl_env_profile); under ib, roce and efa a locked-memory limit fails, elsewhere it warns.
    type: str
    default: tcp
  container_engine_install:
    description: C(container_engine_install); a missing engine is a warning while the container role will install it.
    type: raw
    default: true
  container_enabled:
    description: C(container_enabled), as the inventory gives it.
    type: raw
    default: true
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Take the median of the nodes' clocks
  host_basics:
    median_of: "{{ ansible_play_hosts | map('extract', hostvars, '__cluster_host')
                   | map(attribute='clock', default={}) | list }}"
  run_once: true
  register: __cluster_clocks

- name: Record the host basics
  host_basics:
    probe: "{{ __cluster_host }}"
    clocks: "{{ __cluster_clocks }}"
    output_root: "{{ cluster_output_root }}"
    thresholds: "{{ _cluster_pf }}"
"""

RETURN = r"""
median:
  description: The median clock offset of the nodes, in seconds (with I(median_of)).
  returned: with median_of, when a node has a clock
  type: float
uncertainty:
  description: The widest measurement error of the nodes' clocks, in seconds (with I(median_of)).
  returned: with median_of, when a node has a clock
  type: float
nodes:
  description: How many nodes' clocks the reference is taken over (with I(median_of)).
  returned: with median_of
  type: int
preflight_records:
  description: Every record appended (see the C(preflight_check) action).
  returned: without median_of
  type: list
"""

from ansible.errors import AnsibleActionFail
from ansible_collections.trainyard.core.plugins.plugin_utils import bases
from ansible_collections.trainyard.core.plugins.plugin_utils import host_basics


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        if "median_of" in args:
            if not isinstance(args["median_of"], list):
                raise AnsibleActionFail("host_basics: 'median_of' must be the list of every node's probe clock (the "
                                        "values, e.g. the 'clock' of each node's host_facts result), not %s"
                                        % type(args["median_of"]).__name__)
            return host_basics.clock_reference(args["median_of"]) or {"nodes": 0}
        if not isinstance(args.get("probe"), dict):
            raise AnsibleActionFail("host_basics: 'probe' must be the registered result of host_facts")
        pf = bases.need_dict(args.get("thresholds") or {}, "host_basics: 'thresholds' (cluster_preflight)")
        missing = [k for k in host_basics.THRESHOLDS if k not in pf]
        if missing:
            raise AnsibleActionFail("host_basics: 'thresholds' lacks %s" % ", ".join(missing))
        clocks = args.get("clocks") or {}
        opts = {"thresholds": pf, "output_root": str(args.get("output_root") or ""),
                "launch_runtime": str(args.get("launch_runtime", "docker")),
                "nccl_env_profile": str(args.get("nccl_env_profile", "tcp")),
                "container_engine_install": args.get("container_engine_install", True),
                "container_enabled": args.get("container_enabled", True)}
        reference = clocks if "median" in clocks else None
        return self.record(task_vars, *host_basics.host_basics_records(args["probe"], reference, opts))
