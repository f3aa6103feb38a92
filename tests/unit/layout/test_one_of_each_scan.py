"""One of each (issue 34): a concern the product decides in one place is never decided a second time.

Scanned on the AST of the product's Python (string constants that are not docstrings or the DOCUMENTATION /
EXAMPLES / RETURN blocks, imports, calls and function names):

* who holds a TCP port: the text of /proc/net/tcp{,6} ("net/tcp"), a /proc/PID/fd directory ("/fd") and a socket
  link target ("socket:[") are read in module_utils/proc_sockets.py only;
* "did you mean": difflib's get_close_matches / SequenceMatcher, an edit distance or nearest-name function, and a
  "did you mean" message without plugin_utils/did_you_mean.py, only there.

ALLOWED names the exceptions with the reason; a stale entry fails, so the list only shrinks.
"""

from __future__ import annotations

import ast
import re

from helpers import REPO
from test_public_api_scan import product_files, split_by_allowed

MU = "collections/ansible_collections/trainyard/core/plugins/module_utils/"
PU = "collections/ansible_collections/trainyard/core/plugins/plugin_utils/"
HOMES = {"port": MU + "proc_sockets.py", "did_you_mean": PU + "did_you_mean.py"}

# (file, what): why it is not a second implementation.
ALLOWED = {
    (MU + "jobtree.py", "fd path '/proc/self/fd/%d'"): "reopens one of its own descriptors, scans nothing",
    (PU + "nccl_vars.py", "def suggest"): "nearest() over the known variable list, nothing of its own",
    (PU + "cluster_model.py", "def _did_you_mean"): "the wording of the inventory messages around nearest()",
}

PORT_TEXT = (("net/tcp", "net/tcp text"), ("socket:[", "socket link target"))
FD_PATH = re.compile(r"/fd(/|$)")
NEAREST_DEF = re.compile(r"distance|levenshtein|nearest|did_you_mean|suggest|close_match", re.I)
DOC_BLOCKS = {"DOCUMENTATION", "EXAMPLES", "RETURN"}


def _docstrings(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in DOC_BLOCKS for t in node.targets):
            out.add(id(node.value))
    return out


def findings(source, rel="<src>"):
    """[(kind, what)] of every implementation of a one-home concern in source."""
    tree = ast.parse(source, rel)
    docs = _docstrings(tree)
    imports_dym = False
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("plugin_utils.did_you_mean"):
            imports_dym = True
        if isinstance(node, ast.ImportFrom) and node.module == "difflib":
            out += [("did_you_mean", "difflib." + a.name) for a in node.names
                    if a.name in ("get_close_matches", "SequenceMatcher")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "difflib" \
                and node.attr in ("get_close_matches", "SequenceMatcher"):
            out.append(("did_you_mean", "difflib." + node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and NEAREST_DEF.search(node.name):
            out.append(("did_you_mean", "def " + node.name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
            for marker, what in PORT_TEXT:
                if marker in text:
                    out.append(("port", "%s %r" % (what, text)))
            if text.startswith(("/proc", "%s/", "%d/")) and FD_PATH.search(text):
                out.append(("port", "fd path %r" % text))
            if "did you mean" in text.lower():
                out.append(("did_you_mean", "message"))
    if imports_dym:
        out = [f for f in out if f != ("did_you_mean", "message")]
    return out


def test_one_home_per_concern():
    found = [(rel, what, "%s: %s (the one home: %s)" % (rel, what, HOMES[kind])) for rel in product_files()
             for kind, what in findings((REPO / rel).read_text(), rel) if rel != HOMES[kind]]
    bad, stale = split_by_allowed(found, ALLOWED)
    assert not bad, "a second implementation of a one-home concern:\n" + "\n".join(sorted(set(bad)))
    assert not stale, "no longer offending: remove from ALLOWED: %s" % stale


def test_the_scan_catches_what_it_is_meant_to():
    src = ('"""Reads /proc/net/tcp (a docstring: fine)."""\n'
           "import difflib\n"
           "from difflib import get_close_matches, unified_diff\n"
           "def levenshtein(a, b):\n    return 0\n"
           "def holders(port):\n"
           "    open('/proc/net/tcp6').read()\n"
           "    d = '/proc/%d/fd' % 1\n"
           "    t.startswith('socket:[')\n"
           "    difflib.get_close_matches('a', ['b'])\n"
           "    return 'x: did you mean y?'\n")
    assert sorted(findings(src)) == sorted([
        ("did_you_mean", "difflib.get_close_matches"), ("did_you_mean", "def levenshtein"),
        ("port", "net/tcp text '/proc/net/tcp6'"), ("port", "fd path '/proc/%d/fd'"),
        ("port", "socket link target 'socket:['"), ("did_you_mean", "difflib.get_close_matches"),
        ("did_you_mean", "message")])
