# -*- coding: utf-8 -*-
"""Pure helpers of the container role's tasks: image references, the same-image-everywhere verdict, the docker forms
of the options (mounts, ulimits, capabilities, the job's user), the reset summary. The role's records are plugin_utils/container_checks.py's (its mounts, ulimits and capabilities forms too).

Everything here takes plain data (dicts, lists, strings) and returns plain data, so it is unit-tested
without a cluster (tests/unit/filters/test_container_filters.py).
"""

from __future__ import annotations

from collections import Counter

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.trainyard.core.plugins.plugin_utils.cluster_model import container_user_ids
from ansible_collections.trainyard.core.plugins.plugin_utils.container_checks import (
    caps_spec, mounts_spec, short_digest, ulimits_spec)


def image_repository(ref: str) -> str:
    """Repository part of an image reference: 'reg:5000/a/b:tag' -> 'reg:5000/a/b'; digests stripped too."""
    ref = (ref or "").strip()
    ref = ref.split("@", 1)[0]
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        ref = ref[:colon]
    return ref


def image_registry(ref: str) -> str:
    """Registry host of an image reference, by docker's rule: the first path component when it has a '.' or a
    ':' or is 'localhost'; otherwise Docker Hub ('docker.io')."""
    first, sep, _rest = image_repository(ref).partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def image_pinned_digest(ref: str) -> str:
    """'repo@sha256:...' -> 'sha256:...'; '' when the reference is not pinned by digest."""
    return ref.split("@", 1)[1] if "@" in (ref or "") else ""


def image_identity(info: dict | None, ref: str) -> dict:
    """What this node resolved `ref` to, from docker_image_info's image dict (None: not present).

    id: the image ID (digest of its config: same content, same ID, whatever the registry);
    repo_digest: the registry manifest digest for the reference's repository, when the image came from a pull.
    """
    if not info:
        return {"present": False, "id": "", "repo_digest": ""}
    repo = image_repository(ref)
    digest = ""
    for rd in info.get("RepoDigests") or []:
        name, _, dg = rd.partition("@")
        if name == repo and dg:
            digest = dg
            break
    return {"present": True, "id": info.get("Id") or "", "repo_digest": digest,
            "created": info.get("Created") or ""}


def digest_verdict(fleet: list, host: str, image: str, pinned: str = "") -> dict:
    """Does `host` run the same image as every other node (and the pinned digest, when one is given)?

    fleet: [{host, present, id, repo_digest}, ...] for every node of the play.
    pinned: optional 'sha256:...' the user requires (matches the image ID or the registry digest).
    Returns {ok, detail, fix, reference, hosts_differing}.
    """
    by_host = {f["host"]: f for f in fleet if f.get("host")}
    mine = by_host.get(host) or {"present": False, "id": "", "repo_digest": ""}
    pinned = pinned or image_pinned_digest(image)
    if not mine.get("present"):
        return {"ok": False, "reference": "", "hosts_differing": [host],
                "detail": f"{image} is not present on this node",
                "fix": f"Pull it: run site.yml (container role), or docker pull {image} on this node; "
                       "check the registry address and credentials (container_registry_*)"}
    present = {h: f for h, f in by_host.items() if f.get("present") and f.get("id")}
    if pinned:
        reference = pinned
        differing = sorted(h for h, f in present.items() if pinned not in (f["id"], f.get("repo_digest")))
        why = f"the pinned digest {pinned}"
    else:
        counts = Counter(f["id"] for f in present.values())
        ranked = counts.most_common()
        if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
            # No majority: every node is suspect, name the groups.
            groups = {}
            for h, f in sorted(present.items()):
                groups.setdefault(f["id"], []).append(h)
            listing = "; ".join(f"{short_digest(i)} on {', '.join(hs)}" for i, hs in groups.items())
            return {"ok": False, "reference": "", "hosts_differing": sorted(present),
                    "detail": f"{image} resolved to different images with no majority: {listing}",
                    "fix": f"Make the registry serve one image for {image} to every node (check mirrors, "
                           "proxies, DNS and /etc/hosts on these nodes), then rerun with "
                           "container_pull_always=true; or pin container_image to repo@sha256:<digest>"}
        reference = ranked[0][0] if ranked else ""
        differing = sorted(h for h, f in present.items() if f["id"] != reference)
        why = f"the image on {len(present) - len(differing)} of {len(present)} nodes"
    mine_ok = host not in differing
    mine_desc = f"image {short_digest(mine['id'])}" + (f", registry digest {short_digest(mine['repo_digest'])}"
                                                 if mine.get("repo_digest") else "")
    if mine_ok:
        detail = f"{image}: {mine_desc}, same as {why}"
        if differing:
            detail += f" (differing: {', '.join(differing)})"
        return {"ok": True, "reference": reference, "hosts_differing": differing, "detail": detail, "fix": ""}
    return {"ok": False, "reference": reference, "hosts_differing": differing,
            "detail": f"{image} resolved to {mine_desc} on this node, expected {short_digest(reference)} "
                      f"({why}); nodes differing: {', '.join(differing)}",
            "fix": f"This node pulled a different image for {image}: check its registry route (mirror, proxy, "
                   "DNS, /etc/hosts, NAT), remove the image there (docker image rm) and rerun with "
                   "container_pull_always=true; pin container_image to repo@sha256:<digest> to stop drift"}


