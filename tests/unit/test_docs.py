"""The docs a newcomer reads: the README (two commands, links that resolve), docs/variables.md generated from the
roles' argument specs, and the argument specs themselves."""

import subprocess
import sys

from conftest import REPO, load


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
    from cluster_model import load_role_specs

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
