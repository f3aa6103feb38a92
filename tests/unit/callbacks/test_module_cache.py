"""Module payloads kept between runs (callback_plugins/warm_workers.py, plugin_utils/module_cache.py): a converged run
uses the payloads an earlier run built, a changed module_utils file is never served from an old payload, and a store
anyone else could write is not used."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import BIN, REPO

sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.trainyard.core.plugins.plugin_utils import module_cache  # noqa: E402

MODULE = """#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ty_probe_util import VALUE


def main():
    AnsibleModule(argument_spec={}).exit_json(changed=False, value=VALUE)


if __name__ == "__main__":
    main()
"""

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - ty_probe_mod: {}
      register: r
    - ansible.builtin.debug: {msg: "probe value {{ r.value }}"}
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "mu").mkdir()
    (tmp_path / "lib/ty_probe_mod.py").write_text(MODULE)
    (tmp_path / "mu/ty_probe_util.py").write_text('VALUE = "one"\n')
    (tmp_path / "pb.yml").write_text(PLAYBOOK)
    (tmp_path / "lt").mkdir(mode=0o700)
    return tmp_path


def run(project: Path, **env_extra: str) -> str:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(project / "lt"),
               ANSIBLE_LIBRARY=f"{REPO / 'library'}:{project / 'lib'}", ANSIBLE_MODULE_UTILS=str(project / "mu"),
               ANSIBLE_CALLBACK_PLUGINS=str(REPO / "callback_plugins"), **env_extra)
    done = subprocess.run([str(BIN / "ansible-playbook"), "-vvv", "-i", "n1,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", str(project / "pb.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done.stdout


def stores(project: Path) -> list[Path]:
    base = project / "lt" / module_cache.DIR_NAME
    return sorted(base.iterdir()) if base.is_dir() else []


def test_the_next_run_uses_the_payloads_and_a_changed_module_util_is_rebuilt(project):
    out = run(project)
    assert "probe value one" in out
    [store] = stores(project)
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    assert any(p.name.startswith("ansible.legacy.ty_probe_mod") for p in store.iterdir()), list(store.iterdir())

    out = run(project)
    assert "probe value one" in out
    assert f"module payload(s) from {store}" in out and "warm_workers: 0 module payload(s) from" not in out

    # A module_utils file the module imports changes: the old payload (which holds "one") must not be used.
    util = project / "mu/ty_probe_util.py"
    util.write_text('VALUE = "two"\n')
    st = util.stat()
    os.utime(util, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    out = run(project)
    assert "probe value two" in out, out[-2000:]
    assert len(stores(project)) == 2


def test_a_store_others_can_write_is_not_used(project):
    run(project)
    [store] = stores(project)
    store.chmod(0o777)
    out = run(project)
    assert "probe value one" in out
    assert "module payloads built in this run" in out and "writable by its group or by others" in out
    assert f"module payload(s) from {store}" not in out


def test_switched_off_nothing_is_kept(project):
    run(project, TRAINYARD_MODULE_CACHE="false")
    assert stores(project) == []


def test_the_fingerprint_follows_size_and_mtime_of_every_source(tmp_path):
    (tmp_path / "mu").mkdir()
    f = tmp_path / "mu/x.py"
    f.write_text("A = 1\n")
    roots = [tmp_path / "mu"]
    fp = module_cache.fingerprint(roots, ("v1",))
    assert module_cache.fingerprint(roots, ("v1",)) == fp
    assert module_cache.fingerprint(roots, ("v2",)) != fp  # another ansible-core or Python
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert module_cache.fingerprint(roots, ("v1",)) != fp
    (tmp_path / "mu/__pycache__").mkdir()
    (tmp_path / "mu/__pycache__/x.py").write_text("ignored")
    fp2 = module_cache.fingerprint(roots, ("v1",))
    (tmp_path / "mu/y.py").write_text("B = 2\n")  # a new file
    assert module_cache.fingerprint(roots, ("v1",)) != fp2


def test_the_store_must_be_a_private_directory_of_this_user(tmp_path):
    root = tmp_path / "lt"
    root.mkdir(mode=0o700)
    d, why = module_cache.store_dir(root, "abc", create=True)
    assert why is None and d == root / module_cache.DIR_NAME / "abc"
    # a link in place of the store
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (root / module_cache.DIR_NAME / "lnk").symlink_to(target)
    d, why = module_cache.store_dir(root, "lnk", create=False)
    assert d is None and "is not a directory" in why
    # another user's store
    other = root / module_cache.DIR_NAME / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 65534, 65534)
    d, why = module_cache.store_dir(root, "other", create=False)
    assert d is None and "belongs to uid 65534" in why
    # a temporary root others can write
    root.chmod(0o777)
    d, why = module_cache.store_dir(root, "abc", create=False)
    assert d is None and "writable by its group or by others" in why


def test_save_keeps_finished_payloads_only_and_prune_keeps_the_newest(tmp_path):
    run_tmp, store = tmp_path / "run", tmp_path / "store" / "fp1"
    (run_tmp / module_cache.ANSIBALLZ).mkdir(parents=True)
    store.mkdir(parents=True)
    for name in ("ansible.modules.ping-ZIP_DEFLATED-none", "x.lock", "y-part"):
        (run_tmp / module_cache.ANSIBALLZ / name).write_bytes(b"data")
    assert module_cache.save(run_tmp, store) == 1
    assert [p.name for p in store.iterdir()] == ["ansible.modules.ping-ZIP_DEFLATED-none"]
    assert stat.S_IMODE((store / "ansible.modules.ping-ZIP_DEFLATED-none").stat().st_mode) == 0o600
    assert module_cache.save(run_tmp, store) == 0  # already kept
    fresh = tmp_path / "run2"
    fresh.mkdir()
    assert module_cache.restore(store, fresh) == 1
    assert (fresh / module_cache.ANSIBALLZ / "ansible.modules.ping-ZIP_DEFLATED-none").read_bytes() == b"data"
    for i in range(5):
        d = tmp_path / "store" / f"old{i}"
        d.mkdir()
        os.utime(d, (1000 + i, 1000 + i))
    removed = module_cache.prune(tmp_path / "store", keep=3)
    assert sorted(removed) == ["old0", "old1", "old2"]
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["fp1", "old3", "old4"]
