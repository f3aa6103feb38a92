"""No private ansible-core API in the product's Python (issue 34): what an ansible-core upgrade may change
without notice is never touched, so the product runs on every release its requirements allow.

The rule, checked on the AST of every product file (PRODUCT_ROOTS):

* no import of a module under ``ansible.`` with a component that starts with ``_`` (``ansible._internal``,
  ``ansible.module_utils._internal``, ...);
* no read of an attribute whose name starts with ``_`` (dunders aside) from an object that is not the code's own:
  ``x._name`` and ``getattr(x, "_name")`` (``hasattr``/``setattr`` too) fail unless ``x`` is

  - ``self`` or ``cls`` itself: a plugin's own attributes, including the ones its ansible-core base class hands
    to subclasses (``ActionBase._task``, ``_templar``, ``_connection``, ``_execute_module``, ...: that is the
    plugin API). What is read *from* them is not the plugin's own: ``self._connection._shell`` fails;
  - a name this file imported from a module outside ``ansible`` (the standard library: ``os._exit``; this
    project's own modules: ``cluster_model._plain``).

  Everything else (a hostvars mapping, a task result, an AnsibleModule, a Display, a variable manager) is an
  object of ansible-core or of unknown origin, so its ``_`` attributes are off limits.

ALLOWED names the remaining reads with the reason; a stale entry fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast

from helpers import REPO

PRODUCT_ROOTS = ["library", "action_plugins", "filter_plugins", "callback_plugins", "inventory_plugins",
                 "collections"]

# (file, "expression._attr"): why it stays.
ALLOWED = {
    ("library/job_files.py", "module._diff"):
        "AnsibleModule has no public accessor for --diff; ansible-core's own modules (file, replace, git) read it",
    ("library/nvidia_gpu_facts.py", "module._diff"):
        "AnsibleModule has no public accessor for --diff; ansible-core's own modules (file, replace, git) read it",
}


def product_files():
    out = [p for r in PRODUCT_ROOTS for p in (REPO / r).rglob("*.py")]
    out += list(REPO.glob("roles/*/filter_plugins/*.py")) + list(REPO.glob("roles/*/files/**/*.py"))
    return sorted(str(p.relative_to(REPO)) for p in out)


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_ansible_module(module):
    parts = (module or "").split(".")
    return parts[0] == "ansible" and any(p.startswith("_") for p in parts[1:])


def findings(source, rel="<src>"):
    """["line: what"] of every breach of the rule in source."""
    tree = ast.parse(source, rel)
    own = set()  # names bound to imports from outside ansible-core
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _private_ansible_module(a.name):
                    out.append("%d: import %s" % (node.lineno, a.name))
                if a.name.split(".")[0] != "ansible":
                    own.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if _private_ansible_module(mod) or (mod == "ansible" and any(_private(a.name) for a in node.names)):
                out.append("%d: from %s import %s" % (node.lineno, mod, ", ".join(a.name for a in node.names)))
            if mod.split(".")[0] != "ansible" or node.level:
                own.update(a.asname or a.name for a in node.names)

    def base_ok(expr):
        return isinstance(expr, ast.Name) and (expr.id in ("self", "cls") or expr.id in own)

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not base_ok(node.value):
            out.append("%d: %s.%s" % (node.lineno, ast.unparse(node.value), node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 and \
                isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) and \
                _private(node.args[1].value) and not base_ok(node.args[0]):
            out.append("%d: %s._%s" % (node.lineno, ast.unparse(node.args[0]), node.args[1].value[1:]))
    return sorted(set(out), key=lambda s: (int(s.split(":")[0]), s))


def split_by_allowed(found, allowed):
    """found: [(file, what, line to report)] -> (the lines not in allowed, the allowed (file, what) never found)."""
    keys = set((rel, what) for rel, what, _ in found)
    return [line for rel, what, line in found if (rel, what) not in allowed], sorted(k for k in allowed if k not in keys)


def test_no_private_ansible_core_api():
    found = [(rel, f.split(": ", 1)[1], "%s:%s" % (rel, f)) for rel in product_files()
             for f in findings((REPO / rel).read_text(), rel)]
    bad, stale = split_by_allowed(found, ALLOWED)
    assert not bad, ("private ansible-core API (pass values as task arguments, read task_vars or hostvars[host], "
                     "use the public property):\n" + "\n".join(bad))
    assert not stale, "no longer offending: remove from ALLOWED: %s" % stale


def test_the_scan_catches_what_it_is_meant_to():
    src = ("import os\n"
           "from ansible._internal._datatag._tags import Origin\n"
           "import ansible.module_utils._internal as x\n"
           "from ansible.utils.display import Display\n"
           "from ansible_collections.trainyard.core.plugins.plugin_utils import cluster_model\n"
           "display = Display()\n"
           "class A:\n"
           "    def run(self, hostvars, result):\n"
           "        self._task, self._templar, os._exit, cluster_model._plain, self.__class__\n"
           "        hostvars._variable_manager\n"
           "        getattr(hostvars, '_variable_manager', None)\n"
           "        self._connection._shell\n"
           "        result._result\n"
           "        display._final_q\n"
           "        getattr(self, '_task')\n")
    assert [f.split(": ", 1)[1] for f in findings(src)] == [
        "from ansible._internal._datatag._tags import Origin", "import ansible.module_utils._internal",
        "hostvars._variable_manager", "hostvars._variable_manager", "self._connection._shell", "result._result",
        "display._final_q"]
