"""launch_secret_env on the simulated cluster (runtime docker): a secret from an ansible-vault file reaches the job's
environment on every node and appears in no -v output, no module result, no file on the controller, and no file
of the job's state directory (launch.json, the launch spec, the log); reset.yml's entry point removes it."""

from __future__ import annotations

import json
import subprocess

from helpers import REPO, BIN

PLAYBOOK = "tests/integration/playbooks/launch.yml"
STATE = "/var/lib/trainyard/train"
SECRET = "hf_sim-S3cr3t-from-the-vault"
ARGV = ["--steps", "400", "--save-every", "50", "--sleep", "0.2", "--output-root", "/srv/outputs"]


def test_vaulted_secret_reaches_every_node_and_nothing_else(cluster, tmp_path):
    pw = tmp_path / "vault-pass"
    pw.write_text("trainyard-test-vault\n")
    vars_file = tmp_path / "secrets.yml"
    vars_file.write_text(f"launch_secret_env:\n  HF_TOKEN: {SECRET}\n")
    subprocess.run([str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(pw), str(vars_file)],
                   check=True, cwd=REPO, capture_output=True)
    assert SECRET not in vars_file.read_text()
    extra = ["-v", "--vault-password-file", str(pw), "-e", f"@{vars_file}", "-e", f"cluster_run_dir={tmp_path}/run",
             "-e", json.dumps({"launch_example_argv": ARGV, "launch_resume_from": ""})]
    try:
        r = cluster.playbook(PLAYBOOK, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
        assert r.returncode == 0, r.stdout[-3000:]
        r = cluster.playbook(PLAYBOOK, *extra)
        assert r.returncode == 0, r.stdout[-4000:]
        assert SECRET not in r.stdout and "HF_TOKEN" in r.stdout  # the name is shown (secret_env), not the value
        controller = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()
                             and p != vars_file)
        assert SECRET not in controller
        for node in cluster.nodes:
            state = json.loads(cluster.exec(node, ["cat", f"{STATE}/launch.json"]).stdout)
            read = cluster.exec(node, ["cat", f"/proc/{state['pid']}/environ"], check=False)
            # A launcher gone this soon is a job that ended: its log says why (the launch's output is above it).
            assert read.returncode == 0, (node, cluster.exec(node, ["tail", "-n", "40", f"{STATE}/job-rw/torchrun.log"],
                                                             check=False).stdout, r.stdout[-3000:])
            environ = read.stdout.split("\0")
            assert f"HF_TOKEN={SECRET}" in environ, node  # the job's launcher (and torchrun below it) has it
            found = cluster.exec(node, ["grep", "-rl", SECRET, STATE], check=False)
            assert found.returncode == 1 and found.stdout == "", (node, found.stdout)
            modes = cluster.exec(node, ["stat", "-c", "%a %n", "/run/trainyard/train", "/run/trainyard/train/secret.env",
                                        STATE, f"{STATE}/launch.json"]).stdout.split()
            assert modes[0::2] == ["700", "600", "750", "640"], (node, modes)
        r = cluster.playbook("playbooks/status.yml", "-v")
        assert SECRET not in r.stdout
    finally:
        r = cluster.playbook(PLAYBOOK, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
    assert r.returncode == 0, r.stdout[-3000:]
    for node in cluster.nodes:
        assert cluster.exec(node, ["test", "-e", "/run/trainyard/train/secret.env"], check=False).returncode == 1


# The job of launch_secret_env_mode file: what it finds (files, its environment, every environ in /proc: the
# container shares the node's PID namespace), written where the test reads it; then the step marker.
PROBE = r'''import json, os, sys, time
d = os.environ.get("TRAINYARD_SECRETS_DIR", "")
files = {n: open(os.path.join(d, n)).read() for n in sorted(os.listdir(d))} if d else {}
environs = b""
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            environs += open("/proc/%s/environ" % pid, "rb").read()
        except OSError:
            pass
seen = {"dir": d, "files": files, "env_has": "HF_TOKEN" in os.environ,
        "in_any_environ": [n for n, v in files.items() if v.encode() in environs],
        "writable": os.access(d, os.W_OK) if d else None}
if int(os.environ.get("RANK", "0")) == 0:
    open("/srv/outputs/secret-probe.json", "w").write(json.dumps(seen))
print("trainyard: first step done", flush=True)
time.sleep(120)
'''


def test_secret_env_mode_file_reaches_the_container_as_files_and_no_environ(cluster):
    sdir = "/run/trainyard/train/secrets"
    for node in cluster.nodes:
        cluster.exec(node, ["sh", "-c", "cat > /srv/code/secret_probe.py"], input=PROBE)
    extra = ["-e", json.dumps({
        "launch_secret_env": {"HF_TOKEN": SECRET}, "launch_secret_env_mode": "file",
        "container_mounts_extra": [{"source": sdir, "read_only": True}],
        "launch_entrypoint": "/srv/code/secret_probe.py", "launch_argv": [], "launch_resume_from": "",
        "launch_wait_for": "first_step"})]
    reset = None
    try:
        r = cluster.playbook(PLAYBOOK, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
        assert r.returncode == 0, r.stdout[-3000:]
        r = cluster.playbook(PLAYBOOK, *extra)
        assert r.returncode == 0, r.stdout[-4000:]
        assert SECRET not in r.stdout
        head = cluster.head
        seen = json.loads(cluster.exec(head, ["cat", "/srv/outputs/secret-probe.json"]).stdout)
        assert seen["dir"] == sdir and seen["files"] == {"HF_TOKEN": SECRET}, seen
        assert seen["env_has"] is False and seen["in_any_environ"] == [] and seen["writable"] is False, seen
        for node in cluster.nodes:
            state = json.loads(cluster.exec(node, ["cat", f"{STATE}/launch.json"]).stdout)
            launcher = cluster.exec(node, ["cat", f"/proc/{state['pid']}/environ"]).stdout
            agent = cluster.exec(node, ["cat", f"/proc/{state['torchrun_pid']}/environ"]).stdout
            assert SECRET not in launcher + agent, node
            assert f"TRAINYARD_SECRETS_DIR={sdir}" in agent.split("\0"), node  # the path only
            modes = cluster.exec(node, ["stat", "-c", "%a", sdir, f"{sdir}/HF_TOKEN"]).stdout.split()
            assert modes == ["500", "400"], (node, modes)
        reset = cluster.playbook(PLAYBOOK, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
        assert reset.returncode == 0, reset.stdout[-3000:]
        for node in cluster.nodes:
            assert cluster.exec(node, ["ls", "-A", sdir]).stdout == "", node  # emptied, the mount's directory kept
    finally:
        # The container as the other tests expect it, whatever failed above: without the extra mount (a node restart
        # empties /run, and a container whose bind source is gone does not start until site.yml creates it again).
        # docker_container keeps a container that has more mounts than asked for: removed here, created again by
        # the container role.
        if reset is None or reset.returncode != 0:
            cluster.playbook(PLAYBOOK, "-e", "test_launch_entry=reset", "-e", "test_launch_prepare=false")
        for node in cluster.nodes:
            cluster.exec(node, ["rm", "-f", "/srv/code/secret_probe.py", "/srv/outputs/secret-probe.json"],
                         check=False)
            cluster.exec(node, ["docker", "rm", "-f", "trainyard-train"], check=False)
        r = cluster.playbook(PLAYBOOK, "-e", "test_launch_entry=none")
    assert r.returncode == 0, r.stdout[-3000:]
