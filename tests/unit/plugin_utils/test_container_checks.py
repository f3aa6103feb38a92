"""The container role's verdicts (plugin_utils/container_checks.py): the engine probe's reading of the answer
(engine_view) and every record the container_health action makes before the probe (verify_inputs)."""

from __future__ import annotations

from ansible_collections.trainyard.core.plugins.plugin_utils import container_checks as cc

HOST = {"ServerVersion": "27.1.1", "Driver": "overlay2", "CgroupVersion": "2"}
LIBS_OK = {"libraries": ["libcuda.so.1", "libnvidia-ml.so.1"], "missing": [], "stale": [], "mounts": []}


def ctx(**kw):
    base = {"node": "node2", "engine_ok": True, "container_gpus": "auto", "container_gpu_mode": "auto",
            "gpus": True, "gpu_mode": "runtime", "runtimes": ["runc", "nvidia"], "devices": [], "driver_libs": {},
            "driver_version": None, "driver_lib_dir": "/usr/local/nvidia/lib64"}
    return dict(base, **kw)


def test_engine_view_reads_the_answer_once():
    """The probe's result carries what the role's later tasks read (tasks/engine.yml): auto resolves to runtime
    where the engine has the NVIDIA runtime, else devices; GPUs with container_gpus all, or auto on a node with
    /dev/nvidiactl; the message on one line."""
    answer = {"can_talk_to_docker": True, "host_info": {"Runtimes": {"runc": {}, "nvidia": {}}}}
    assert cc.engine_view(answer, "auto", "auto", True) == {
        "engine_ok": True, "engine_msg": "no answer", "runtimes": ["runc", "nvidia"], "gpus": True,
        "gpu_mode": "runtime"}
    plain = {"can_talk_to_docker": True, "host_info": {"Runtimes": {"runc": {}}}}
    assert cc.engine_view(plain, "auto", "auto", False)["gpu_mode"] == "devices"
    assert cc.engine_view(plain, "auto", "auto", False)["gpus"] is False
    assert cc.engine_view(plain, "all", "runtime", False) | {"runtimes": []} == {
        "engine_ok": True, "engine_msg": "no answer", "runtimes": [], "gpus": True, "gpu_mode": "runtime"}
    assert cc.engine_view(answer, "none", "auto", True)["gpus"] is False
    down = cc.engine_view({"can_talk_to_docker": False, "msg": "Error connecting:\n  refused"}, "auto", "auto", "yes")
    assert down == {"engine_ok": False, "engine_msg": "Error connecting: refused", "runtimes": [], "gpus": True,
                    "gpu_mode": "devices"}
    assert cc.engine_view(None, "auto", "auto", False)["engine_ok"] is False


def test_engine_pass_names_version_storage_cgroup():
    rec = cc.engine_record(True, HOST, "")
    assert rec["check"] == "container.engine" and rec["ok"] is True
    assert rec["detail"] == "docker 27.1.1 (storage overlay2, cgroup v2)"
    assert rec["data"] == {"drift": {"docker_version": "27.1.1"}}
    assert cc.engine_record("True", {"ServerVersion": "26", "Driver": "vfs"})["detail"].endswith("cgroup v?)")


def test_engine_fail_says_why_and_how_to_start_it():
    rec = cc.engine_record(False, {}, "Error while fetching server API version: connection refused")
    assert rec["ok"] is False
    assert rec["detail"] == ("cannot talk to the docker engine: Error while fetching server API version: "
                             "connection refused")
    assert rec["fix"].startswith("Start the engine on the node (systemctl enable --now docker")
    assert "container_engine_install: true" in rec["fix"]
    assert rec["data"]["drift"]["docker_version"] is None


def test_engine_fail_without_the_python_libraries_names_the_packages():
    rec = cc.engine_record(False, None, "Failed to import the required Python library (requests)")
    assert "apt-get install python3-docker python3-requests" in rec["fix"]


def test_engine_message_is_cut_like_jinja_truncate():
    long = "word " * 100
    detail = cc.engine_record(False, {}, long)["detail"]
    assert detail.endswith("...") and len(detail) < len("cannot talk to the docker engine: ") + 300
    assert cc.truncate("a" * 305) == "a" * 305 and cc.truncate("a b " * 80).endswith("b...")


