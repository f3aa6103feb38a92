"""docs/architecture.md "Where code goes", enforced on the tree (issue 34): a newcomer guesses the file from the
concern because every kind of code has one home and the homes keep their contracts.

* Every plugin kind lives in exactly one directory (modules in the top-level ``library/``, filters in the
  top-level ``filter_plugins/``, shared code in the collection), and two filter files never define one name.
* ``module_utils/`` holds node-side code only: it imports nothing of the controller (``plugin_utils``,
  ``ansible.plugins``, ansible-core outside ``ansible.module_utils``), and each file is reached from a module in
  ``library/`` or a script a role ships to the nodes (``roles/*/files/``); what only the controller runs belongs in
  ``plugin_utils/``.
* Actions take values as arguments: no action reads ``task_vars`` (or a host's ``hostvars``) under a name that came
  from its arguments, and none reads a registered result (``__role_x``) under a name written in the plugin.
* No task's display name is a key: no YAML value of the product names a task (``"role : Task name"`` or a task's
  own name), so renaming a task never changes behaviour.

ALLOWED names what remains, with the reason; a stale entry fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import re

import yaml

from helpers import REPO

COLL = "collections/ansible_collections/trainyard/core/plugins"
MU = COLL + "/module_utils"
PU = COLL + "/plugin_utils"

# Plugin kind -> the one directory that holds it.
HOMES = {
    "library": "library",
    "module_utils": MU,
    "plugin_utils": PU,
    "doc_fragments": COLL + "/doc_fragments",
    "action_plugins": "action_plugins",
    "filter_plugins": "filter_plugins",
    "callback_plugins": "callback_plugins",
    "inventory_plugins": "inventory_plugins",
    "strategy_plugins": "strategy_plugins",
}
# Directory names Ansible reads as each kind (in a role, a playbook's directory or a collection).
KIND_DIRS = {
    "library": {"library", "modules"},
    "module_utils": {"module_utils"},
    "plugin_utils": {"plugin_utils"},
    "doc_fragments": {"doc_fragments"},
    "action_plugins": {"action_plugins", "action"},
    "filter_plugins": {"filter_plugins", "filter"},
    "callback_plugins": {"callback_plugins", "callback"},
    "inventory_plugins": {"inventory_plugins", "inventory"},
    "strategy_plugins": {"strategy_plugins", "strategy"},
    "other": {"lookup_plugins", "lookup", "test_plugins", "test", "vars_plugins", "vars",
              "connection_plugins", "become_plugins", "cache_plugins", "shell_plugins", "terminal_plugins",
              "cliconf_plugins", "httpapi_plugins", "netconf_plugins"},
}
SKIP_DIRS = {".git", ".venv", ".cache", ".sim", "runs", ".ansible", ".whl", ".colls", "tests", "docs", "node_modules"}

# (file, what): why it stays.
ALLOWED: dict = {}


def assert_allowed(found, scope, what):
    """found ({(file, what)}) holds only ALLOWED entries, and every ALLOWED entry of files under scope is found."""
    bad = sorted(found - set(ALLOWED))
    assert not bad, "%s (docs/architecture.md 'Where code goes'): %s" % (what, bad)
    stale = sorted(k for k in ALLOWED if k[0].startswith(scope) and k not in found)
    assert not stale, "ALLOWED entries no longer needed: %s" % stale


def rel(path):
    return str(path.relative_to(REPO))


# ---------------------------------------------------------------------------------------------- one home per kind

def kind_dirs():
    """{kind: sorted directories of the product that hold .py files of that kind}."""
    found = {}
    stack = [REPO]
    while stack:
        d = stack.pop()
        for p in d.iterdir():
            if not p.is_dir() or p.is_symlink() or p.name in SKIP_DIRS:
                continue
            stack.append(p)
            if not any(p.glob("*.py")):
                continue
            for kind, names in KIND_DIRS.items():
                # "modules", "action", "filter", ... count only inside a collection's plugins/.
                plugin_subdir = p.parent.name == "plugins"
                if p.name in names and (p.name.endswith(("_plugins", "_utils", "_fragments", "library"))
                                        or plugin_subdir):
                    found.setdefault(kind, set()).add(rel(p))
    return {k: sorted(v) for k, v in found.items()}


def test_every_plugin_kind_has_one_home():
    found = kind_dirs()
    wrong = {k: v for k, v in found.items() if v != [HOMES.get(k)]}
    assert not wrong, "a plugin kind outside its one home (docs/architecture.md 'Where code goes'): %s" % wrong
    assert set(found) == set(HOMES), "a home holds no file any more: update HOMES: %s" % (set(HOMES) - set(found))


def filter_names(path):
    """{filter name: line} of a filter plugin file (the keys of the dict its filters() returns)."""
    tree = ast.parse(path.read_text(), str(path))
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "filters":
            for d in ast.walk(node):
                if isinstance(d, ast.Dict):
                    out.update({k.value: k.lineno for k in d.keys if isinstance(k, ast.Constant)})
    return out


def test_no_two_filter_files_define_one_name():
    seen, twice = {}, []
    for path in sorted((REPO / "filter_plugins").glob("*.py")):
        for name in filter_names(path):
            if name in seen:
                twice.append("%s: in %s and %s" % (name, seen[name], path.name))
            seen[name] = path.name
    assert len(seen) > 40
    assert not twice, "one filter name, two files (Ansible keeps one silently): %s" % twice


# ---------------------------------------------------------------------------------------------- module_utils

def imports(path):
    """[(line, dotted module)] of every import in path (relative imports as '.name')."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = "." * node.level + (node.module or "")
            out.append((node.lineno, mod))
            out += [(node.lineno, mod + "." + a.name) for a in node.names]
    return out


