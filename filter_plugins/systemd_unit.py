# -*- coding: utf-8 -*-
"""Filters that put values into systemd unit files as data, escaped per systemd.unit(5) and systemd.service(5).

``systemd_exec``: an argument list → one ExecStart= value. Every argument is double-quoted with C-style escapes
(backslash and quote), ``%`` is doubled (specifiers) and ``$`` is doubled (environment expansion), so a path
with spaces, quotes, ``%``, ``$`` or ``;`` reaches the process as exactly one argument.
``systemd_path``: one path → a value for path-list settings (ReadWritePaths=): quoted, ``%`` doubled.
Control characters (a newline would end the setting) are refused with a one-line error naming the value.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def _check(value, what):
    s = str(value)
    bad = [c for c in s if ord(c) < 32 or ord(c) == 127]
    if bad:
        raise AnsibleFilterError("%s %r holds a control character (%r): a unit file setting is one line; rename "
                                 "the path" % (what, s, bad[0]))
    return s


def _quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_exec(argv):
    """ExecStart= value for argv (a list of strings)."""
    if isinstance(argv, (str, bytes)) or not argv:
        raise AnsibleFilterError("systemd_exec needs a non-empty list of arguments, got %r" % (argv,))
    out = []
    for a in argv:
        s = _check(a, "argument")
        out.append(_quote(s.replace("%", "%%").replace("$", "$$")))
    return " ".join(out)


def systemd_path(path):
    """A path for a path-list setting (ReadWritePaths=, ReadOnlyPaths=)."""
    return _quote(_check(path, "path").replace("%", "%%"))


def systemd_text(text):
    """Free text (Description=): specifiers escaped, control characters refused."""
    return _check(text, "text").replace("%", "%%")


class FilterModule(object):
    def filters(self):
        return {"systemd_exec": systemd_exec, "systemd_path": systemd_path, "systemd_text": systemd_text}