def test_gpus_skip_when_the_engine_does_not_answer():
    rec = cc.gpus_record(ctx(engine_ok=False))
    assert (rec["status"], rec["detail"]) == ("skip", "not checked: the engine does not answer")


def test_gpus_pass_without_gpus():
    assert cc.gpus_record(ctx(container_gpus="none", gpus=False))["detail"] == (
        "GPUs not requested (container_gpus: none)")
    rec = cc.gpus_record(ctx(gpus=False))
    assert rec["status"] == "pass" and "no GPUs on this node (/dev/nvidiactl absent)" in rec["detail"]
    assert rec["data"]["gpu_mode"] == "none" and rec["data"]["drift"] == {"container_gpu_mode": "none"}


def test_gpus_runtime_pass_and_fail():
    rec = cc.gpus_record(ctx())
    assert (rec["status"], rec["detail"]) == ("pass", "gpu mode runtime: all GPUs through the NVIDIA runtime")
    bad = cc.gpus_record(ctx(runtimes=["runc"], container_gpu_mode="runtime"))
    assert bad["status"] == "fail"
    assert bad["detail"] == ("gpu mode runtime (container_gpu_mode: runtime) but the engine has no NVIDIA runtime "
                             "(runtimes: runc)")
    assert "nvidia-ctk runtime configure --runtime=docker" in bad["fix"] and "container_gpu_mode: devices" in bad["fix"]
    assert bad["data"]["gpu_mode"] == "runtime"


def test_gpus_devices_pass_lists_devices_and_libraries():
    rec = cc.gpus_record(ctx(gpu_mode="devices", runtimes=["runc"], driver_version="580.95",
                             devices=["/dev/nvidia0:/dev/nvidia0:rwm", "/dev/nvidiactl:/dev/nvidiactl:rwm"],
                             driver_libs=dict(LIBS_OK, stale=["libcuda.so.1 -> /usr/lib/libcuda.so.535.1"])))
    assert rec["status"] == "pass"
    assert rec["detail"] == ("gpu mode devices (auto: the engine has no NVIDIA runtime): /dev/nvidia0 /dev/nvidiactl; "
                             "driver 580.95 libraries libcuda.so.1 libnvidia-ml.so.1 mounted read-only at "
                             "/usr/local/nvidia/lib64; left out (another driver version): "
                             "libcuda.so.1 -> /usr/lib/libcuda.so.535.1")
    assert rec["data"]["devices"][0] == "/dev/nvidia0:/dev/nvidia0:rwm"
    assert rec["data"]["driver_libraries"] == ["libcuda.so.1", "libnvidia-ml.so.1"]


def test_gpus_devices_fail_names_the_node_the_driver_and_the_fix():
    rec = cc.gpus_record(ctx(gpu_mode="devices", container_gpu_mode="devices", driver_version="580.95",
                             devices=["/dev/nvidia0:/dev/nvidia0:rwm"],
                             driver_libs={"libraries": ["libcuda.so.1"], "missing": ["libnvidia-ml"], "stale": []}))
    assert rec["status"] == "fail"
    assert rec["detail"].startswith("gpu mode devices (container_gpu_mode: devices): /dev/nvidia0;")
    assert rec["detail"].endswith("; missing libnvidia-ml")
    assert rec["fix"].startswith("The driver is incomplete on node2: ldconfig -p must list libcuda.so.1 and "
                                 "libnvidia-ml.so.1 of driver 580.95 and /dev/nvidia0 must exist")
    assert cc.gpus_record(ctx(gpu_mode="devices", devices=[], driver_libs=LIBS_OK))["status"] == "fail"
    assert "of driver ? and" in cc.gpus_record(ctx(gpu_mode="devices"))["fix"]


RUN = {"engine_ok": True, "name": "trainyard-job", "problems": [], "mounts": 3, "user": "65532:65532",
       "caps": [], "no_new_privileges": True, "ulimits": ["memlock=-1:-1", "stack=67108864:67108864"],
       "run_msg": None, "run_ran": False}


