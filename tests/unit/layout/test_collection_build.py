"""The in-tree collection trainyard.core is a real one: `ansible-galaxy collection build` packs it (galaxy.yml,
meta/runtime.yml), and the tarball holds every plugin file of the tree, nothing compiled."""

import json
import subprocess
import tarfile

import yaml
from packaging.specifiers import SpecifierSet

from helpers import BIN, COLLECTIONS

CORE = COLLECTIONS / "ansible_collections" / "trainyard" / "core"


def test_runtime_requires_the_ansible_core_the_project_pins():
    requires = yaml.safe_load((CORE / "meta" / "runtime.yml").read_text())["requires_ansible"]
    pins = (COLLECTIONS.parent / "requirements.txt").read_text().splitlines()
    core = next(line.split("==")[1] for line in pins if line.startswith("ansible-core=="))
    assert SpecifierSet(requires).contains(core), (requires, core)


def test_galaxy_build_packs_every_plugin(tmp_path):
    p = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", str(CORE), "--output-path", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (tarball,) = tmp_path.glob("trainyard-core-*.tar.gz")
    with tarfile.open(tarball) as tar:
        members = set(tar.getnames())
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    assert manifest["collection_info"]["namespace"] == "trainyard"
    assert manifest["collection_info"]["name"] == "core"
    assert "meta/runtime.yml" in members
    plugins = {str(f.relative_to(CORE)) for f in (CORE / "plugins").rglob("*.py") if "__pycache__" not in f.parts}
    assert plugins, "no plugin files found in the tree"
    assert plugins <= members, sorted(plugins - members)
    assert not [m for m in members if "__pycache__" in m or m.endswith(".pyc")]
