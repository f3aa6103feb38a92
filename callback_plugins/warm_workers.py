# -*- coding: utf-8 -*-
"""Make the workers Ansible forks cheap: the plugins they need loaded once, the module payloads kept between runs.

Ansible forks one worker per host and task. A worker that templates a filter finds the filter loader empty and
loads every filter file of every configured path (its imports and regular expressions included), the same for
tests and for the action plugin of its task, and throws it all away when it exits. Loaded here once, in
ansible-playbook's own process before the first fork, every worker inherits them (the controller CPU with and
without it: docs/benchmarks.md, the scale section's ansible.cfg table, row "warm_workers off").

The first worker that runs a module builds the module's payload, and Ansible deletes it when the run ends; the
payloads are kept between runs here (plugin_utils/module_cache.py says how, and why it is safe), so a converged run
builds none.
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
  - With O(module_cache), the module payloads Ansible builds in a run are kept under the user's Ansible temporary
    directory (C(~/.ansible/tmp/trainyard-payloads/), 0700, keyed by a fingerprint of every source a payload can
    hold) and put back at the start of the next run, so a converged run builds none.
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
  module_cache:
    description: Keep the module payloads between runs; false builds them in every run, as Ansible does.
    type: bool
    default: true
    env:
      - name: TRAINYARD_MODULE_CACHE
    ini:
      - section: callback_warm_workers
        key: module_cache
  compiled_templates:
    description:
      - Keep every Jinja template compiled for the whole run (C(plugin_utils/template_cache.py)), and compile in
        ansible-playbook's own process the templates the workers will render (the play's variables and its roles'
        defaults and variables when the play starts, each task's arguments and variables before its workers are
        forked). The workers inherit them compiled instead of each compiling them again.
    type: bool
    default: true
    env:
      - name: TRAINYARD_COMPILED_TEMPLATES
    ini:
      - section: callback_warm_workers
        key: compiled_templates
  freeze_heap:
    description:
      - Move every object ansible-playbook holds into Python's permanent generation before each task's workers are
        forked (C(gc.freeze())), after a full collection, which walks only what was created since the last freeze.
        The cyclic collector then no longer walks the inventory, the variables and the loaded plugins, in
        ansible-playbook or in the workers, and a worker's collector does not write to (and so copy) the pages it
        shares with its parent.
      - Objects that become cyclic garbage after they were frozen are kept until the run ends; reference counting
        still frees everything else.
    type: bool
    default: true
    env:
      - name: TRAINYARD_FREEZE_HEAP
    ini:
      - section: callback_warm_workers
        key: freeze_heap
"""

import gc
import os
import sys
from pathlib import Path

import ansible
from ansible import constants as C
from ansible import context
from ansible.plugins.loader import action_loader, connection_loader, filter_loader, shell_loader, test_loader
from ansible.utils.display import Display

from ansible_collections.trainyard.core.plugins.plugin_utils import bases, module_cache, template_cache

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


def payload_fingerprint() -> str:
    """The fingerprint of every source a payload can hold, as the run starts (a source changed during the run gives
    the next run another fingerprint, so what this run keeps under this one is never used with other sources)."""
    args = context.CLIARGS.get("args") or ()
    playbook_dir = Path(os.path.abspath(os.path.dirname(args[0]))) if args else None
    collection_roots = [Path(os.path.expanduser(p)) for p in C.COLLECTIONS_PATHS]
    collection_roots += [Path(p) for p in sys.path if p and os.path.isdir(os.path.join(p, "ansible_collections"))]
    roots = module_cache.source_roots(
        Path(ansible.__file__).resolve().parent, collection_roots,
        [Path(os.path.expanduser(p)) for p in C.DEFAULT_MODULE_PATH or ()],
        [Path(os.path.expanduser(p)) for p in C.DEFAULT_MODULE_UTILS_PATH or ()], playbook_dir,
        [Path(os.path.expanduser(p)) for p in C.DEFAULT_ROLES_PATH or ()])
    return module_cache.fingerprint(roots, module_cache.versions())


class CallbackModule(bases.AlwaysLoadedCallback):
    CALLBACK_NAME = "warm_workers"
    _fingerprint = None
    _templates = False
    _roles_seen: set = set()

    def v2_playbook_on_start(self, playbook):
        if not self.get_option("enabled"):
            return
        self._roles_seen = set()
        self._templates = bool(self.get_option("compiled_templates")) and template_cache.install()
        try:
            warm()
        except Exception as e:  # loading is an optimisation: a worker loads what is missing, and says why it failed
            display.vvv("warm_workers: %s: %s" % (type(e).__name__, e))
        if self.get_option("module_cache"):
            try:
                self._fingerprint = payload_fingerprint()
                store, why = module_cache.store_dir(Path(C.DEFAULT_LOCAL_TMP).parent, self._fingerprint, create=False)
                if store is not None:
                    n = module_cache.restore(store, Path(C.DEFAULT_LOCAL_TMP))
                    display.vvv("warm_workers: %d module payload(s) from %s" % (n, store))
                elif not why.endswith("No such file or directory"):
                    display.vvv("warm_workers: module payloads built in this run: %s" % why)
            except Exception as e:  # the payloads are an optimisation: the workers build what is missing
                display.vvv("warm_workers: module payloads: %s: %s" % (type(e).__name__, e))

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._compile(task)
        self._freeze()

    def v2_playbook_on_handler_task_start(self, task):
        self._compile(task)
        self._freeze()

    def v2_playbook_on_play_start(self, play):
        """The play's variables and every role's defaults and variables (the lazy role variables a task reads are
        templated in its workers)."""
        if not self._templates:
            return
        values = [play.vars]
        for role in play.get_roles():
            if id(role) not in self._roles_seen:
                self._roles_seen.add(id(role))
                values += [role.get_default_vars(), role.get_vars(include_params=True)]
        self._prewarm(values, "play %s" % play.get_name())

    def _compile(self, task):
        """The task's arguments and variables compiled here, before its workers fork."""
        if self._templates:
            self._prewarm([task.args, task.vars], task.get_name())

    def _prewarm(self, values, what):
        try:
            n = template_cache.prewarm(values)
            if n:
                display.vvvv("warm_workers: %d template(s) compiled for %s" % (n, what))
        except Exception as e:  # compiling ahead is an optimisation: the workers compile what is missing
            display.vvv("warm_workers: templates: %s: %s" % (type(e).__name__, e))

    def _freeze(self):
        if self.get_option("enabled") and self.get_option("freeze_heap"):
            gc.collect()
            gc.freeze()

    def v2_playbook_on_stats(self, stats):
        if self._templates:
            display.vvv("warm_workers: compiled templates: %s" % template_cache.stats())
        if not (self.get_option("enabled") and self.get_option("module_cache")) or not self._fingerprint:
            return
        try:
            store, why = module_cache.store_dir(Path(C.DEFAULT_LOCAL_TMP).parent, self._fingerprint, create=True)
            if store is None:
                display.vvv("warm_workers: module payloads not kept: %s" % why)
                return
            n = module_cache.save(Path(C.DEFAULT_LOCAL_TMP), store)
            removed = module_cache.prune(store.parent)
            display.vvv("warm_workers: %d module payload(s) kept in %s%s" % (
                n, store, "; removed the older %s" % ", ".join(removed) if removed else ""))
        except Exception as e:
            display.vvv("warm_workers: module payloads not kept: %s: %s" % (type(e).__name__, e))