def image_identities(hostvars, hosts: list, image: str, check_mode: bool = False) -> list:
    """The identity of the image each host resolved (with its host), from the registered results of the container
    role (the pull's image, under the engine probe's pull, else the read of the image: the pull's image_info, or
    tasks/reads.yml's on the read-only path): what digest_verdicts compares, one entry per host."""
    fleet = []
    for h in hosts:
        hv = hostvars[h]
        pull = (hv.get("__container_engine") or {}).get("pull") or {}
        info = hv.get("__container_image_info") or pull.get("image_info") or {}
        seen = pull.get("image") if (pull.get("image") and not check_mode) else next(iter(info.get("images") or []), None)
        fleet.append(dict(image_identity(seen, image), host=h))
    return fleet


def switched_off(hostvars, hosts: list) -> list:
    """The hosts with the container role off (container_enabled false), as each node's own variables give it: the
    value the cluster role's probe kept (__cluster_host.kept, every source of the node's variables), else the node's
    inventory and extra variables (the role's default is true)."""
    out = []
    for h in hosts:
        if h not in hostvars:
            continue
        hv = hostvars[h]
        kept = (hv.get("__cluster_host") or {}).get("kept") or {}
        value = kept["container_enabled"] if "container_enabled" in kept else hv.get("container_enabled", True)
        if not boolean(value, strict=False):
            out.append(h)
    return out


def digest_verdicts(fleet: list, image: str, pinned: str = "") -> dict:
    """digest_verdict for every host of fleet (image_identities of every node, of every shard in a sharded run) at
    once, each with the identity that host resolved."""
    return {f["host"]: dict(digest_verdict(fleet, f["host"], image, pinned), id=f["id"], repo_digest=f["repo_digest"])
            for f in fleet}


def job_user(user, home: str) -> dict:
    """container_user -> what the container runs with: {user: value for docker_container (None: the image's USER),
    ids: [uid, gid] or None (root, the image's), env: HOME and USER for a uid the image has no passwd entry for
    (docker would leave HOME=/; getpass.getuser(), used by torch's compile caches, needs USER)}."""
    text = str(user if user is not None else "").strip()
    ids = container_user_ids(text)
    return {"user": text or None, "ids": list(ids) if ids else None,
            "env": {"HOME": home, "USER": "trainyard", "LOGNAME": "trainyard"} if ids else {}}


def reset_summary(name, restarted, recreate_error, existed, recreated):
    """The container's line of reset.yml's summary: restarted, a failed recreate (its message, cut to 200
    characters), recreated or created, or left alone."""
    if restarted:
        return f"{name} restarted"
    if recreate_error:
        text = str(recreate_error)
        return f"{name}: recreate failed: {text if len(text) <= 200 else text[:197] + '...'}"
    if recreated:
        return f"{name} {'recreated' if existed else 'created'}"
    return f"{name} running, left alone"


class FilterModule:
    def filters(self):
        return {
            "container_image_identities": image_identities,
            "container_switched_off": switched_off,
            "container_digest_verdicts": digest_verdicts,
            "container_image_registry": image_registry,
            "container_mounts_spec": mounts_spec,
            "container_ulimits_spec": ulimits_spec,
            "container_caps_spec": caps_spec,
            "container_job_user": job_user,
            "container_reset_summary": reset_summary,
        }