def test_running_pass_describes_the_container():
    rec = cc.running_record(dict(RUN, pending_on={"container : Start the training container": {}}))
    assert rec["check"] == "container.running" and rec["status"] == "pass"
    assert rec["detail"] == ("trainyard-job: running, host network/IPC/PID, 3 mounts, user 65532:65532, capabilities "
                             "none, no-new-privileges on")
    assert rec["pending_on"] == {"container : Start the training container": {}}
    detail = cc.running_record(dict(RUN, user="", caps=["SYS_PTRACE"], no_new_privileges=False))["detail"]
    assert "user of the image, capabilities SYS_PTRACE, no-new-privileges off" in detail


def test_running_skip_when_the_engine_does_not_answer():
    rec = cc.running_record(dict(RUN, engine_ok=False))
    assert (rec["status"], rec["detail"]) == ("skip", "not checked: the engine does not answer")


def test_running_fail_lists_the_problems_and_how_to_recreate():
    rec = cc.running_record(dict(RUN, problems=["not running", "image differs"]))
    assert (rec["status"], rec["detail"]) == ("fail", "trainyard-job: not running; image differs")
    assert rec["fix"] == "Run site.yml (container role) to create trainyard-job with the wanted configuration"
    rec = cc.running_record(dict(RUN, problems=["not running"], run_ran=True, run_msg="Error  response\n from daemon"))
    assert rec["detail"] == "trainyard-job: not running (start failed: Error response from daemon)"
    assert rec["fix"] == ("Fix the cause above and rerun site.yml; it recreates trainyard-job when its configuration "
                          "changed (docker logs trainyard-job on the node)")


def test_running_fail_on_ulimits_names_the_engine_limits():
    rec = cc.running_record(dict(RUN, problems=["not running"], run_ran=True,
                                 run_msg="setrlimit(RLIMIT_MEMLOCK): operation not permitted: rlimit"))
    assert rec["fix"] == ("The engine may not raise these ulimits (memlock=-1:-1, stack=67108864:67108864): run dockerd "
                          "with LimitMEMLOCK=infinity and LimitSTACK=infinity (docker.service), or lower "
                          "container_ulimits")


def test_digest_record_pass_fail_skip_and_its_drift_value():
    """container.image_digest: status from the node's verdict, the drift value the repo digest, else the image id;
    pending on the pull."""
    ok = {"ok": True, "detail": "sha256:aa (as 3 of 3 nodes)", "id": "sha256:11", "repo_digest": "r@sha256:aa",
          "reference": "r:1"}
    rec = cc.digest_record(ok, True, "r:1", {"changed": False})
    assert rec == {"check": "container.image_digest", "status": "pass", "detail": "sha256:aa (as 3 of 3 nodes)",
                   "fix": "", "data": {"image": "r:1", "image_id": "sha256:11", "repo_digest": "r@sha256:aa",
                                       "reference": "r:1", "drift": {"image_digest": "r@sha256:aa"}},
                   "pending_on": {"container : Pull the training image": {"changed": False}}}
    bad = dict(ok, ok=False, repo_digest="", fix="Pull r:1 again on node3")
    rec = cc.digest_record(bad, "true", "r:1")
    assert rec["status"] == "fail" and rec["fix"] == "Pull r:1 again on node3"
    assert rec["data"]["drift"] == {"image_digest": "sha256:11"} and rec["pending_on"] == {
        "container : Pull the training image": {}}
    off = cc.digest_record(ok, False, "r:1")
    assert off["status"] == "skip" and off["detail"] == "not checked: the engine does not answer"


def test_manifest_digest_of_one_manifest_or_a_platform_list():
    one = '{"Descriptor": {"digest": "sha256:aaa"}}'
    many = ('[{"Descriptor": {"digest": "sha256:arm", "platform": {"architecture": "arm64"}}},'
            ' {"Descriptor": {"digest": "sha256:amd", "platform": {"architecture": "amd64"}}}]')
    assert cc.manifest_digest(one) == "sha256:aaa"
    assert cc.manifest_digest(many) == "sha256:amd"
    assert cc.manifest_digest('[{"Descriptor": {"digest": "sha256:arm"}}]') == "sha256:arm"
    assert cc.manifest_digest("") == cc.manifest_digest("[]") == cc.manifest_digest("not json") == "?"


