"""One secret-name rule (module_utils/torchrun.py SECRET_NAME, docs/security.md "Secrets") for the launch's results,
the validate play and the collected bundle: a name the launch hides is hidden in collect.yml's bundle too, and no
second secret-name regex exists anywhere in the product."""

import json
import re
from pathlib import Path

from ansible_collections.trainyard.core.plugins.module_utils import job_collect as jc
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
from ansible_collections.trainyard.core.plugins.plugin_utils import cluster_model as cm

REPO = Path(__file__).resolve().parents[3]
NAMES = ("WANDB_KEY", "DB_PWD", "SESSION_ID", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "MY_COOKIE", "GH_AUTH")


def test_bundle_hides_every_name_the_launch_hides():
    env = "".join("%s=clear-%d\n" % (n, i) for i, n in enumerate(NAMES)) + "NCCL_DEBUG=WARN\n"
    out = jc.redact_file("nccl.env", env.encode()).decode()
    assert "clear-" not in out and "NCCL_DEBUG=WARN" in out
    js = jc.redact_file("launch.spec.json", json.dumps(
        {"env": {n: "clear" for n in NAMES}, "argv": ["%s=clear" % n for n in NAMES]}).encode())
    assert b"clear" not in js
    for n in NAMES:
        assert tr.looks_secret(n) and cm.looks_secret(n) and jc.is_secret_name(n), n


# A regex literal naming two or more of the rule's words is a second secret rule.
_WORDS = ("token", "secret", "passw", "pwd", "credential", "cookie", "private", "signature", "session")
_PATTERN_LITERAL = re.compile(r"""re\.compile\(\s*r?["']([^"']*)["']""", re.I)


def test_no_second_secret_name_regex_in_the_product():
    roots = [REPO / "collections", REPO / "library", REPO / "filter_plugins", REPO / "roles", REPO / "plugins"]
    found = []
    for root in roots:
        for path in root.rglob("*.py") if root.exists() else ():
            text = path.read_text(errors="replace")
            for lit in _PATTERN_LITERAL.findall(text):
                if sum(w in lit.lower() for w in _WORDS) >= 2:
                    found.append("%s: %s" % (path.relative_to(REPO), lit[:80]))
    assert found == ["collections/ansible_collections/trainyard/core/plugins/module_utils/torchrun.py: "
                     + tr.SECRET_NAME.pattern[:80]], found
