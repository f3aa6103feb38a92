"""Every filter a filter plugin of the project exports is used by a task, a playbook or a template: a filter
nothing calls is dead code with a public name. A function the plugin also needs in Python stays a function; only
its export goes."""

import re

from helpers import REPO, load

# filter name -> why it is exported though no YAML or template of the product calls it.
ALLOWED: dict[str, str] = {}


def _product_texts():
    for top in ("roles", "playbooks", "templates"):
        for f in (REPO / top).rglob("*"):
            if f.suffix in (".yml", ".yaml", ".j2") and f.is_file():
                yield f.read_text()
    for f in REPO.glob("*.yml"):
        yield f.read_text()


def _exported():
    plugins = sorted([*REPO.glob("filter_plugins/*.py"), *REPO.glob("roles/*/filter_plugins/*.py")])
    assert plugins
    for path in plugins:
        mod = load(str(path.relative_to(REPO)), "filters_used_" + path.stem)
        for name in mod.FilterModule().filters():
            yield str(path.relative_to(REPO)), name


def test_every_exported_filter_is_used_by_the_product():
    text = "\n".join(_product_texts())
    unused = [f"{path}: {name}" for path, name in _exported() if name not in ALLOWED and not re.search(
        r"\|\s*%s\b|map\(\s*['\"]%s['\"]" % (re.escape(name), re.escape(name)), text)]
    assert not unused, "filters no task, playbook or template uses (drop the export):\n" + "\n".join(unused)


def test_the_allow_list_names_exported_filters_only():
    assert set(ALLOWED) <= {name for _path, name in _exported()}
