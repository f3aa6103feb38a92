"""action_plugins/container_pull.py by the real `ansible` on this machine: a failed pull is the result's (the role's
container.image_pull record says what failed), never the task's; without a login there is no login in the result."""

from __future__ import annotations

from helpers import adhoc


def test_a_failed_pull_is_the_result_s_not_the_task_s():
    # docker_image_pull refuses the argument before it talks to any engine or registry.
    r = adhoc("container_pull", {"pull": {"name": "trainyard/absent:0", "pull": "no-such-policy"}})
    assert not r.get("failed") and "value of pull must be one of" in r["msg"], r
    assert "login" not in r and "manifest" not in r and "image" not in r, r
