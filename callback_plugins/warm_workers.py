# -*- coding: utf-8 -*-
"""Load the Jinja filters and tests and the action and connection plugins once, in ansible-playbook's own process,
before it forks its first worker.

Ansible forks one worker per host and task. A worker that templates a filter finds the filter loader empty and
loads every filter file of every configured path (its imports and regular expressions included), the same for
tests and for the action plugin of its task, and throws it all away when it exits. Loaded here once, every worker
inherits them (the controller CPU with and without it: docs/benchmarks.md, the scale section's ansible.cfg table,
row "warm_workers off").
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: warm_workers
type: aggregate
short_description: Load the plugins every worker needs before the first worker is forked
description:
  - Loaded without being enabled (it prints nothing). When the playbook starts, it loads the filter, test and
    action plugins of the configured paths and the connection and shell plugins of the run, so the workers
    Ansible forks per host and task inherit them instead of each loading them again.
  - A plugin that fails to load here is left to the worker, which reports it as it would have.
options:
  enabled:
    description: Load the plugins before the first fork; false leaves each worker to load them, as Ansible does.
    type: bool
    default: true
    env:
      - name: TRAINYARD_WARM_WORKERS
    ini:
      - section: callback_warm_workers
        key: enabled
"""

from ansible.plugins.loader import action_loader, connection_loader, filter_loader, shell_loader, test_loader
from ansible.utils.display import Display

from ansible_collections.trainyard.core.plugins.plugin_utils import bases

display = Display()


def warm() -> None:
    for loader in (filter_loader, test_loader):
        for _plugin in loader.all():  # the first call loads every file; the workers find them cached
            pass
    for _plugin in action_loader.all(class_only=True):
        pass
    for name in ("ssh", "local", "community.docker.docker"):
        connection_loader.get(name, class_only=True)
    shell_loader.get("sh")


class CallbackModule(bases.AlwaysLoadedCallback):
    CALLBACK_NAME = "warm_workers"

    def v2_playbook_on_start(self, playbook):
        if not self.get_option("enabled"):
            return
        try:
            warm()
        except Exception as e:  # loading is an optimisation: a worker loads what is missing, and says why it failed
            display.vvv("warm_workers: %s: %s" % (type(e).__name__, e))
