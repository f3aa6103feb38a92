"""Unit tests find the project's code the way ansible-playbook does (docs/architecture.md "Shared code"):

* shared Python through the collection loader, as ``ansible_collections.trainyard.core.plugins.module_utils.<name>``
  (modules and controller) and ``...plugins.plugin_utils.<name>`` (controller only), from ``collections/``;
* modules and plugins by their file path (``load``), as Ansible's plugin loader reads them;
* the toolchain (ansible, ansible-playbook) beside the Python that runs the tests (``BIN``).
"""

import importlib.util
import sys
from pathlib import Path

from ansible.plugins.loader import init_plugin_loader

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COLLECTIONS = REPO / "collections"
init_plugin_loader([str(COLLECTIONS)])


def load(relpath: str, name: str | None = None):
    """Import a file of the repo as a module (modules and plugins: their directories are not packages)."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def adhoc(module: str, args: dict, *flags: str) -> dict:
    """One module of the repo run by the real `ansible` on this machine (local connection); its result."""
    import json
    import os
    import subprocess

    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    p = subprocess.run([str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
                        "-e", f"ansible_python_interpreter={sys.executable}", "-m", module, "-a", json.dumps(args),
                        *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    # The JSON document sits between the project's profile callback's timing lines.
    out, _ = json.JSONDecoder().raw_decode(p.stdout[p.stdout.index("{"):])
    return out["plays"][0]["tasks"][0]["hosts"]["localhost"]


class SymlinkSwapper:
    """The job's race against host code, as a context manager: in a thread, the directory at path is moved aside
    and a symlink to target put in its place, then both undone, in a tight loop (the window between a host's
    mkdir and its chmod, or between a check and an open)."""

    def __init__(self, path, target):
        import threading
        from pathlib import Path

        self.path, self.target = Path(path), Path(target)
        self.aside = self.path.with_name(self.path.name + ".aside")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        import os

        while not self.stop.is_set():
            try:
                os.rename(self.path, self.aside)
                os.symlink(self.target, self.path)
            except OSError:
                pass
            for undo in (lambda: os.unlink(self.path), lambda: os.rmdir(self.aside)):
                try:
                    undo()
                except OSError:
                    pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
