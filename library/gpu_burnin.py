#!/usr/bin/python
# -*- coding: utf-8 -*-
"""The standard and long burn-in tiers on one node: DCGM's diagnostics (module_utils/burnin.py decides)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_burnin
short_description: Run the burn-in tier's GPU diagnostics on a node and return its nvidia_driver.burnin record
description:
  - Tier C(quick) runs nothing (the preflight's quick checks are the tier).
  - Tiers C(standard) and C(long) run C(dcgmi diag -r 2 -j) or C(-r 3 -j) (about 2 and 15 minutes, NVIDIA's dcgmi
    reference) where C(dcgmi) is installed and the node has a GPU device (C(/dev/nvidia0)); the record fails naming
    each failing test and GPU. Without a GPU device or without dcgmi the record is C(skip) with the reason.
  - In check mode nothing runs (the record is C(skip)); the module never changes the node.
options:
  tier:
    description: The burn-in tier (cluster_burnin_tier).
    type: str
    choices: [quick, standard, long]
    default: quick
  timeout:
    description: Seconds dcgmi may run before it is stopped (0 waits forever).
    type: int
    default: 3600
extends_documentation_fragment: [trainyard.core.attributes]
author: trainyard
"""

EXAMPLES = r"""
- name: Run the burn-in tier's diagnostics
  gpu_burnin:
    tier: standard
  register: __nvidia_driver_burnin
"""

RETURN = r"""
record:
  description: The nvidia_driver.burnin record ({check, status, detail, fix, data}).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.trainyard.core.plugins.module_utils.burnin import run_tier


def main():
    module = AnsibleModule(argument_spec=dict(tier=dict(type="str", choices=["quick", "standard", "long"],
                                                        default="quick"),
                                              timeout=dict(type="int", default=3600)),
                           supports_check_mode=True)
    module.exit_json(changed=False, record=run_tier(module, module.params["tier"], module.params["timeout"]))


if __name__ == "__main__":
    main()
