"""The docs a newcomer reads: the README (two commands, links that resolve), docs/variables.md generated from the
roles' argument specs, and the argument specs themselves."""

import subprocess
import sys

from helpers import REPO, load


def test_variables_reference_is_current():
    r = subprocess.run([sys.executable, str(REPO / "docs/gen_variables.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_readme_starts_with_the_two_commands_and_its_links_resolve():
    import re
    text = (REPO / "README.md").read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    assert [line.split("#")[0].strip() for line in first_block.splitlines()] == ["make demo", "make test"]
    assert text.index("make demo") < text.index("## ")  # before any section
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" not in target:
            assert (REPO / target).exists(), f"README links to {target}, which does not exist"


# Paths the docs name that a checkout does not hold until something generates them.
GENERATED_PATHS = {"inventory/sim/": "written by tests/sim/simcluster.py up (gitignored)"}


def test_every_path_the_docs_name_exists():
    """Every relative link of every Markdown file, and every `path` in backquotes under one of the repository's
    top-level directories, names something in the checkout (a file moved or removed leaves no stale reference)."""
    import re
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    top = {f.split("/")[0] for f in tracked if "/" in f}
    stale = []
    for rel in (f for f in tracked if f.endswith(".md") and not f.startswith("tests/data/")):  # data: others' docs
        md = REPO / rel
        for n, line in enumerate(md.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)#\s]+)", line):
                if "://" not in target and not target.startswith("mailto:") and not (md.parent / target).exists():
                    stale.append(f"{rel}:{n}: link {target}")
            for path in re.findall(r"`([^`\s]+)`", line):
                path = path.split("::")[0].rstrip(".,:;")
                if (path.split("/")[0] in top and "/" in path and not re.search(r"[<>*{}$~|]", path)
                        and path not in GENERATED_PATHS and not (REPO / path).exists()):
                    stale.append(f"{rel}:{n}: {path}")
    assert not stale, "paths the docs name that do not exist:\n" + "\n".join(stale)


def test_readme_and_troubleshooting_read_in_a_terminal():
    """The README stays short (the full symptom list lives in docs/troubleshooting.md); no line a terminal or a
    diff cannot show."""
    readme = (REPO / "README.md").read_bytes()
    assert len(readme) < 20_000, f"README.md is {len(readme)} bytes: move references into docs/"
    for doc in ("README.md", "docs/troubleshooting.md"):
        long = [i for i, line in enumerate((REPO / doc).read_text().splitlines(), 1) if len(line) > 200]
        assert not long, f"{doc}: lines over 200 characters: {long}"


def test_table_lists_every_option_of_every_role():
    gen = load("docs/gen_variables.py")
    import yaml
    text = gen.table()
    for spec_file in REPO.glob("roles/*/meta/argument_specs.yml"):
        opts = (yaml.safe_load(spec_file.read_text())["argument_specs"]["main"].get("options") or {})
        for name in opts:
            assert f"`{name}`" in text, f"{name} from {spec_file} missing"


def test_every_option_is_written_once_per_role():
    """Entry points other than main reuse main's option specs through YAML aliases, so nothing is typed twice."""
    import re

    import yaml
    for spec_file in REPO.glob("roles/*/meta/argument_specs.yml"):
        text = spec_file.read_text()
        entry_points = yaml.safe_load(text)["argument_specs"]
        main = entry_points["main"]["options"]
        for ep, body in entry_points.items():
            for opt, spec in ((body or {}).get("options") or {}).items():
                assert spec == main.get(opt), f"{spec_file}: {ep}.{opt} differs from main's"
        written = re.findall(r"^      ([a-z0-9_]+):(?: &[a-z0-9_]+)?$", text, re.M)
        assert len(written) == len(set(written)), f"{spec_file}: an option is written more than once"


def test_validation_reads_the_specs_as_ansible_does():
    """The validate play (libyaml) and Ansible's own entry-point check (AnsibleLoader) see the same anchored specs."""
    import yaml
    from ansible.parsing.yaml.loader import AnsibleLoader
    from ansible_collections.trainyard.core.plugins.plugin_utils.cluster_model import load_role_specs

    specs = load_role_specs(REPO / "roles")
    for spec_file in REPO.glob("roles/*/meta/argument_specs.yml"):
        text = spec_file.read_text()
        assert AnsibleLoader(text).get_single_data() == yaml.safe_load(text), spec_file
        role = spec_file.parent.parent.name
        entry_points = yaml.safe_load(text)["argument_specs"]
        merged = {}
        for ep in sorted(entry_points, key=lambda n: n == "main"):  # main's spec of an option wins
            merged.update((entry_points[ep] or {}).get("options") or {})
        assert specs[role]["options"] == merged, role


# ------------------------------------------------------------------------------ check ids and the role READMEs
CHECK_ID = r"[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*){1,2}"


def _yaml_check_ids() -> dict:
    """Check ids recorded by preflight_check tasks ({check: id} or records: [{check: id}, ...], or a record built in
    the task's vars: a dict with check and ok or status), in any YAML file of the roles and playbooks: a task moved
    to another file is still found."""
    import re

    import yaml
    found: dict = {}

    def walk(node, path):
        if isinstance(node, dict):
            for key, val in node.items():
                if key in ("preflight_check", "trainyard.preflight_check") and isinstance(val, dict):
                    recs = val.get("records") if isinstance(val.get("records"), list) else []
                    for rec in [val, *recs]:
                        check = rec.get("check") if isinstance(rec, dict) else None
                        if isinstance(check, str) and re.fullmatch(CHECK_ID, check):
                            found.setdefault(check, set()).add(path)
                walk(val, path)
            check = node.get("check")
            if isinstance(check, str) and re.fullmatch(CHECK_ID, check) and ("ok" in node or "status" in node):
                found.setdefault(check, set()).add(path)
        elif isinstance(node, list):
            for item in node:
                walk(item, path)

    for f in sorted([*REPO.glob("roles/**/*.yml"), *REPO.glob("playbooks/**/*.yml"), *REPO.glob("*.yml")]):
        walk(list(yaml.safe_load_all(f.read_text())), str(f.relative_to(REPO)))
    return found


def _python_check_ids() -> dict:
    """Check ids the Python code builds into records: {"check": "<id>"} literals, constants named *_CHECK, and calls of
    record builders (a function putting its first parameter, or an f-string prefix + it, under "check") with a
    literal first argument or a loop variable over a list literal."""
    import ast
    import re

    found: dict = {}
    dirs = ("library", "collections/ansible_collections/trainyard/core/plugins", "action_plugins", "filter_plugins",
            "callback_plugins", "inventory_plugins", "roles")
    for f in sorted(p for d in dirs for p in (REPO / d).rglob("*.py")):
        tree, path = ast.parse(f.read_text()), str(f.relative_to(REPO))

        def add(value):
            if isinstance(value, str) and re.fullmatch(CHECK_ID, value):
                found.setdefault(value, set()).add(path)

        builders, lists, loops = {}, {}, {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.args.args:
                first = node.args.args[0].arg
                for d in (n for n in ast.walk(node) if isinstance(n, ast.Dict)):
                    for k, v in zip(d.keys, d.values):
                        if isinstance(k, ast.Constant) and k.value == "check":
                            if isinstance(v, ast.Name) and v.id == first:
                                builders[node.name] = ""
                            elif (isinstance(v, ast.JoinedStr) and len(v.values) == 2
                                  and isinstance(v.values[0], ast.Constant)
                                  and isinstance(v.values[1], ast.FormattedValue)
                                  and getattr(v.values[1].value, "id", None) == first):
                                builders[node.name] = v.values[0].value
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                if isinstance(node.value, (ast.List, ast.Tuple)):
                    for name in names:
                        lists.setdefault(name, []).extend(e.value for e in node.value.elts
                                                          if isinstance(e, ast.Constant))
                elif isinstance(node.value, ast.Constant) and any(n.endswith("CHECK") for n in names):
                    add(node.value.value)
            elif isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if isinstance(k, ast.Constant) and k.value == "check" and isinstance(v, ast.Constant):
                        add(v.value)
        for node in ast.walk(tree):
            gens = getattr(node, "generators", None) or ([node] if isinstance(node, ast.For) else [])
            for g in gens:
                if isinstance(g.target, ast.Name) and isinstance(g.iter, ast.Name) and g.iter.id in lists:
                    loops.setdefault(g.target.id, []).extend(lists[g.iter.id])
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args:
                prefix = builders.get(getattr(node.func, "id", None) or getattr(node.func, "attr", None))
                if prefix is None:
                    continue
                arg = node.args[0]
                if isinstance(arg, ast.Constant):
                    add(prefix + str(arg.value))
                elif isinstance(arg, ast.Name) and prefix:
                    for value in loops.get(arg.id, []):
                        add(prefix + str(value))
    return found


def recorded_check_ids() -> dict:
    """{check id: {files that record it}} over the whole product."""
    ids: dict = {}
    for part in (_yaml_check_ids(), _python_check_ids()):
        for check, files in part.items():
            ids.setdefault(check, set()).update(files)
    return ids


def role_readme_checks() -> dict:
    """{check id: [(role README, file it names)]} from the rows of every role README's "## Checks" table."""
    import re

    rows: dict = {}
    for readme in sorted(REPO.glob("roles/*/README.md")):
        text = readme.read_text()
        section = text.split("\n## Checks", 1)[1].split("\n## ", 1)[0] if "\n## Checks" in text else ""
        for m in re.finditer(rf"^\| `({CHECK_ID})` \|.*\| `([^`|]+)` \|$", section, re.M):
            rows.setdefault(m.group(1), []).append((str(readme.relative_to(REPO)), m.group(2)))
    return rows


def test_the_collector_finds_checks_of_every_kind():
    ids = recorded_check_ids()
    assert "network.mtu" in ids  # a task's literal id
    assert any(f.endswith(".py") for f in ids["nvidia_driver.xid"])  # a module's records
    assert "container.health.shm" in ids  # an f-string builder over a list of names
    assert "host.reachable" in ids  # a *_CHECK constant
    assert len(ids) > 50


def test_every_check_id_is_in_one_role_readme_naming_the_file_that_has_it():
    """A reader who sees a check id in the report finds, in one hop, the role README and the file where it lives."""
    ids, rows = recorded_check_ids(), role_readme_checks()
    problems = []
    for check in sorted(ids):
        where = rows.get(check, [])
        if len(where) != 1:
            problems.append(f"{check} (recorded in {sorted(ids[check])}) is listed in {len(where)} role READMEs: "
                            f"{[r for r, _ in where]}")
            continue
        readme, named = where[0]
        target = REPO / named
        text = target.read_text() if target.is_file() else ""
        head, _, last = check.rpartition(".")
        # The id literally, or (a family of records built by an f-string) its prefix and its last part.
        if check not in text and not (f'"{head}.{{' in text and f'"{last}"' in text):
            problems.append(f"{readme} names {named} for {check}, which does not contain it "
                            f"(recorded in {sorted(ids[check])})")
    for check, where in rows.items():
        if check not in ids:
            problems.append(f"{where[0][0]} lists {check}, which nothing records")
    assert not problems, "\n".join(problems)


def test_every_module_and_action_documents_itself_as_ansible_reads_it():
    """DOCUMENTATION, EXAMPLES and RETURN of every module and action plugin parse as ansible-doc reads them, with
    the collection's fragments merged, and the documented options cover the module's argument_spec."""
    import ast

    from ansible.plugins.loader import fragment_loader
    from ansible.utils.plugin_docs import get_docstring

    for path in sorted([*REPO.glob("library/*.py"), *REPO.glob("action_plugins/*.py")]):
        if path.parent.name != "library" and (REPO / "library" / path.name).exists():
            continue  # the action of a module: ansible-doc reads the module's documentation
        doc, examples, returns, _meta = get_docstring(str(path), fragment_loader, is_module=True)
        assert doc and doc.get("options") is not None, f"{path.name}: DOCUMENTATION does not parse"
        assert examples and returns is not None, f"{path.name}: EXAMPLES or RETURN missing"
        if path.parent.name != "library":
            continue
        spec = next(kw.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
                    for kw in node.keywords if kw.arg == "argument_spec")
        names = {k.value for k in getattr(spec, "keys", []) if isinstance(k, ast.Constant)}
        names |= {kw.arg for kw in getattr(spec, "keywords", []) if kw.arg}
        assert names <= set(doc["options"]), f"{path.name}: undocumented options {sorted(names - set(doc['options']))}"
