"""docs/architecture.md "Argument specs": `rolespec_validate: false` only where the validate play has already checked
every role variable against the roles' argument specs, and the reason written once, there (issue 34).

A role import with `rolespec_validate: false` is covered when the playbook it is in starts with the validate play
(`import_playbook: validate.yml`), or, inside a role's task file, when every playbook that imports that role does.
"""

from __future__ import annotations

import re

import yaml

from helpers import REPO

IMPORTS = ("ansible.builtin.import_role", "ansible.builtin.include_role", "import_role", "include_role")
PLAYBOOK_IMPORTS = ("ansible.builtin.import_playbook", "import_playbook")


def _walk(node):
    """Every dict of a loaded YAML document."""
    if isinstance(node, list):
        for item in node:
            yield from _walk(item)
    elif isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)


def role_imports(doc):
    """[(role, import arguments)] of every import_role/include_role of a loaded YAML document."""
    return [(args.get("name"), args) for d in _walk(doc) for key in IMPORTS
            for args in [d.get(key)] if isinstance(args, dict)]


def validated_first(doc):
    """True when a playbook's first entry imports the validate play."""
    first = doc[0] if isinstance(doc, list) and doc else {}
    return any(str(first.get(k, "")).rsplit("/", 1)[-1] == "validate.yml" for k in PLAYBOOK_IMPORTS)


def uncovered(docs):
    """[(file, role, why)] of every `rolespec_validate: false` of docs ({file: loaded YAML}) no validate play covers."""
    playbooks = {p: d for p, d in docs.items() if not p.startswith("roles/")}
    importers = {}
    for path, doc in playbooks.items():
        for role, _ in role_imports(doc):
            importers.setdefault(role, []).append(path)
    out = []
    for path, doc in docs.items():
        for role, args in role_imports(doc):
            if args.get("rolespec_validate", True) is not False:
                continue
            if path in playbooks:
                if not validated_first(doc):
                    out.append((path, role, "the playbook does not start with import_playbook: validate.yml"))
                continue
            owner = path.split("/")[1]
            via = importers.get(owner) or []
            bad = [p for p in via if not validated_first(playbooks[p])]
            if not via or bad:
                out.append((path, role, "role %s is imported by %s, not only by playbooks that start with the "
                                        "validate play" % (owner, bad or "no playbook")))
    return sorted(out)


def product_docs():
    files = [*REPO.glob("*.yml"), *REPO.glob("playbooks/*.yml"), *REPO.glob("roles/*/tasks/*.yml")]
    return {str(p.relative_to(REPO)): yaml.safe_load(p.read_text()) for p in sorted(files) if not p.is_symlink()}


def test_every_rolespec_validate_false_follows_the_validate_play():
    docs = product_docs()
    found = sum(1 for doc in docs.values() for _, a in role_imports(doc) if a.get("rolespec_validate") is False)
    assert found > 10
    bad = uncovered(docs)
    assert not bad, ("rolespec_validate: false where no validate play checked the role's variables first (docs/"
                     "architecture.md 'Argument specs'): drop it so Ansible checks them, or import validate.yml "
                     "first: %s" % bad)


def test_the_reason_is_written_once_in_architecture_md():
    text = (REPO / "docs/architecture.md").read_text()
    section = re.search(r"^### Argument specs\n(.*?)(?=^#)", text, re.S | re.M)
    assert section and "rolespec_validate: false" in section.group(1), "docs/architecture.md: '### Argument specs'"
    others = [p for p in REPO.glob("docs/*.md") if p.name != "architecture.md" and "rolespec_validate" in p.read_text()]
    assert not others, "the reason for rolespec_validate: false belongs in docs/architecture.md only: %s" % others


def test_the_scan_sees_an_uncovered_import():
    docs = {
        "playbooks/ok.yml": [{"import_playbook": "validate.yml"},
                             {"hosts": "all", "tasks": [{"import_role": {"name": "a", "rolespec_validate": False}}]}],
        "playbooks/bad.yml": [{"hosts": "all", "tasks": [
            {"ansible.builtin.import_role": {"name": "a", "rolespec_validate": False}},
            {"ansible.builtin.import_role": {"name": "b"}}]}],
        "roles/b/tasks/main.yml": [{"include_role": {"name": "a", "tasks_from": "reset.yml",
                                                     "rolespec_validate": False}}],
        "roles/a/tasks/main.yml": [{"import_role": {"name": "c", "rolespec_validate": False}}],
    }
    assert [(p, r) for p, r, _ in uncovered(docs)] == [("playbooks/bad.yml", "a"), ("roles/a/tasks/main.yml", "c"),
                                                       ("roles/b/tasks/main.yml", "a")]