def controller_import(module):
    """Why `module` is the controller's, or '' when node-side code may import it."""
    if module.startswith(".") or "plugin_utils" in module:
        return "controller-only code (plugin_utils) or a relative import"
    if module == "ansible" or module.startswith("ansible."):
        if module == "ansible.module_utils" or module.startswith("ansible.module_utils."):
            return ""
        return "ansible-core's controller side (only ansible.module_utils reaches a node)"
    return ""


def module_utils_findings(path):
    return ["%s:%d: imports %s: %s" % (rel(path), line, mod, why)
            for line, mod in imports(path) for why in [controller_import(mod)] if why]


def test_module_utils_import_nothing_of_the_controller():
    files = sorted((REPO / MU).glob("*.py"))
    assert len(files) > 10
    bad = [f for p in files for f in module_utils_findings(p)]
    assert not bad, "module_utils is node-side code (docs/architecture.md 'Where code goes'):\n" + "\n".join(bad)


def test_the_scan_sees_a_controller_import(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("from ansible_collections.trainyard.core.plugins.plugin_utils import bases\n"
                 "from ansible.plugins.action import ActionBase\nfrom ansible.module_utils.basic import AnsibleModule\n"
                 "import json\n")
    found = [mod for _, mod in imports(p) if controller_import(mod)]
    assert "ansible_collections.trainyard.core.plugins.plugin_utils" in found
    assert "ansible.plugins.action" in found
    assert not any(m.startswith(("ansible.module_utils", "json")) for m in found)


def module_utils_used_on_nodes():
    """Names of the module_utils files a module of library/, a script of roles/*/files/ or (transitively) another
    file reached that way imports."""
    names = {p.stem for p in (REPO / MU).glob("*.py")}
    pkg = "ansible_collections.trainyard.core.plugins.module_utils"

    def used_by(path):
        out = set()
        for _, mod in imports(path):
            if mod.startswith(pkg + "."):
                out.add(mod[len(pkg) + 1:].split(".")[0])
        return out & names

    roots = sorted(REPO.glob("library/*.py")) + sorted(p for p in REPO.glob("roles/*/files/**/*.py"))
    reached, todo = set(), set().union(*(used_by(p) for p in roots))
    while todo:
        name = todo.pop()
        reached.add(name)
        todo |= used_by(REPO / MU / (name + ".py")) - reached
    return reached, names


def test_every_module_utils_file_reaches_a_node():
    reached, names = module_utils_used_on_nodes()
    assert not names - reached, ("module_utils files no module or shipped script imports (controller-only code "
                                 "belongs in plugin_utils/): %s" % sorted(names - reached))


# ---------------------------------------------------------------------------------------------- actions: values in

def _names_in(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _reads_args(node, tainted):
    """True when node reads the action's arguments (args / self._task.args) or a name derived from them."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and (n.id == "args" or n.id in tainted):
            return True
        if isinstance(n, ast.Attribute) and n.attr == "args" and isinstance(n.value, ast.Attribute) \
                and n.value.attr == "_task":
            return True
    return False


def _lookup_key(call_or_sub):
    """(mapping, key node) when the node reads a mapping: task_vars[k], task_vars.get(k), hostvars[h].get(k),
    self.var(task_vars, k); else None."""
    node = call_or_sub
    if isinstance(node, ast.Subscript):
        return _mapping(node.value), node.slice
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        if node.func.attr == "get":
            return _mapping(node.func.value), node.args[0]
        if node.func.attr == "var" and len(node.args) >= 2 and _mapping(node.args[0]) == "task_vars":
            return "task_vars", node.args[1]
    return None


def _mapping(node):
    """'task_vars', 'hostvars' or None: the mapping a lookup reads."""
    names = _names_in(node) | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    text = ast.unparse(node)
    if "hostvars" in text:
        return "hostvars"
    if "task_vars" in names and text in ("task_vars", "self._task_vars"):
        return "task_vars"
    return None


def _tainted(fn, params):
    """Names of fn bound from the action's arguments: its tainted params, then (two passes) what is assigned from
    the arguments or from those names."""
    tainted = set(params)
    for _ in range(2):
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                    and _reads_args(node.value, tainted):
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    tainted |= _names_in(t)
    return tainted


def action_findings(source, path="<src>"):
    """['what'] of every lookup in an action plugin that breaks 'values in, not names'."""
    tree = ast.parse(source, path)
    fns = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    by_name = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    # A helper of the file called with a name from the arguments: that parameter carries it too.
    params = {f.name: set() for f in fns}
    for _ in range(3):
        for fn in fns:
            tainted = _tainted(fn, params[fn.name])
            for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]:
                callee = by_name.get(call.func.id)
                if callee is not None:
                    names = [a.arg for a in callee.args.args]
                    params[callee.name] |= {names[i] for i, a in enumerate(call.args)
                                            if i < len(names) and _reads_args(a, tainted)}
    out = []
    for fn in fns:
        tainted = _tainted(fn, params[fn.name])
        for node in ast.walk(fn):
            found = _lookup_key(node)
            if found and found[0]:
                mapping, key = found
                if isinstance(key, ast.Constant):
                    if isinstance(key.value, str) and key.value.startswith("__"):
                        out.append("registered result by name: %s" % key.value)
                elif _reads_args(key, tainted):
                    out.append("%s key from the arguments: %s" % (mapping, ast.unparse(key)))
            # A registered result's name handed to a helper that reads it.
            if isinstance(node, ast.Call):
                out += ["registered result by name: %s" % a.value for a in node.args
                        if isinstance(a, ast.Constant) and isinstance(a.value, str)
                        and re.fullmatch(r"__[a-z][a-z0-9_]*", a.value)]
    return sorted(set(out))


def test_actions_take_values_not_names():
    found = {(rel(p), f) for p in sorted(REPO.glob("action_plugins/*.py"))
             for f in action_findings(p.read_text(), str(p))}
    assert_allowed(found, "action_plugins/", "an action reads a variable by a name it was given, or another task's "
                   "registered result by name: pass the value as an argument instead")


def test_the_action_scan_sees_names_passed_as_strings():
    src = '''
class ActionModule:
    def run(self, tmp=None, task_vars=None):
        args = self._task.args
        name = args.get("result")
        alias = name
        a = task_vars.get(name)
        b = task_vars[alias]
        c = task_vars["hostvars"][h].get(args["other"])
        d = self.var(task_vars, args.get("var"))
        e = task_vars.get("__role_result")
        f = helper(task_vars, "__role_other")
        ok = task_vars.get("inventory_hostname"), self.var(task_vars, "cluster_job_name"), args.get("value")
'''
    assert action_findings(src) == sorted([
        "task_vars key from the arguments: name", "task_vars key from the arguments: alias",
        "hostvars key from the arguments: args['other']", "task_vars key from the arguments: args.get('var')",
        "registered result by name: __role_result", "registered result by name: __role_other"])


# ---------------------------------------------------------------------------------------------- display names

def product_yaml():
    files = [*REPO.glob("*.yml"), *REPO.glob("playbooks/*.yml"), *REPO.glob("roles/*/tasks/*.yml"),
             *REPO.glob("roles/*/handlers/*.yml"), *REPO.glob("roles/*/defaults/main.yml"),
             *REPO.glob("roles/*/vars/*.yml")]
    return sorted(p for p in files if not p.is_symlink())


def _tasks(node, role, out):
    """Collect (role, task name) of every task in a loaded YAML document."""
    if isinstance(node, list):
        for item in node:
            _tasks(item, role, out)
    elif isinstance(node, dict):
        if isinstance(node.get("name"), str) and "{{" not in node["name"]:
            out.add((role, node["name"]))
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            if key in node:
                _tasks(node[key], role, out)


def _values(node, out, key=None):
    """Every string value of a YAML document except the tasks' own 'name' and the handlers' notify/listen."""
    if isinstance(node, list):
        for item in node:
            _values(item, out)
    elif isinstance(node, dict):
        for k, v in node.items():
            # A handler is notified by its name (or its listen topic): that is Ansible's own contract.
            if k not in ("name", "notify", "listen") or not isinstance(v, (str, list)):
                _values(v, out, k)
    elif isinstance(node, str):
        out.append(node)


def display_name_keys(docs):
    """[(file, name)] of every value in docs ({file: loaded YAML}) that names a task."""
    names = set()
    for path, doc in docs.items():
        role = path.split("/")[1] if path.startswith("roles/") else ""
        _tasks(doc, role, names)
    full = {"%s : %s" % (r, n) for r, n in names if r} | {n for _, n in names}
    out = []
    for path, doc in docs.items():
        values = []
        _values(doc, values)
        for v in values:
            for name in full:
                # A quoted name inside an expression, or the whole value.
                if v.strip() == name or "'%s'" % name in v or '"%s"' % name in v:
                    out.append((path, name))
    return sorted(set(out))


def test_no_task_display_name_is_a_key():
    docs = {rel(p): yaml.safe_load(p.read_text()) for p in product_yaml()}
    found = set(display_name_keys(docs))
    assert_allowed(found, "roles/", "a task's display name used as a value (renaming the task would change what "
                   "runs): register the task and pass its result instead")


def test_the_display_name_scan_sees_a_name_as_key():
    docs = {
        "roles/r/tasks/main.yml": [{"name": "Read the GPUs", "x": 1}, {"name": "Decide", "check": {
            "result_task": "r : Read the GPUs"}}],
        "playbooks/p.yml": [{"name": "Play", "tasks": [{"name": "Other", "when": "'Decide' in done_tasks"}]}],
    }
    assert display_name_keys(docs) == [("playbooks/p.yml", "Decide"), ("roles/r/tasks/main.yml", "r : Read the GPUs")]


# ---------------------------------------------------------------------------------------------- YAML: values in

# Keys whose value is a variable's name by Ansible's own contract.
NAME_KEYS = {"register", "loop_var", "index_var"}


def registered_names_passed(docs):
    """[(file, key, value)] of every YAML value of docs ({file: loaded YAML}) that is a registered result's bare name
    (``__role_x``) under a key other than Ansible's own (register, loop_var): a task handing an action a name to read."""
    out = []

    def walk(node, path, key=None):
        if isinstance(node, list):
            for item in node:
                walk(item, path, key)
        elif isinstance(node, dict):
            for k, v in node.items():
                if k not in NAME_KEYS:
                    walk(v, path, k)
        elif isinstance(node, str) and re.fullmatch(r"__[a-z][a-z0-9_]*", node.strip()):
            out.append((path, key, node.strip()))
    for path, doc in docs.items():
        walk(doc, path)
    return sorted(out)


def test_no_task_passes_a_registered_result_by_name():
    docs = {rel(p): yaml.safe_load(p.read_text()) for p in product_yaml()}
    found = registered_names_passed(docs)
    assert not found, ("a task passes a registered result's name (docs/architecture.md 'Where code goes'): pass "
                       "the value (\"{{ __x }}\") instead: %s" % found)


def test_the_registered_name_scan_sees_a_name_passed_as_an_argument():
    docs = {"roles/r/tasks/main.yml": [
        {"name": "Probe", "probe_module": {}, "register": "__r_probe"},
        {"name": "Median", "host_basics": {"median_of": "__r_probe"}, "run_once": True},
        {"name": "Check", "check": {"result": "{{ __r_probe }}", "peers": "__r_peers"}, "loop": [1],
         "loop_control": {"loop_var": "__r_item"}}]}
    assert registered_names_passed(docs) == [("roles/r/tasks/main.yml", "median_of", "__r_probe"),
                                             ("roles/r/tasks/main.yml", "peers", "__r_peers")]


# ---------------------------------------------------------------------------------------------- verdicts per role

def role_check_ids(source, roles):
    """{role: sorted check ids} of the records a Python file builds: a role's id ("<role>.<name>") as the value of a
    dict's "check" key, or as the first argument of a record helper (a function whose name says rec: _rec(...));
    reading a record (rec.get("network.mtu"), drift("network.mtu", ...)) is not building one."""
    pat = re.compile(r"(%s)\.[a-z][a-z0-9_]*" % "|".join(sorted(roles, key=len, reverse=True)))
    out = {}

    def note(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and pat.fullmatch(node.value):
            out.setdefault(pat.fullmatch(node.value).group(1), set()).add(node.value)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "check":
                    note(v)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Name) and "rec" in node.func.id:
            note(node.args[0])
    return {r: sorted(v) for r, v in out.items()}


def verdict_files(files, roles):
    """{role: [files of plugin_utils that build its records]} over files ({name: source})."""
    out = {}
    for name, source in sorted(files.items()):
        for role in role_check_ids(source, roles):
            out.setdefault(role, []).append(name)
    return out


def test_each_roles_controller_verdicts_live_in_one_plugin_utils_file():
    roles = {p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir()}
    files = {p.name: p.read_text() for p in sorted((REPO / PU).glob("*.py"))}
    found = verdict_files(files, roles)
    assert len(found) >= 5 and found["container"] == ["container_checks.py"], found
    twice = {r: f for r, f in found.items() if len(f) > 1}
    assert not twice, ("a role's controller verdicts in more than one plugin_utils file (docs/architecture.md 'Where "
                       "code goes': one file per role): %s" % twice)


def test_the_verdict_scan_sees_a_role_built_in_two_files():
    files = {"a_checks.py": 'def f():\n    return [{"check": "a.one", "status": "pass"}, _rec("a.two", "fail")]\n',
             "b.py": 'X = {"check": "a.three"}\nY = {"detail": "see a.one"}\nrecord("b.x")\n',
             "c.py": 'rec.get("a.one")\ndrift("a.one", "x")\n'}
    assert role_check_ids(files["a_checks.py"], {"a", "b"}) == {"a": ["a.one", "a.two"]}
    assert verdict_files(files, {"a", "b"}) == {"a": ["a_checks.py", "b.py"], "b": ["b.py"]}