def test_registry_reach_pass_and_fail():
    ok = cc.registry_reach_record({"rc": 0, "stdout": '{"Descriptor": {"digest": "sha256:aaa"}}'},
                                  "reg:5000/t/train:1", "reg:5000")
    assert ok["check"] == "container.registry_reach" and ok["ok"] is True
    assert ok["detail"] == "reg:5000/t/train:1 is in the registry, digest sha256:aaa"
    assert ok["data"] == {"registry_digest": "sha256:aaa"}
    bad = cc.registry_reach_record({"rc": 1, "stderr": "Get https://reg:5000/v2/:\n  http: server gave HTTP"},
                                   "reg:5000/t/train:1", "reg:5000")
    assert bad["ok"] is False and bad["data"] == {"registry_digest": None}
    assert bad["detail"] == ("the run would pull reg:5000/t/train:1 but this node cannot read it from the registry: "
                             "Get https://reg:5000/v2/: http: server gave HTTP")
    assert bad["fix"].startswith("Make the registry (reg:5000) reachable from this node")
    assert cc.registry_reach_record(None, "i", "r")["detail"].endswith("from the registry: ?")


def test_pull_records_only_for_the_steps_that_ran():
    """container.registry_login and container.image_pull: none for a skipped or absent step; present, pulled and
    check mode's not present yet; a failed pull names the engine's message on one line."""
    assert cc.pull_records(None, None, "r:1", "reg:5000", "") == []
    assert cc.pull_records({"skipped": True}, {"skipped": True, "changed": False}, "r:1", "reg:5000", "u") == []
    present = {"changed": False, "image": {"Id": "sha256:1"}}
    [rec] = cc.pull_records(present, {"skipped": True}, "r:1", "reg:5000", "u")
    assert rec == {"check": "container.image_pull", "ok": True, "detail": "r:1 present",
                   "fix": "Check that the node reaches the registry (reg:5000), the image name and tag, and the registry "
                          "credentials (container_registry_username, container_registry_password)",
                   "pending_on": {"container : Pull the training image": present}}
    pulled = dict(present, changed=True)
    assert cc.pull_records(pulled, None, "r:1", "reg", "u")[0]["detail"] == "r:1 pulled"
    assert cc.pull_records(pulled, None, "r:1", "reg", "u", True)[0]["detail"] == "r:1 not present yet"
    failed = {"changed": False, "failed": True, "msg": "Error response from daemon:\n  manifest unknown"}
    [login, rec] = cc.pull_records(failed, {"changed": False, "login_result": {}}, "r:1", "reg", "bot")
    assert login == {"check": "container.registry_login", "ok": True, "detail": "logged in to reg as bot",
                     "fix": "Check container_registry_username and container_registry_password (a token may have "
                            "expired) and container_registry_url"}
    assert not rec["ok"] and rec["detail"] == "pulling r:1 failed: Error response from daemon: manifest unknown"
    assert cc.pull_records(None, {"failed": True, "msg": "denied"}, "r:1", "reg", "bot")[0]["detail"] == (
        "login failed at reg as bot")
    long = cc.pull_records({"msg": "x" * 400}, None, "r:1", "reg", "u")[0]["detail"]
    assert long.endswith("...") and len(long) == len("pulling r:1 failed: ") + 300


INSPECT = {"Id": "c1", "Image": "sha256:11", "State": {"Running": True, "StartedAt": "t0"},
           "HostConfig": {"NetworkMode": "host", "IpcMode": "host", "PidMode": "host", "CapDrop": ["ALL"],
                          "CapAdd": None, "SecurityOpt": ["no-new-privileges:true"]},
           "Config": {"User": "65532:65532"}, "Mounts": [{"Destination": "/srv/out", "Source": "/srv/out", "RW": True}]}


def verify(**over):
    v = {"engine": {"engine_ok": True, "host_info": HOST, "engine_msg": "", "gpus": False, "gpu_mode": "devices",
                    "runtimes": ["runc"]},
         "run": None, "info": {"container": INSPECT}, "pull": {"changed": False, "image": {}}, "login": None,
         "check_mode": False, "digest": {"ok": True, "detail": "same everywhere", "id": "sha256:11"},
         "node": "node2", "image": "r:1", "registry": "r", "registry_username": "", "name": "trainyard-job",
         "user": "65532:65532", "cap_add": [], "no_new_privileges": True, "ulimits": {"memlock": -1},
         "mounts": [{"source": "/srv/out"}], "container_gpus": "auto", "container_gpu_mode": "auto"}
    return cc.verify_inputs(dict(v, **over))


