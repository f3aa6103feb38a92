"""Unit tests import the project's Python (module_utils/, filter_plugins/, action_plugins/) by path."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for sub in ("module_utils", "filter_plugins", "tests/sim"):
    p = str(REPO / sub)
    if p not in sys.path:
        sys.path.insert(0, p)


def load(relpath: str, name: str | None = None):
    """Import a file of the repo as a module (for plugins whose directories are not packages)."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
