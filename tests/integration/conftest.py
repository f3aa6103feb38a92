"""Fixtures for integration tests on the simulated cluster (tests/sim/simcluster.py).

`cluster` is one 3-node cluster shared by the whole session (name from TY_SIM_NAME, default "it"); tests
that break something on it must put it back (use `try/finally`). `make_cluster(name, nodes, mtu)` brings
up a private cluster for a test that needs its own, and removes it afterwards.
The helpers (SimCluster, run_playbook, parse_recap, wait_until, ...) are in tests/helpers.py.
Set TY_SIM_KEEP=1 to leave clusters running after the session (for debugging).
Under pytest-xdist (`make integration` runs two workers) each worker after the first has clusters of its own: its
number is appended to TY_SIM_NAME ("it1") and to TY_SIM_PREFIX ("w1"), before any test reads them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import REPO, SimCluster, sim_down, sim_up  # noqa: E402

_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
if _WORKER:
    os.environ["TY_SIM_NAME"] = os.environ.get("TY_SIM_NAME", "it") + str(_WORKER)
    os.environ["TY_SIM_PREFIX"] = os.environ.get("TY_SIM_PREFIX", "") + "w%d" % _WORKER


@pytest.fixture(scope="session")
def cluster() -> SimCluster:
    name = os.environ.get("TY_SIM_NAME", "it")
    if os.environ.get("TY_SIM_REUSE") == "1" and (REPO / ".sim" / name / "cluster.json").exists():
        yield SimCluster(name)
        return
    c = sim_up(name)
    try:
        yield c
    finally:
        sim_down(name)


@pytest.fixture
def make_cluster():
    made: list[str] = []

    def _make(name: str, nodes: int = 3, mtu: int = 9000, slurm: bool = False) -> SimCluster:
        name = os.environ.get("TY_SIM_PREFIX", "") + name  # parallel sessions on one engine keep apart
        made.append(name)
        return sim_up(name, nodes, mtu, slurm)

    yield _make
    for name in made:
        sim_down(name)
