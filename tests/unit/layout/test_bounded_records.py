"""No per-node text of the product's YAML lists every node: a Jinja expression that joins a list of hosts (a variable
named like one: ``*hosts*``, ``hosts_by_rank``, ``ansible_play_*``, ``groups``) into a string makes each node's
record O(n) and report.json O(n^2) (1,024 nodes, every node named in two records of each: 44 MB of report.json,
docs/benchmarks.md "While the job trains"). Name a few and count the rest in Python instead (nccl_check's
``trainyard_busy_nodes`` filter, plugin_utils/allreduce_checks.py busy_nodes).

Scanned: roles/*/tasks and roles/*/vars. Allowed: two lines printed once per run on the controller, not kept per
node: the validate play's cluster model and reset.yml's question before it touches the nodes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_EXPR = re.compile(r"\{\{.*?\}\}", re.S)
# A host list joined into text: "<list> | join(" where the list is a variable named like a host list.
_JOINED_HOSTS = re.compile(r"\b(\w*hosts\w*|ansible_play_\w+|groups(?:\[[^\]]*\]|\.\w+)?)\s*\|\s*join\(")
ALLOWED = {("roles/cluster/tasks/validate.yml", "hosts_by_rank | join("),
           ("roles/reset/tasks/confirm.yml", "groups['trainers'] | join(")}


def joined_host_lists(text: str) -> list[tuple[int, str]]:
    """[(line, the 'list | join(' text)] of the expressions of `text` that join a host list."""
    out = []
    for m in _EXPR.finditer(text):
        for j in _JOINED_HOSTS.finditer(m.group(0)):
            out.append((text.count("\n", 0, m.start()) + 1, " ".join(j.group(0).split())))
    return out


def test_the_scanner_finds_a_joined_host_list():
    text = "detail: >-\n  job on\n  {{ _nccl_check_busy_hosts | join(', ') }}\nok: '{{ peers | join(\",\") }}'"
    assert joined_host_lists(text) == [(3, "_nccl_check_busy_hosts | join(")]
    assert joined_host_lists("{{ ansible_play_hosts | join(' ') }}") == [(1, "ansible_play_hosts | join(")]
    assert joined_host_lists("{{ groups['trainers'] | join(' ') }}") == [(1, "groups['trainers'] | join(")]
    assert joined_host_lists("{{ _nccl_check_busy_hosts | trainyard_busy_nodes(ansible_play_hosts) }}") == []


def test_no_node_text_joins_every_node():
    found = []
    for f in sorted(ROOT.glob("roles/*/tasks/*.yml")) + sorted(ROOT.glob("roles/*/vars/*.yml")):
        rel = str(f.relative_to(ROOT))
        for line, what in joined_host_lists(f.read_text()):
            if (rel, what) not in ALLOWED:
                found.append(f"{rel}:{line}: {what}")
    assert not found, "a node's text would list every node (O(n) a node):\n" + "\n".join(found)
