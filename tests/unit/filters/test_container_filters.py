"""Pure helpers of the container role (filter_plugins/container_filters.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from ansible_collections.trainyard.core.plugins.plugin_utils import container_checks as cc
from ansible_collections.trainyard.core.plugins.plugin_utils.cluster_model import size_bytes
from helpers import load

cf = load("filter_plugins/container_filters.py", "container_filters")

ID_A = "sha256:" + "a" * 64
ID_B = "sha256:" + "b" * 64
DG_A = "sha256:" + "1" * 64
IMG = "172.28.0.1:5055/trainyard/train:sim"


@pytest.mark.parametrize("ref,repo", [
    ("172.28.0.1:5055/trainyard/train:sim", "172.28.0.1:5055/trainyard/train"),
    ("172.28.0.1:5055/trainyard/train", "172.28.0.1:5055/trainyard/train"),
    ("ubuntu", "ubuntu"),
    ("ubuntu:24.04", "ubuntu"),
    ("reg.example.com/a/b@sha256:abc", "reg.example.com/a/b"),
    ("reg:5000/a/b:tag@sha256:abc", "reg:5000/a/b"),
])
def test_image_repository(ref, repo):
    assert cf.image_repository(ref) == repo


@pytest.mark.parametrize("ref,registry", [
    ("172.28.0.1:5055/trainyard/train:sim", "172.28.0.1:5055"),
    ("nvcr.io/nvidia/pytorch:24.10-py3", "nvcr.io"),
    ("localhost/train", "localhost"),
    ("team/train:1", "docker.io"),
    ("ubuntu:24.04", "docker.io"),
])
def test_image_registry(ref, registry):
    assert cf.image_registry(ref) == registry


@pytest.mark.parametrize("value,expected", [
    ("16g", 16 * 2 ** 30), ("512m", 512 * 2 ** 20), ("1GiB", 2 ** 30), ("2GB", 2 * 2 ** 30),
    ("100", 100), (4096, 4096), ("1.5g", int(1.5 * 2 ** 30)), (" 64M ", 64 * 2 ** 20),
])
def test_size_bytes(value, expected):
    assert size_bytes(value) == expected


@pytest.mark.parametrize("value", ["", "big", "16x", "-1g", True, None, "1 g b"])
def test_size_bytes_rejects(value):
    with pytest.raises(ValueError):
        size_bytes(value)
    assert size_bytes(value, -1) == -1


@given(st.integers(min_value=1, max_value=2 ** 20), st.sampled_from(["k", "m", "g", "K", "M", "G"]))
def test_size_bytes_units(n, unit):
    assert size_bytes(f"{n}{unit}") == n * {"k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30}[unit.lower()]


def test_identity_picks_the_digest_of_the_configured_repository():
    info = {"Id": ID_A, "RepoDigests": ["other/repo@sha256:999", f"172.28.0.1:5055/trainyard/train@{DG_A}"]}
    ident = cf.image_identity(info, IMG)
    assert ident["present"] and ident["id"] == ID_A and ident["repo_digest"] == DG_A
    assert cf.image_identity(None, IMG)["present"] is False
    loaded = cf.image_identity({"Id": ID_B, "RepoDigests": []}, IMG)
    assert loaded["id"] == ID_B and loaded["repo_digest"] == ""


def fleet(*ids):
    return [{"host": f"n{i + 1}", "present": bool(x), "id": x or "", "repo_digest": ""} for i, x in enumerate(ids)]


def test_same_image_everywhere_passes():
    f = fleet(ID_A, ID_A, ID_A)
    for h in ("n1", "n2", "n3"):
        v = cf.digest_verdict(f, h, IMG)
        assert v["ok"] and v["hosts_differing"] == []
        assert "3 of 3 nodes" in v["detail"]


def test_the_odd_node_out_fails_and_is_named():
    f = fleet(ID_A, ID_B, ID_A)
    bad = cf.digest_verdict(f, "n2", IMG)
    assert not bad["ok"]
    assert bad["hosts_differing"] == ["n2"]
    assert "n2" in bad["detail"] and "bbbbbbbbbbbb" in bad["detail"] and "aaaaaaaaaaaa" in bad["detail"]
    assert "container_pull_always" in bad["fix"]
    good = cf.digest_verdict(f, "n1", IMG)
    assert good["ok"] and "differing: n2" in good["detail"]


def test_verdicts_for_the_whole_play_read_each_nodes_pull_or_its_image_read():
    hostvars = {
        "n1": {"__container_engine": {"pull": {"image": {"Id": ID_A, "RepoDigests": [f"172.28.0.1:5055/trainyard/train@{DG_A}"]}}}},
        "n2": {"__container_engine": {"pull": {"skipped": True}}, "__container_image_info": {"images": [{"Id": ID_B}]}},
        "n3": {"__container_engine": {"pull": {"image": {"Id": ID_A}}}},
        "n4": {"__container_engine": {"pull": {"skipped": True}}, "__container_image_info": {"images": []}},
    }
    v = cf.digest_verdicts(cf.image_identities(hostvars, ["n1", "n2", "n3", "n4"], IMG), IMG)
    assert v["n1"]["ok"] and v["n1"]["id"] == ID_A and v["n1"]["repo_digest"] == DG_A
    assert not v["n2"]["ok"] and v["n2"]["hosts_differing"] == ["n2"] and v["n2"]["id"] == ID_B
    assert v["n3"]["ok"]
    assert not v["n4"]["ok"] and "not present on this node" in v["n4"]["detail"]
    # In check mode the pull did not happen: the node's own read is what it has.
    hostvars["n1"]["__container_image_info"] = {"images": [{"Id": ID_B}]}
    assert cf.digest_verdicts(cf.image_identities(hostvars, ["n1", "n2", "n3"], IMG, check_mode=True), IMG)["n3"]["hosts_differing"] == ["n3"]


def test_the_pulls_own_read_of_the_image_serves_where_the_pull_gave_none():
    # site.yml: the engine probe's pull reads the image itself (image_info) where its pull failed, or in check mode.
    hostvars = {
        "n1": {"__container_engine": {"pull": {"image": {"Id": ID_A}}}},
        "n2": {"__container_engine": {"pull": {"image": {"Id": ID_A}}}},
        "n3": {"__container_engine": {"pull": {"msg": "pull failed", "image_info": {"images": [{"Id": ID_B}]}}}},
    }
    v = cf.digest_verdicts(cf.image_identities(hostvars, ["n1", "n2", "n3"], IMG), IMG)
    assert v["n1"]["ok"] and not v["n3"]["ok"] and v["n3"]["id"] == ID_B
    checked = {h: {"__container_engine": {"pull": {"image": {"Id": ID_B}, "image_info": {"images": [{"Id": ID_A}]}}}}
               for h in ("n1", "n2")}
    assert cf.digest_verdicts(cf.image_identities(checked, ["n1", "n2"], IMG, check_mode=True), IMG)["n1"]["id"] == ID_A


def test_no_majority_fails_every_node():
    f = fleet(ID_A, ID_B)
    for h in ("n1", "n2"):
        v = cf.digest_verdict(f, h, IMG)
        assert not v["ok"]
        assert "no majority" in v["detail"] and "n1" in v["detail"] and "n2" in v["detail"]


def test_single_node_passes():
    assert cf.digest_verdict(fleet(ID_A), "n1", IMG)["ok"]


def test_missing_image_fails():
    v = cf.digest_verdict(fleet(ID_A, None, ID_A), "n2", IMG)
    assert not v["ok"] and "not present" in v["detail"]
    # The nodes that have it still agree with each other.
    assert cf.digest_verdict(fleet(ID_A, None, ID_A), "n1", IMG)["ok"]


def test_pinned_digest_beats_the_majority():
    f = fleet(ID_A, ID_A, ID_B)
    assert not cf.digest_verdict(f, "n1", IMG, ID_B)["ok"]
    assert cf.digest_verdict(f, "n3", IMG, ID_B)["ok"]
    # A registry digest pin (repo@sha256:...) matches the repo digest.
    f2 = [{"host": "n1", "present": True, "id": ID_A, "repo_digest": DG_A}]
    assert cf.digest_verdict(f2, "n1", f"reg/x@{DG_A}")["ok"]
    assert not cf.digest_verdict(f2, "n1", f"reg/x@{ID_B}")["ok"]


@given(st.lists(st.sampled_from([ID_A, ID_B, "sha256:" + "c" * 64]), min_size=1, max_size=9))
def test_verdict_properties(ids):
    f = fleet(*ids)
    verdicts = {x["host"]: cf.digest_verdict(f, x["host"], IMG) for x in f}
    passing = {h for h, v in verdicts.items() if v["ok"]}
    # Every passing node runs the same image, and it is the most common one.
    assert len({x["id"] for x in f if x["host"] in passing}) <= 1
    if passing:
        common = max(ids.count(i) for i in set(ids))
        assert len(passing) == common
    # Every failing node is named in its own detail.
    for h, v in verdicts.items():
        if not v["ok"]:
            assert h in v["detail"]


def test_ulimits_and_mounts_spec():
    assert cf.ulimits_spec({"memlock": -1, "stack": 67108864, "nofile": "1024:4096"}) == [
        "memlock:-1:-1", "nofile:1024:4096", "stack:67108864:67108864"]
    assert cf.mounts_spec([{"source": "/a", "read_only": True}, {"source": "/b", "target": "/c"}]) == [
        {"type": "bind", "source": "/a", "target": "/a", "read_only": True},
        {"type": "bind", "source": "/b", "target": "/c", "read_only": False}]


def inspect(**over):
    base = {
        "Image": ID_A,
        "State": {"Running": True, "Status": "running", "ExitCode": 0, "Error": ""},
        "HostConfig": {"NetworkMode": "host", "IpcMode": "host", "PidMode": "host", "DeviceRequests": None},
        "Mounts": [{"Source": "/srv/outputs", "Destination": "/srv/outputs", "RW": True},
                   {"Source": "/srv/shared", "Destination": "/srv/shared", "RW": False}],
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return base


WANT = {"image": IMG, "image_id": ID_A, "network_mode": "host", "ipc_mode": "host", "pid_mode": "host",
        "mounts": [{"source": "/srv/outputs"}, {"source": "/srv/shared", "read_only": True}], "gpus": False}


def test_config_as_wanted():
    assert cc.config_problems(inspect(), WANT) == []


@pytest.mark.parametrize("over,needle", [
    ({"State": {"Running": False, "Status": "created", "Error": "error setting rlimit type 8"}}, "rlimit"),
    ({"HostConfig": {"NetworkMode": "bridge"}}, "network_mode is bridge"),
    ({"HostConfig": {"IpcMode": "private"}}, "ipc_mode is private"),
    ({"HostConfig": {"PidMode": ""}}, "pid_mode is default"),
    ({"Image": ID_B}, "runs image bbbbbbbbbbbb"),
    ({"Mounts": [{"Source": "/srv/shared", "Destination": "/srv/shared", "RW": False}]}, "mount /srv/outputs missing"),
    ({"Mounts": [{"Source": "/srv/outputs", "Destination": "/srv/outputs", "RW": False},
                 {"Source": "/srv/shared", "Destination": "/srv/shared", "RW": False}]}, "/srv/outputs is ro"),
    ({"Mounts": [{"Source": "/x", "Destination": "/srv/outputs", "RW": True},
                 {"Source": "/srv/shared", "Destination": "/srv/shared", "RW": False}]}, "comes from /x"),
])
def test_config_problems_named(over, needle):
    problems = cc.config_problems(inspect(**over), WANT)
    assert any(needle in p for p in problems), problems


def test_config_missing_container_and_gpus():
    assert cc.config_problems(None, WANT) == ["container does not exist"]
    assert any("GPU" in p for p in cc.config_problems(inspect(), {**WANT, "gpus": True}))
    gpu = inspect(HostConfig={"DeviceRequests": [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]})
    assert cc.config_problems(gpu, {**WANT, "gpus": True}) == []


PARAMS = {"code_dir": "/srv/code", "output_root": "/srv/outputs", "shared_root": "/srv/shared",
          "logger_module": "tensorboard", "python": "python3", "shm_size": "16g", "container": "trainyard-train"}


def test_health_records_from_probe_output():
    out = {"code_dir": {"ok": True, "detail": "/srv/code exists"},
           "output_writable": {"ok": False, "detail": "cannot write: OSError: [Errno 30] Read-only file system"},
           "shared_readable": {"ok": True, "detail": "ok"},
           "logger": {"ok": False, "detail": "import tensorboard failed: ModuleNotFoundError"},
           "python": {"ok": True, "detail": "3.11"}, "torch": {"ok": True, "detail": "2.13"},
           "ulimits": {"ok": True, "detail": "memlock=unlimited"}, "shm": {"status": "warn", "detail": "small"}}
    recs = {r["check"]: r for r in cc.health_records({"rc": 0, "stdout": "noise\n" + json.dumps(out)}, PARAMS)}
    assert recs["container.health.output_writable"]["status"] == "fail"
    assert "/srv/outputs" in recs["container.health.output_writable"]["fix"]
    assert recs["container.health.logger"]["status"] == "fail"
    assert "pip install tensorboard" in recs["container.health.logger"]["fix"]
    assert recs["container.health.shm"]["status"] == "warn"
    assert recs["container.health.code_dir"] == {"check": "container.health.code_dir", "status": "pass",
                                                 "detail": "/srv/code exists", "fix": ""}


def test_health_records_when_probe_cannot_run():
    recs = cc.health_records({"rc": 127, "stdout": "", "stderr": "exec: \"python3\": executable file not found"},
                             PARAMS)
    by = {r["check"]: r for r in recs}
    assert by["container.health.python"]["status"] == "fail"
    assert "executable file not found" in by["container.health.python"]["detail"]
    assert all(r["status"] == "skip" for c, r in by.items() if c != "container.health.python")
    skipped = cc.health_records({"skipped": True, "skip_reason": "trainyard-train is not running"}, PARAMS)
    assert len(skipped) == 10 and all(r["status"] == "skip" and "not running" in r["detail"] for r in skipped)


def test_gpu_visible_verdict():
    want = ["GPU-aaaa", "GPU-bbbb"]
    assert cc.gpu_visible_verdict({"uuids": ["GPU-bbbb", "GPU-aaaa"]}, want, "devices")["status"] == "pass"
    short = cc.gpu_visible_verdict({"uuids": ["GPU-aaaa"]}, want, "devices")
    assert short["status"] == "fail" and "1 of 2" in short["detail"] and "missing GPU-bbbb" in short["detail"]
    alien = cc.gpu_visible_verdict({"uuids": ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]}, want, "runtime")
    assert alien["status"] == "fail" and "not on the node GPU-cccc" in alien["detail"]
    err = cc.gpu_visible_verdict({"error": "nvidia-smi exited 9: NVIDIA-SMI has failed"}, want, "devices")
    assert err["status"] == "fail" and "NVIDIA-SMI has failed" in err["detail"]
    assert cc.gpu_visible_verdict({"uuids": []}, [], "devices")["status"] == "skip"


def test_health_records_gpu_visible_from_the_probe():
    base = {"python": {"ok": True, "detail": "3.12"}}
    params = dict(PARAMS, gpu_uuids=["GPU-aaaa"], gpu_mode="devices")
    recs = {r["check"]: r for r in cc.health_records({"rc": 0, "stdout": json.dumps(
        dict(base, gpu_visible={"uuids": ["GPU-aaaa"]}))}, params)}
    assert recs["container.health.gpu_visible"]["status"] == "pass"
    recs = {r["check"]: r for r in cc.health_records({"rc": 0, "stdout": json.dumps(
        dict(base, gpu_visible={"uuids": []}))}, params)}
    assert recs["container.health.gpu_visible"]["status"] == "fail"
    assert "container_gpu_mode" in recs["container.health.gpu_visible"]["fix"]
    # no GPU on the node (the CPU simulation): the probe skips with the reason, never passes
    recs = {r["check"]: r for r in cc.health_records({"rc": 0, "stdout": json.dumps(
        dict(base, gpu_visible={"status": "skip", "detail": "no GPU on this node"}))}, params)}
    assert recs["container.health.gpu_visible"] == {"check": "container.health.gpu_visible", "status": "skip",
                                                    "detail": "no GPU on this node", "fix": ""}


def test_config_problems_gpu_mode_devices_wants_the_device_nodes():
    inspect = {"State": {"Running": True}, "HostConfig": {"NetworkMode": "host", "Devices": [
        {"PathOnHost": "/dev/nvidiactl", "PathInContainer": "/dev/nvidiactl", "CgroupPermissions": "rwm"}]}}
    want = {"gpus": True, "gpu_mode": "devices",
            "devices": ["/dev/nvidia0:/dev/nvidia0:rwm", "/dev/nvidiactl:/dev/nvidiactl:rwm"]}
    assert cc.config_problems(inspect, want) == [
        "GPU device node(s) /dev/nvidia0 not given to the container (gpu_mode devices)"]
    assert cc.config_problems(inspect, dict(want, gpu_mode="runtime")) == ["no GPU device request (the node has GPUs)"]


# ---------------------------------------------------------------------------------------------- hardening

HARD = {"user": "65532:65532", "cap_add": [], "no_new_privileges": True}


def hardened(**over):
    c = inspect(Config={"User": "65532:65532"},
                HostConfig={"CapDrop": ["ALL"], "CapAdd": None, "SecurityOpt": ["no-new-privileges"]})
    for k, v in over.items():
        c[k] = {**c.get(k, {}), **v}
    return c


def test_hardened_container_as_wanted():
    assert cc.config_problems(hardened(), {**WANT, **HARD}) == []
    # docker's other spellings of the option, and capability names with or without CAP_
    ok = hardened(HostConfig={"CapDrop": ["ALL"], "CapAdd": ["CAP_IPC_LOCK"], "SecurityOpt": ["no-new-privileges:true"]})
    assert cc.config_problems(ok, {**WANT, **HARD, "cap_add": ["ipc_lock"]}) == []


def test_a_container_of_the_old_settings_is_named():
    """A container started before the hardening (root, docker's default capabilities, no no-new-privileges):
    every difference is a problem, so container.running fails until site.yml recreates it."""
    problems = cc.config_problems(inspect(), {**WANT, **HARD})
    assert problems == ["runs as user root (the image default), expected 65532:65532",
                        "capabilities dropped: none, expected ALL",
                        "no-new-privileges is not set, expected set"], problems


@pytest.mark.parametrize("host,config,needle", [
    ({"CapAdd": ["CAP_SYS_ADMIN"]}, {}, "capabilities added: CAP_SYS_ADMIN, expected none"),
    ({"CapDrop": ["NET_RAW"]}, {}, "capabilities dropped: NET_RAW, expected ALL"),
    ({"SecurityOpt": ["no-new-privileges:false"]}, {}, "no-new-privileges is not set"),
    ({}, {"User": "root"}, "runs as user root, expected 65532:65532"),
])
def test_hardening_problems_named(host, config, needle):
    c = hardened()
    c["HostConfig"].update(host)
    c["Config"].update(config)
    assert any(needle in p for p in cc.config_problems(c, {**WANT, **HARD})), cc.config_problems(c, {**WANT, **HARD})


def test_opt_outs_compare_as_asked():
    root = hardened(Config={"User": "root"}, HostConfig={"CapDrop": ["ALL"], "CapAdd": None, "SecurityOpt": None})
    assert cc.config_problems(root, {**WANT, "user": "root", "cap_add": [], "no_new_privileges": False}) == []
    # "" is the image's USER: whatever the image says is as wanted
    assert cc.config_problems(root, {**WANT, "user": "", "cap_add": [], "no_new_privileges": False}) == []


def test_caps_spec_normalises_to_dockers_names():
    assert cf.caps_spec(["ipc_lock", "CAP_IPC_LOCK", " sys_nice ", ""]) == ["CAP_IPC_LOCK", "CAP_SYS_NICE"]
    assert cf.caps_spec(None) == []


def test_job_user():
    assert cf.job_user("65532:65532", "/tmp/h") == {
        "user": "65532:65532", "ids": [65532, 65532],
        "env": {"HOME": "/tmp/h", "USER": "trainyard", "LOGNAME": "trainyard"}}
    assert cf.job_user("root", "/tmp/h") == {"user": "root", "ids": None, "env": {}}
    assert cf.job_user("", "/tmp/h") == {"user": None, "ids": None, "env": {}}
    with pytest.raises(ValueError):
        cf.job_user("1000", "/tmp/h")


def test_the_nodes_with_the_role_off_as_each_nodes_own_variables_give_it():
    """The probe's kept value (every source of the node's variables) first, else the node's inventory value, else the
    role's default (on); the strings an INI inventory gives count as booleans."""
    hostvars = {"a": {"__cluster_host": {"kept": {"container_enabled": False}}, "container_enabled": True},
                "b": {"__cluster_host": {"kept": {"container_enabled": True}}},
                "c": {"container_enabled": "no"},
                "d": {},
                "e": {"__cluster_host": {"kept": {"container_enabled": "false"}}}}
    assert cf.switched_off(hostvars, ["a", "b", "c", "d", "e", "absent"]) == ["a", "c", "e"]
    assert cf.FilterModule().filters()["container_switched_off"] is cf.switched_off