def status(rec):
    return rec.get("status", "pass" if rec.get("ok") else "fail")


def test_verify_inputs_records_every_check_before_the_probe():
    """The container_health action's records, in the order the report lists them: engine, GPUs, pull (the login
    did not run), digest, running; the probe runs where the container runs."""
    out = verify()
    assert [(r["check"], status(r)) for r in out["records"]] == [
        ("container.engine", "pass"), ("container.gpus", "pass"), ("container.image_pull", "pass"),
        ("container.image_digest", "pass"), ("container.running", "pass")]
    assert out["running"] is True and out["inspect"] is INSPECT


def test_verify_inputs_takes_the_start_over_the_read_except_in_check_mode():
    """After a start in this run its answer serves (the read did not run); in check mode the start only said what it
    would do, so the read serves. The running record names the start's message."""
    stopped = dict(INSPECT, State={"Running": False, "Status": "exited", "ExitCode": 1})
    out = verify(run={"changed": True, "container": stopped, "msg": "boom"}, info=None)
    running = out["records"][-1]
    assert out["running"] is False and out["skip_reason"] == "trainyard-job is not running"
    assert running["status"] == "fail" and "not running (status exited" in running["detail"]
    assert "(start failed: boom)" in running["detail"] and "Fix the cause above" in running["fix"]
    assert verify(run={"changed": True, "container": stopped}, check_mode=True)["running"] is True


def test_verify_inputs_reads_the_start_s_own_read_where_no_read_task_ran():
    """site.yml: container_start reads the container itself (its info) where the start gave none or in check mode;
    the read-only path's read (info) serves first."""
    stopped = dict(INSPECT, State={"Running": False, "Status": "exited", "ExitCode": 1})
    assert verify(run={"dirs": {}, "info": {"container": stopped}}, info=None)["running"] is False
    assert verify(run={"container": stopped, "info": {"container": INSPECT}}, info=None, check_mode=True)["running"]
    assert verify(run={"info": {"container": stopped}}, info={"container": INSPECT})["running"] is True


def test_verify_inputs_compares_the_wanted_configuration():
    """A container that drifted from the options (another image than the node resolved, a missing mount, a
    capability the options do not add) fails container.running with each difference."""
    drifted = dict(INSPECT, Image="sha256:22", HostConfig=dict(INSPECT["HostConfig"], CapAdd=["CAP_SYS_ADMIN"]))
    rec = verify(info={"container": drifted}, mounts=[{"source": "/srv/out"}, {"source": "/data"}])["records"][-1]
    assert rec["status"] == "fail"
    assert "runs image 22" in rec["detail"] and "mount /data missing" in rec["detail"]
    assert "capabilities added: CAP_SYS_ADMIN, expected none" in rec["detail"]


def test_verify_inputs_when_the_engine_does_not_answer():
    """Every verdict that needs the engine is skip (the engine record fails with its message); the probe does not
    run and says why."""
    out = verify(engine={"engine_ok": False, "engine_msg": "connection refused"}, info=None, pull=None)
    assert [(r["check"], status(r)) for r in out["records"]] == [
        ("container.engine", "fail"), ("container.gpus", "skip"), ("container.image_digest", "skip"),
        ("container.running", "skip")]
    assert out["running"] is False and out["skip_reason"] == "the engine does not answer"


def test_verify_inputs_takes_the_login_and_the_registry_s_answer_from_the_pull():
    """The engine probe's pull carries the login's (login) and, in check mode where the run would pull, the
    registry's answer (manifest): the login record, the pull record (not present yet) and container.registry_reach."""
    pull = {"changed": True, "image": {}, "login": {"login_result": {}, "changed": False},
            "manifest": {"rc": 0, "stdout": '{"Descriptor": {"digest": "sha256:ab"}}'}}
    checks = {r["check"]: r for r in verify(pull=pull, registry_username="u", check_mode=True)["records"]}
    assert status(checks["container.registry_login"]) == "pass" and "as u" in checks["container.registry_login"]["detail"]
    assert checks["container.image_pull"]["detail"] == "r:1 not present yet"
    reach = checks["container.registry_reach"]
    assert status(reach) == "pass" and reach["detail"] == "r:1 is in the registry, digest sha256:ab", reach
    assert "container.registry_reach" not in {r["check"] for r in verify()["records"]}
