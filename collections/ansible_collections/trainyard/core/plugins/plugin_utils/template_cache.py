# -*- coding: utf-8 -*-
"""Compiled Jinja templates kept for the whole run, compiled before the workers fork.

ansible-core 2.19 compiles a template string every time it renders it: Jinja's lexer, parser, code generator and
Python's compile(), per host and task, for every templated argument and every lazy variable the task reads. A task
whose arguments read a dozen role variables compiles about a hundred templates per host (the container role's record:
99), in a worker that exits afterwards, so nothing of it is reused.

install() wraps Jinja's Environment.compile (Jinja's public API; Ansible's environment inherits it) so that the code
object compiled from a template string is kept, keyed by the string and by everything the compilation depends on (the
environment's class, syntax and code-generation settings, the default collection). A string with a backslash is
compiled each time: Ansible escapes backslashes in its own templates' string constants and not in an include's, and
that choice is not visible to compile(). A code object does not depend on
the environment it was compiled in: Jinja's own bytecode cache reuses code objects the same way. prewarm() compiles,
in ansible-playbook's own process before a task's workers are forked, the templates the task will render (its
arguments and variables, its role's defaults and variables), so that every worker inherits them compiled.

A template that does not compile is not kept (the error is raised as before, where it is used). Only ansible-core's
public API and Jinja's are used (tests/unit/layout/test_public_api_scan.py).
"""

from __future__ import annotations

import typing as t

# At most this many templates (a converged site.yml keeps about 500 in ansible-playbook); past the limit, new ones
# compile as Ansible does.
MAX_ENTRIES = 20000
# How deep prewarm() walks nested variables.
MAX_DEPTH = 12

_cache: dict = {}
_stats = {"hits": 0, "misses": 0}
_installed: list = []
# The environments seen compiling, by their settings: prewarm() compiles with the one seen most (Ansible's default).
_envs: dict = {}


def _settings(env) -> tuple:
    """What the code Jinja generates depends on, besides the source."""
    return (type(env), env.block_start_string, env.block_end_string, env.variable_start_string,
            env.variable_end_string, env.comment_start_string, env.comment_end_string, env.line_statement_prefix,
            env.line_comment_prefix, env.trim_blocks, env.lstrip_blocks, env.newline_sequence,
            env.keep_trailing_newline, env.optimized, env.is_async, env.finalize, env.autoescape,
            tuple(sorted(env.extensions)))


def cacheable(source) -> bool:
    """A template string whose compiled code depends only on the string and the environment's settings. Ansible
    escapes backslashes in the string constants of its own templates and not in others (an include's), so a string
    with a backslash is compiled each time, as Ansible does."""
    return isinstance(source, str) and "\\" not in source


def install() -> bool:
    """Wrap Jinja's Environment.compile once (every environment of the process is Ansible's)."""
    if _installed:
        return True
    import jinja2
    from ansible.utils.collection_loader import AnsibleCollectionConfig
    original = jinja2.Environment.compile

    def compile(self, source, name=None, filename=None, raw=False, defer_init=False):  # noqa: A001 - Jinja's name
        if not cacheable(source):
            return original(self, source, name, filename, raw, defer_init)
        try:
            settings = _settings(self)
            key = (str(source), name, filename, raw, defer_init, AnsibleCollectionConfig.default_collection, settings)
            hash(key)
        except (TypeError, AttributeError):  # an unhashable setting (a custom finalize or autoescape object)
            return original(self, source, name, filename, raw, defer_init)
        seen = _envs.setdefault(settings, [self, 0])
        seen[1] += 1
        code = _cache.get(key)
        if code is not None:
            _stats["hits"] += 1
            return code
        _stats["misses"] += 1
        code = original(self, source, name, filename, raw, defer_init)
        if len(_cache) < MAX_ENTRIES:
            _cache[key] = code
        return code

    compile.__wrapped__ = original
    jinja2.Environment.compile = compile
    _installed.append(original)
    return True


def uninstall() -> None:
    """Put Jinja's compile back and forget every template (tests)."""
    if _installed:
        import jinja2
        jinja2.Environment.compile = _installed.pop()
    _cache.clear()
    _envs.clear()
    _stats.update(hits=0, misses=0)


def is_template(value: str) -> bool:
    return ("{{" in value or "{%" in value or "{#" in value) and not value.lstrip().startswith("#jinja2:")


def template_strings(value: t.Any, depth: int = 0) -> t.Iterator[str]:
    """Every string under value (dicts, lists, tuples) that holds Jinja syntax (a template with its own syntax
    header is left to the worker)."""
    if depth > MAX_DEPTH:
        return
    if isinstance(value, str):
        if is_template(value):
            yield value
    elif isinstance(value, t.Mapping):
        for v in value.values():
            yield from template_strings(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from template_strings(v, depth + 1)


def _default_env():
    """The environment Ansible templates with: the one seen compiling most; the first time, Ansible's templar
    compiles a constant to show it."""
    if not _envs:
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar, trust_as_template
        Templar(loader=DataLoader()).template(trust_as_template("{{ 0 }}"))
    return max(_envs.values(), key=lambda seen: seen[1])[0] if _envs else None


def prewarm(values: t.Iterable[t.Any]) -> int:
    """Compile every template string under values in Ansible's environment; returns how many were compiled now. A
    string that does not compile is left to the worker, which reports it where it is used."""
    if not _installed:
        return 0
    env = _default_env()
    if env is None:
        return 0
    before = _stats["misses"]
    seen: set = set()
    for value in values:
        for s in template_strings(value):
            if s in seen or not cacheable(s):
                continue
            seen.add(s)
            try:
                env.compile(str(s))
            except Exception:  # noqa: BLE001 - the worker compiles it again and reports the error in context
                pass
    return _stats["misses"] - before


def stats() -> dict:
    return dict(_stats, entries=len(_cache))
