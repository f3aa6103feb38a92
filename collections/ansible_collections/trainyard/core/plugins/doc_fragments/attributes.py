# -*- coding: utf-8 -*-
"""The documentation the project's modules and action plugins share (extends_documentation_fragment): their
attributes, and the options that name a job's state directory."""


class ModuleDocFragment(object):
    # trainyard.core.attributes: a module that runs for real in check mode (it reads, or changes nothing there),
    # shows no diff, and leaves a node as it found it on a second run.
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
"""

    # trainyard.core.attributes.job: the options of a module that works in one job's node-local state directory.
    JOB = r"""
options:
  job:
    description: Job name (C(cluster_job_name)); names the state directory C(<state_root>/<job>).
    type: str
    required: true
  state_root:
    description: Node-local state directory of all jobs (C(cluster_state_dir)).
    type: path
    default: /var/lib/trainyard
"""

    # trainyard.core.attributes.python_child: the options of a validation run in a child Python on the controller
    # (plugin_utils/python_child.py: deepspeed_validate, llamafactory_validate).
    PYTHON_CHILD = r"""
options:
  python:
    description: Python interpreter on the controller that has the validating library (default, the one running
      Ansible).
    type: str
  cache_dir:
    description: Where results are cached (default C(~/.cache/trainyard/deepspeed-validate),
      C(~/.cache/trainyard/llamafactory-validate)); empty disables the cache.
    type: str
  timeout:
    description: Seconds the validation process may take (default 180 for DeepSpeed, 300 for LLaMA-Factory).
    type: int
"""

    # trainyard.core.attributes.controller: an action plugin that decides on the controller from its arguments
    # alone, the same in check mode, without a diff.
    CONTROLLER = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""
