"""The job writes the checkpoint tree and is not trusted; recover copies its files between nodes as root. The real
module checkpoint_copy (run by the real `ansible`, as this machine's root) on real directory trees with links the
job could plant: a shard, a global_stepN directory, a directory of the converted checkpoint, the checkpoint
directory itself, pointing at a root-only file, at /etc/shadow or at a directory outside. Nothing is read or
written through any of them."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from ansible_collections.trainyard.core.plugins.module_utils import ckpt_transfer as ct
from helpers import adhoc, load

bt = load("tests/data/checkpoints/build_tree.py", "build_tree_nf")
SHARD = "global_step4/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
MODEL = "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt"
SECRET = b"root:$6$secret-hash:19000:0:99999:7:::\n"


@pytest.fixture
def tree(tmp_path):
    """A node's output root with a real ZeRO-3 + LoRA checkpoint (the fixture's layout, small real content), and
    a root-only file and a directory outside it."""
    out = tmp_path / "outputs"
    ckpt = bt.write_checkpoint(out, 4, sparse=False, scale=0.001)
    secret = tmp_path / "shadow"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    outside = tmp_path / "root-home"
    outside.mkdir()
    (outside / ".bashrc").write_text("keep me\n")
    return out, ckpt, secret, outside


def _pack(out, **kw):
    return adhoc("checkpoint_copy", dict(state="packed", output_root=str(out), name="checkpoint-4", **kw))


def _unpack(out, archive, *flags):
    return adhoc("checkpoint_copy", dict(state="unpacked", output_root=str(out), name="checkpoint-4",
                                         archive=str(archive)), *flags)


def _members(archive):
    with tarfile.open(archive) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


def test_pack_copies_plain_files_and_trees(tree):
    out, ckpt, _, _ = tree
    (ckpt / "global_step4_universal" / "zero" / "lora_A").mkdir(parents=True)
    (ckpt / "global_step4_universal" / "zero" / "lora_A" / "fp32.pt").write_bytes(b"w" * 10)
    (ckpt / "latest_universal").write_text("global_step4_universal")
    r = _pack(out, files=[SHARD, MODEL, "latest_universal"], trees=["global_step4_universal"])
    assert not r.get("failed"), r
    got = _members(r["archive"])
    assert got[SHARD] == (ckpt / SHARD).read_bytes() and got["global_step4_universal/zero/lora_A/fp32.pt"] == b"w" * 10
    assert oct(os.stat(os.path.dirname(r["archive"])).st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("target", ["secret", "/etc/shadow"])
def test_pack_never_reads_a_shard_the_job_swapped_for_a_link(tree, target):
    out, ckpt, secret, _ = tree
    (ckpt / SHARD).unlink()
    (ckpt / SHARD).symlink_to(secret if target == "secret" else target)
    r = _pack(out, files=[MODEL, SHARD])
    assert r.get("failed") and r["msg"] == (f"{ckpt}/{SHARD} is a symbolic link: recover follows no link in the "
                                            "checkpoint tree (the job wrote it). Fix: remove it and rerun"), r
    assert "Traceback" not in r["msg"] and "\n" not in r["msg"]
    assert not r.get("archive")


def test_pack_never_walks_a_linked_directory(tree):
    out, ckpt, secret, outside = tree
    # the tag directory swapped for a link to a directory holding a shard-named copy of the secret
    (outside / "global_step4").mkdir()
    (outside / "global_step4" / SHARD.split("/")[1]).write_bytes(SECRET)
    (ckpt / "global_step4").rename(out / "moved")
    (ckpt / "global_step4").symlink_to(outside / "global_step4")
    r = _pack(out, files=[SHARD])
    assert r.get("failed") and f"{ckpt}/global_step4 is a symbolic link or not a directory" in r["msg"], r
    # a link inside a converted tree, to /root
    (ckpt / "global_step4_universal").mkdir()
    (ckpt / "global_step4_universal" / "zero").symlink_to("/root")
    r = _pack(out, trees=["global_step4_universal"])
    assert r.get("failed") and f"{ckpt}/global_step4_universal/zero is a symbolic link" in r["msg"], r
    # the checkpoint directory itself a link
    (out / "checkpoint-4").rename(out / "real-4")
    (out / "checkpoint-4").symlink_to(out / "real-4")
    r = _pack(out, files=["trainer_state.json"])
    assert r.get("failed") and f"{out}/checkpoint-4 is a symbolic link or not a directory" in r["msg"], r


def _tar(path, members):
    with tarfile.open(path, "w") as t:
        for name, data in members.items():
            if isinstance(data, tuple):  # (type, linkname)
                info = tarfile.TarInfo(name)
                info.type, info.linkname = data
                t.addfile(info)
            else:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return path


def test_unpack_replaces_a_planted_file_link_and_never_writes_through_it(tree, tmp_path):
    out, ckpt, secret, _ = tree
    archive = _tar(tmp_path / "a.tar", {SHARD: b"the real shard", "global_step4_universal/zero/x.pt": b"x"})
    (ckpt / SHARD).unlink()
    (ckpt / SHARD).symlink_to(secret)
    r = _unpack(out, archive, "--check")
    assert r["changed"] and secret.read_bytes() == SECRET and (ckpt / SHARD).is_symlink()
    r = _unpack(out, archive)
    assert not r.get("failed"), r
    assert sorted(r["written"]) == sorted([SHARD, "global_step4_universal/zero/x.pt"])
    assert secret.read_bytes() == SECRET  # the link was replaced, not followed
    assert not (ckpt / SHARD).is_symlink() and (ckpt / SHARD).read_bytes() == b"the real shard"
    assert (ckpt / SHARD).stat().st_uid == ckpt.stat().st_uid
    r = _unpack(out, archive)
    assert not r["changed"] and sorted(r["unchanged"]) == sorted(r["unchanged"]) and len(r["unchanged"]) == 2


def test_unpack_never_writes_through_a_linked_directory(tree, tmp_path):
    out, ckpt, _, outside = tree
    archive = _tar(tmp_path / "a.tar", {"universal/flat.pt": b"weights", "universal/trainer_state.json": b"{}"})
    (ckpt / "universal").symlink_to(outside)  # the job points the converted directory at root's home
    r = _unpack(out, archive)
    assert r.get("failed") and f"{ckpt}/universal is a symbolic link or not a directory" in r["msg"], r
    assert sorted(os.listdir(outside)) == [".bashrc"]
    # the checkpoint directory itself swapped for a link to root's home
    (out / "checkpoint-4").rename(out / "real-4")
    (out / "checkpoint-4").symlink_to(outside)
    r = _unpack(out, archive)
    assert r.get("failed") and f"{out}/checkpoint-4 is a symbolic link or not a directory" in r["msg"], r
    assert sorted(os.listdir(outside)) == [".bashrc"]


@pytest.mark.parametrize("members", [
    {"universal": (tarfile.SYMTYPE, "/root"), "universal/.bashrc": b"owned"},
    {"../../escape.txt": b"owned"},
    {"/etc/cron.d/x": b"owned"},
    {"zero/hard": (tarfile.LNKTYPE, "/etc/shadow")},
])
def test_unpack_takes_regular_files_and_directories_only(tree, tmp_path, members):
    out, ckpt, _, _ = tree
    before = sorted(os.listdir(ckpt))
    r = _unpack(out, _tar(tmp_path / "a.tar", members))
    assert r.get("failed") and "Traceback" not in r["msg"], r
    assert sorted(os.listdir(ckpt)) == before
    assert not (tmp_path / "escape.txt").exists() and not os.path.exists("/etc/cron.d/x")


# ----------------------------------------------------------------------------------- sizes before packing
def test_a_sparse_terabyte_shard_is_refused_before_anything_is_packed(tree, tmp_path):
    """A sparse 1 TiB shard costs the job nothing; packed it became a 1 TiB tar on the node, the controller and
    the head. Refused naming the file and the fix, before the tar exists."""
    out, ckpt, _secret, _outside = tree
    with open(ckpt / SHARD, "r+b") as f:
        f.truncate(1 << 40)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    res = _pack(out, files=[SHARD, MODEL])
    assert res.get("failed") and "is sparse: 1099511627776 bytes apparent" in res["msg"], res
    assert SHARD in res["msg"] and "Fix: " in res["msg"]
    with pytest.raises(ct.TransferError, match="is sparse"):
        ct.pack(str(out), "checkpoint-4", [SHARD], tmp_root=str(tmp))
    assert list(tmp.iterdir()) == []  # no tar was started


def test_the_total_is_capped_and_dense_shards_pass(tree, tmp_path):
    out, ckpt, _secret, _outside = tree
    size = (ckpt / SHARD).stat().st_size + (ckpt / MODEL).stat().st_size
    res = _pack(out, files=[SHARD, MODEL], max_bytes=size - 1)
    assert res.get("failed") and "over launch_recover_copy_max_bytes (%d)" % (size - 1) in res["msg"], res
    res = _pack(out, files=[SHARD, MODEL], max_bytes=size)
    assert not res.get("failed") and res["bytes"] == size, res
    os.unlink(res["archive"])
    os.rmdir(os.path.dirname(res["archive"]))


def test_a_fifo_in_the_checkpoint_is_never_opened(tree, monkeypatch):
    """A FIFO (or a device node: the job has CAP_MKNOD unless dropped) named like a shard: refused by its type
    before any open (jobtree.open_file opens O_PATH first); the code before opened it O_NONBLOCK, then looked."""
    out, ckpt, _secret, _outside = tree
    os.mkfifo(ckpt / "global_step4" / "fifo.pt")
    opened, real = [], os.open

    def spy(path, flags, *args, **kw):
        if os.fspath(path).endswith("fifo.pt") and not flags & getattr(os, "O_PATH", 0):
            opened.append(flags)
        return real(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", spy)
    with pytest.raises(ct.TransferError, match="fifo.pt is not a regular file"):
        ct.pack(str(out), "checkpoint-4", ["global_step4/fifo.pt"])
    with pytest.raises(ct.TransferError, match="fifo.pt is not a regular file"):
        ct.pack(str(out), "checkpoint-4", [], trees=["global_step4"])
    assert opened == []


def test_a_deep_trainer_state_never_raises_out_of_the_shard_listing(tree):
    """trainer_state.json of 100 KB of nesting: json.load raised RecursionError out of checkpoint_shards."""
    from ansible_collections.trainyard.core.plugins.module_utils import recover as rc
    _out, ckpt, _secret, _outside = tree
    (ckpt / "trainer_state.json").write_text('{"world_size": 2, "log_history": %s}' % ("[" * 50000 + "]" * 50000))
    listing = rc.list_shards(str(ckpt))
    assert listing["complete"] and listing["format"] == "deepspeed" and listing["world_size"] is None
