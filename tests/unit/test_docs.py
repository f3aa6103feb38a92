"""The README's variables table is generated from the roles' argument specs and kept in sync."""

import subprocess
import sys

from conftest import REPO, load


def test_readme_variables_table_is_current():
    r = subprocess.run([sys.executable, str(REPO / "docs/gen_variables.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_table_lists_every_option_of_every_role():
    gen = load("docs/gen_variables.py")
    import yaml
    text = gen.table()
    for spec_file in REPO.glob("roles/*/meta/argument_specs.yml"):
        opts = (yaml.safe_load(spec_file.read_text())["argument_specs"]["main"].get("options") or {})
        for name in opts:
            assert f"`{name}`" in text, f"{name} from {spec_file} missing"
