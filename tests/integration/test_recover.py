"""Lose a node, keep training (playbooks/recover.yml) on the 3-node simulated cluster: the CPU/gloo example saves a
sharded checkpoint (one shard per rank on its own node, a copy of the next rank's beside it), node 3's container is
stopped mid-run, and recover continues on nodes 1 and 2 from the last complete checkpoint, converted for world
size 2, the step counter going on from there. The inventory is not edited.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from helpers import parse_recap, wait_until

LAUNCH = "tests/integration/playbooks/launch.yml"
STATE = "/var/lib/trainyard/train"
RW = f"{STATE}/job-rw"
OUT = "/srv/outputs"
ARGV = ["--steps", "5000", "--save-every", "5", "--sleep", "0.3", "--output-root", OUT, "--shard-checkpoint",
        "--shard-copies", "2"]
# The launch playbook of the tests starts the example with launch_example_argv; recover.yml renders the job's
# arguments with the train_args role, as site.yml does: both get the same sharded example.
OPTIONS = {"--steps": 5000, "--save-every": 5, "--sleep": 0.3, "--output-root": OUT, "--shard-checkpoint": True,
           "--shard-copies": 2}
EXTRA = ["-e", json.dumps({"launch_example_argv": ARGV, "train_args_options": OPTIONS, "launch_wait_timeout": 600})]


def log_of(cluster, node) -> str:
    return cluster.exec(node, ["cat", f"{RW}/torchrun.log"], check=False).stdout


def complete_steps(cluster, node) -> list[int]:
    out = cluster.exec(node, ["sh", "-c", f"ls -d {OUT}/checkpoint-*/trainer_state.json 2>/dev/null"],
                       check=False).stdout
    return sorted(int(m) for m in re.findall(r"checkpoint-(\d+)/", out))


def inventory_digest(cluster) -> str:
    h = hashlib.sha256()
    for f in sorted(cluster.inventory.rglob("*")):
        if f.is_file():
            h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def lost(cluster):
    """The sharded example training on all three nodes, then node 3's container stopped; restarted at the end."""
    # The nodes as site.yml leaves them (recover runs every role's preflight on the survivors).
    r = cluster.playbook("site.yml", "--skip-tags", "launch", timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:]
    r = cluster.playbook(LAUNCH, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
    assert r.returncode == 0, r.stdout[-3000:]
    for node in cluster.nodes:
        cluster.exec(node, ["sh", "-c", f"rm -rf {OUT}/checkpoint-* {RW}/torchrun.log*"])
    r = cluster.playbook(LAUNCH, *EXTRA)
    assert r.returncode == 0, r.stdout[-3000:]
    victim = cluster.nodes[2]
    try:
        assert wait_until(lambda: all(max(complete_steps(cluster, n), default=0) >= 10 for n in cluster.nodes), 600), \
            log_of(cluster, cluster.head)[-2000:]
        subprocess.run(["docker", "stop", "-t", "1", victim], check=True, capture_output=True, timeout=120)
        before = max(complete_steps(cluster, cluster.head))
        yield cluster, victim, before
    finally:
        cluster.start(victim)
        cluster.playbook(LAUNCH, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")


def test_recover_continues_on_two_nodes_from_the_last_checkpoint(lost):
    cluster, victim, before = lost
    head, other = cluster.nodes[0], cluster.nodes[1]
    digest = inventory_digest(cluster)
    r = cluster.playbook("playbooks/recover.yml", *EXTRA, timeout=2400)
    out = r.stdout
    assert r.returncode == 0, out[-6000:]
    assert "Traceback" not in out
    assert f"dropped {victim} (unreachable:" in out, out[-4000:]
    assert f"ranks {head}=0, {other}=1" in out and "world size 3 -> 2" in out
    recap = parse_recap(out)
    assert recap[victim]["failed"] == 0
    # Node 3 held rank 2's shard and the copy of rank 0's: the head got rank 2's from node 2 and converted.
    ckpt = f"{OUT}/checkpoint-{before}"
    listing = cluster.exec(head, ["ls", ckpt, f"{ckpt}/universal"]).stdout
    assert "shard-rank2-of-3.pt" in listing and "flat.pt" in listing
    assert "flat.pt" in cluster.exec(other, ["ls", f"{ckpt}/universal"]).stdout
    for rank, node in enumerate((head, other)):
        st = json.loads(cluster.exec(node, ["cat", f"{STATE}/launch.json"]).stdout)
        assert "--nnodes=2" in st["command"] and f"--node_rank={rank}" in st["command"]
        assert st["resume_from"] == ckpt
    want = f"resumed model and optimizer from {ckpt} at step {before} (world size 2)"
    assert wait_until(lambda: want in log_of(cluster, head), 300), log_of(cluster, head)[-3000:]
    # The step counter goes on from the checkpoint, not from 0.
    assert wait_until(lambda: re.search(rf"trainyard: step {before + 3} loss", log_of(cluster, head)), 300), \
        log_of(cluster, head)[-3000:]
    assert not re.search(r"trainyard: step 1 loss", log_of(cluster, head).split(want, 1)[1])
    # The run's report, report.md and health page name the dropped node and why, the new rank map (head marked),
    # the world sizes and how the checkpoint resumes; recover.json too. The inventory is the user's, untouched.
    assert re.search(r"Recovered: .*dropped " + victim, out), out[-3000:]
    found = re.search(r"Report: (/\S+)/report\.json", out)
    assert found, out[-3000:]
    run_dir = Path(found.group(1))
    report = json.loads((run_dir / "report.json").read_text())
    rec = report["recover"]
    assert [(d["host"], d["why"], d["old_rank"]) for d in rec["dropped"]] == [(victim, "unreachable", 2)]
    assert rec["ranks"] == [{"host": head, "node_rank": 0, "old_rank": 0, "head": True},
                            {"host": other, "node_rank": 1, "old_rank": 1, "head": False}]
    assert (rec["world_size_before"], rec["world_size"], rec["head_moved"]) == (3, 2, False)
    assert rec["checkpoint"] == ckpt and rec["resume"]["mode"] == "full" and rec["resume"]["converted"] is True
    assert rec["resume"]["how"].startswith("universal conversion from world size 3 to 2 (universal/")
    assert {r["host"] for r in report["records"] if r["status"] == "unreachable"} == {victim}
    assert report["cluster_model"][other]["node_rank"] == 1 and report["cluster_model"][other]["nnodes"] == 2
    md = (run_dir / "report.md").read_text()
    assert "## Recover" in md and f"| {victim} | 2 | unreachable |" in md and f"| {head} (head) | 0 | 0 |" in md
    assert f"- checkpoint: `{ckpt}`" in md
    page = (run_dir / "health.html").read_text()
    assert 'id="recover" data-world-before="3" data-world="2"' in page and 'data-head-moved="false"' in page
    assert f'data-host="{victim}" data-why="unreachable"' in page
    assert f'data-host="{head}" data-rank="0" data-head="true"' in page and f'data-host="{other}" data-rank="1"' in page
    assert json.loads((run_dir / "recover.json").read_text())["resume"]["converted"] is True
    # No pack of the shard copy or the hand-off is left on the nodes.
    for node in (head, other):
        assert cluster.exec(node, ["sh", "-c", "ls -d /tmp/trainyard-recover-* /tmp/trainyard-ckpt-* 2>/dev/null || true"]).stdout.strip() == ""
    assert inventory_digest(cluster) == digest
