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

    # trainyard.core.attributes.controller: an action plugin that decides on the controller from its arguments
    # alone, the same in check mode, without a diff.
    CONTROLLER = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""
