"""action_plugins/container_pull.py by the real `ansible` on this machine: a failed pull is the result's (the role's
container.image_pull record says what failed), never the task's; without a login there is no login in the result."""

from __future__ import annotations

from helpers import adhoc


def test_a_failed_pull_is_the_result_s_not_the_task_s():
    # docker_image_pull refuses the argument before it talks to any engine or registry.
    r = adhoc("container_pull", {"pull": {"name": "trainyard/absent:0", "pull": "no-such-policy"}})
    assert not r.get("failed") and "value of pull must be one of" in r["msg"], r
    assert "login" not in r and "manifest" not in r and "image" not in r, r


def test_a_pull_without_an_image_reads_the_image_the_node_has_unless_told_not_to():
    # The digest comparison reads image_info where the pull gave no image (tasks/verify.yml needs no read task then).
    r = adhoc("container_pull", {"pull": {"name": "trainyard/absent:0", "pull": "no-such-policy"}})
    assert isinstance(r.get("image_info"), dict) and "invocation" not in r["image_info"], r
    assert "images" in r["image_info"] or r["image_info"].get("failed"), r
    r = adhoc("container_pull", {"pull": {"name": "trainyard/absent:0", "pull": "no-such-policy"}, "read": False})
    assert "image_info" not in r, r
