"""One defaults source: a variable some role's defaults/main.yml defines has that one default. No task, template,
spec, other role's default or Python-rendered template writes `VAR | default(X)` for it, which would retype the
default (and drift: train_args once fell back to /srv/outputs while the real default is /srv/trainyard/outputs).
Every play sees every role's defaults through `trainyard_defaults` it lists first.

Allowed: `default(omit)`; `hostvars[h].VAR | default(VAR)` (role defaults are not part of hostvars: a per-host
override falling back to the play's value); the entries of ALLOWED, each with its reason."""

import ast
import re

import yaml

from helpers import REPO

ROLES = REPO / "roles"
# (file, variable) -> why its `| default(...)` stays.
ALLOWED: dict[tuple[str, str], str] = {}

# A variable reference (optionally through hostvars[...]) piped into default(...).
USE = re.compile(r"""(?<![\w.'"\[\]])(?P<hv>hostvars\[[^\]]+\]\s*)?(?:\.|\[\s*['"])?(?P<var>[A-Za-z_]\w*)['"]?\]?"""
                 r"""\s*\|\s*default\(""")


def defined_by_roles() -> dict[str, str]:
    out = {}
    for f in sorted(ROLES.glob("*/defaults/main.yml")):
        for name in yaml.safe_load(f.read_text()) or {}:
            out.setdefault(name, f.parent.parent.name)
    return out


def sources():
    """(relative path, text, its first line) of the product's YAML and Jinja templates, and of every Python string
    constant that is a Jinja template (rendered by a plugin, or a module's EXAMPLES)."""
    for top in ("roles", "playbooks", "templates"):
        for f in sorted((REPO / top).rglob("*")):
            if f.suffix in (".yml", ".yaml", ".j2") and f.is_file() and not f.is_symlink():
                yield str(f.relative_to(REPO)), f.read_text(), 1
    for f in sorted(REPO.glob("*.yml")):
        yield f.name, f.read_text(), 1
    for top in ("library", "action_plugins", "filter_plugins", "callback_plugins", "inventory_plugins", "collections",
                "roles"):
        for f in sorted((REPO / top).rglob("*.py")):
            for n in ast.walk(ast.parse(f.read_text())):
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and ("{{" in n.value or "{%" in n.value):
                    yield str(f.relative_to(REPO)), n.value, n.lineno


def _argument(text: str, start: int) -> str:
    """The text of default(...)'s arguments, its opening parenthesis just before start."""
    depth, i = 1, start
    while i < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    return " ".join(text[start:i - 1].split())


def retyping_defaults():
    defined = defined_by_roles()
    for rel, text, first in sources():
        text = "\n".join("" if line.lstrip().startswith("#") else line for line in text.splitlines())
        for m in USE.finditer(text):
            var, arg = m.group("var"), _argument(text, m.end())
            if var not in defined or arg == "omit" or (m.group("hv") and arg == var):
                continue
            line = first + text.count("\n", 0, m.start())
            yield rel, line, var, arg


def _scan_sees_each_form():
    text = ("{{ a | default('x') }} {{ hostvars[h].a | default(a) }} {{ hostvars[h]['a'] | default('y') }} "
            "{{ a | default(omit) }} {{ b.a | default(1) }} {{ m[a] | default(2) }} {{ a|default(f(1), true) }}")
    got = [(m.group("var"), _argument(text, m.end()), bool(m.group("hv"))) for m in USE.finditer(text)]
    assert got == [("a", "'x'", False), ("a", "a", True), ("a", "'y'", True), ("a", "omit", False),
                   ("a", "f(1), true", False)]


def test_no_default_retypes_a_role_default():
    _scan_sees_each_form()
    hits = list(retyping_defaults())
    found = [f"{rel}:{line}: {var} | default({arg})" for rel, line, var, arg in hits if (rel, var) not in ALLOWED]
    assert not found, ("a role's defaults/main.yml defines these; drop the fallback (every play lists "
                       "trainyard_defaults first) or, through hostvars[h], fall back to the variable itself:\n" + "\n".join(found))
    stale = set(ALLOWED) - {(rel, var) for rel, _line, var, _arg in hits}
    assert not stale and all(reason.strip() for reason in ALLOWED.values()), f"allowed but gone: {sorted(stale)}"


# Plays that do not list trainyard_defaults first yet, with the reason.
PLAYS_ALLOWED: dict[str, str] = {}


def _first_is_defaults(play: dict) -> bool:
    first = (play.get("pre_tasks") or play.get("roles") or play.get("tasks") or [{}])[0]
    if isinstance(first, str):
        return first == "trainyard_defaults"
    imported = first.get("ansible.builtin.import_role") or first.get("import_role") or {}
    return first.get("role") == "trainyard_defaults" or imported.get("name") == "trainyard_defaults"


def test_every_play_lists_the_defaults_role_first():
    late = []
    for f in sorted((REPO / "playbooks").glob("*.yml")):
        rel = str(f.relative_to(REPO))
        for play in yaml.safe_load(f.read_text()):
            if "hosts" in play and rel not in PLAYS_ALLOWED and not _first_is_defaults(play):
                late.append(f"{rel}: {play.get('name')}")
    assert not late, "plays that do not list trainyard_defaults first:\n" + "\n".join(late)


def test_the_defaults_role_links_every_roles_defaults():
    links = ROLES / "trainyard_defaults" / "defaults" / "main"
    owners = sorted(f.parent.parent.name for f in ROLES.glob("*/defaults/main.yml"))
    assert owners and "trainyard_defaults" not in owners
    for role in owners:
        link = links / f"{role}.yml"
        assert link.is_symlink() and link.resolve() == (ROLES / role / "defaults" / "main.yml").resolve(), (
            f"{link}: missing; ln -s ../../../{role}/defaults/main.yml {link.relative_to(REPO)}")
    assert sorted(p.stem for p in links.iterdir()) == owners
    assert (ROLES / "trainyard_defaults" / "tasks" / "main.yml").read_text().rstrip().endswith("[]")  # runs no task
