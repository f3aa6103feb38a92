"""checkpoints.py (the janitor and the resume helpers) reading what the job writes (issue 33 items 8, 14): a
trainer_state.json truncated while it is parsed, FIFOs and device nodes where a marker belongs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading

import pytest

from helpers import COLLECTIONS, load

from ansible_collections.trainyard.core.plugins.module_utils import checkpoints as ck

bt = load("tests/data/checkpoints/build_tree.py", "build_tree")


def test_a_trainer_state_truncated_during_the_parse_is_no_sigbus(tmp_path):
    """The job truncates trainer_state.json after the reader looked at it: through mmap the parse touched pages
    past the new end and the process died of SIGBUS (the janitor sidecar ended for good, root's resume step
    crashed). Run in a child so a signal shows as its exit status."""
    state = tmp_path / "trainer_state.json"
    state.write_text('{"global_step": 30, "log_history": [%s], "best_model_checkpoint": null}'
                     % ",".join('{"loss": 1.0, "step": %d}' % i for i in range(200_000)))
    code = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, %r)
        from ansible_collections.trainyard.core.plugins.module_utils import checkpoints as ck
        real = ck.parse_trainer_state
        def truncating(buf, keys=ck.TRAINER_STATE_KEYS):
            os.truncate(%r, 0)  # the job, between the read and the parse
            return real(buf, keys)
        ck.parse_trainer_state = truncating
        try:
            print(ck.read_trainer_state(%r))
        except ValueError as e:
            print("refused:", e)
    """) % (str(COLLECTIONS), str(state), str(state))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() in ("{'global_step': 30, 'best_model_checkpoint': None}",) or "refused" in r.stdout


def test_a_fifo_or_device_node_as_the_marker_is_not_complete_and_never_opened(tmp_path):
    root = tmp_path / "out"
    c = bt.write_checkpoint(root, 10)
    marker = c / "trainer_state.json"
    marker.unlink()
    os.mkfifo(marker)
    opened = threading.Event()

    def writer():
        os.close(os.open(marker, os.O_WRONLY))
        opened.set()

    threading.Thread(target=writer, daemon=True).start()
    assert ck.has_marker(str(c)) is False
    assert not opened.wait(0.3), "the FIFO was opened"
    os.close(os.open(marker, os.O_RDONLY | os.O_NONBLOCK))
    marker.unlink()
    os.mknod(marker, 0o600 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)
    assert ck.has_marker(str(c)) is False
    with pytest.raises(OSError, match="regular"):
        ck.read_trainer_state(str(marker))


def test_tree_bytes_walks_without_following_links(tmp_path):
    root = tmp_path / "out"
    (root / "a").mkdir(parents=True)
    (root / "a" / "f").write_bytes(b"x" * 100)
    (tmp_path / "big").write_bytes(b"y" * 10_000)
    (root / "link").symlink_to(tmp_path)
    (root / "flink").symlink_to(tmp_path / "big")
    assert ck.tree_bytes(str(root)) == 100


def test_the_janitor_runs_as_the_role_ships_it_with_the_layer_beside_it(tmp_path):
    """roles/janitor ships checkpoints.py as janitor.py and jobtree.py beside it, nothing else: the script finds
    the layer there, with no collection on its path."""
    ship = tmp_path / "state"
    ship.mkdir()
    mu = COLLECTIONS / "ansible_collections" / "trainyard" / "core" / "plugins" / "module_utils"
    (ship / "janitor.py").write_bytes((mu / "checkpoints.py").read_bytes())
    (ship / "jobtree.py").write_bytes((mu / "jobtree.py").read_bytes())
    root = tmp_path / "out"
    for s in (10, 20, 30):
        bt.write_checkpoint(root, s)
    r = subprocess.run([sys.executable, str(ship / "janitor.py"), "--root", str(root), "--dry-run", "--json"],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0 and '"dry_run": true' in r.stdout, r.stderr[-2000:]
