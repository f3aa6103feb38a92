"""Build checkpoint trees from the real layout listings in this directory (``type size path`` per line).

Files are created sparse (truncate to the recorded size): the sizes the janitor sees are the real run's,
without the disk cost. ``scale`` multiplies the sizes (a 100x run of the fixture is realistic for a 7B LoRA).
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.trainyard.core.plugins.module_utils import checkpoints as ck

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "hf-trainer-peft-lora-zero3-2ranks.txt"


def read_listing(path: Path = FIXTURE) -> list[tuple[str, int, str]]:
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        kind, size, rel = line.split(" ", 2)
        out.append((kind, int(size), rel[2:] if rel.startswith("./") else rel))
    return out


def checkpoint_template(listing=None) -> list[tuple[str, int, str]]:
    """The entries of one checkpoint (the first one in the listing), relative to it, step number as {step}."""
    listing = listing or read_listing()
    first = next(rel for kind, _, rel in listing if kind == "d" and rel.startswith("checkpoint-"))
    step = first.split("-", 1)[1]
    out = []
    for kind, size, rel in listing:
        if rel.startswith(first + "/"):
            out.append((kind, size, rel[len(first) + 1:].replace(f"global_step{step}", "global_step{step}")))
    return out


def write_checkpoint(root: Path, step: int, complete: bool = True, scale: float = 1.0, template=None,
                     sparse: bool = True) -> Path:
    """checkpoint-<step> under root, files in the trainer's write order; the marker last when complete."""
    template = template or checkpoint_template()
    ck = Path(root) / f"checkpoint-{step}"
    ck.mkdir(parents=True, exist_ok=True)
    marker = None
    for kind, size, rel in template:
        rel = rel.format(step=step)
        p = ck / rel
        if kind == "d":
            p.mkdir(parents=True, exist_ok=True)
            continue
        if rel == "trainer_state.json":
            marker = (p, size)
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        _write(p, int(size * scale) if not rel.endswith(".json") else size, sparse)
    if complete and marker:
        p, size = marker
        body = '{"global_step": %d, "best_model_checkpoint": null}' % step
        p.write_text(body.ljust(size))
    return ck


def _write(p: Path, size: int, sparse: bool) -> None:
    with open(p, "wb") as f:
        if sparse:
            f.truncate(size)
        else:
            chunk = b"\0" * min(size, 1 << 20)
            left = size
            while left > 0:
                n = min(left, len(chunk))
                f.write(chunk[:n])
                left -= n


def build_fixture_tree(root: Path, listing=None) -> Path:
    """The real run's output directory, as listed."""
    listing = listing or read_listing()
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for kind, size, rel in listing:
        if rel in (".", ""):
            continue
        p = root / rel
        if kind == "d":
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.name == "trainer_state.json":
                p.write_text('{"global_step": 0}'.ljust(size))
            else:
                _write(p, size, True)
    return root


def tree_bytes(root: Path) -> int:
    """Bytes of the files below root, as reset counts them."""
    return ck.tree_bytes(str(root))
