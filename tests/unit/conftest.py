"""Setup of the unit tests: tests/helpers.py on sys.path (every test imports its helpers from there), and the
collection loader, so shared code imports as ``ansible_collections.trainyard.core.plugins.<kind>.<name>`` as it does
under ansible-playbook (docs/architecture.md "Shared code"). The tests sit in one directory per kind of code they
test (library/, module_utils/, plugin_utils/, actions/, filters/, callbacks/, inventory/, roles/, layout/)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ansible.plugins.loader import init_plugin_loader  # noqa: E402

from helpers import COLLECTIONS  # noqa: E402

init_plugin_loader([str(COLLECTIONS)])
