# -*- coding: utf-8 -*-
"""The attributes the project's modules and action plugins share (extends_documentation_fragment)."""


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

    # trainyard.core.attributes.controller: an action plugin that decides on the controller from its arguments
    # alone, the same in check mode, without a diff.
    CONTROLLER = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""
