"""A role's last step records its checks and hands on what the roles after it read in the same task (issue 35: fewer
tasks per node): preflight_check's 'publish' sets facts with the records (the janitor's janitor_sidecar), and
nvidia_driver_check's 'records' records the burn-in's record with the node's GPU checks. Each runs in a real play."""

import json
import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleActionFail

from helpers import REPO, load

PC = load("action_plugins/preflight_check.py", "preflight_check_folds_test")
NDC = load("action_plugins/nvidia_driver_check.py", "nvidia_driver_check_folds_test")

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Record and publish
      preflight_check:
        records: [{check: janitor.dry_run, ok: true, detail: found}]
        publish: {janitor_sidecar: {name: janitor, argv: [python3, janitor.py, --loop]}}
    - name: Record the GPU checks with the burn-in's record
      nvidia_driver_check:
        result: {failed: true, msg: nvidia-smi not found}
        peers: {}
        records: [{check: nvidia_driver.burnin, status: skip, detail: quick tier, fix: ""}]
    - name: Show
      ansible.builtin.debug:
        msg: "RESULT {{ {'records': preflight_results, 'sidecar': janitor_sidecar | default(none)} | to_json }}"
"""


def _play(tmp_path):
    pb = tmp_path / "pb.yml"
    pb.write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "n1,", "-c", "local",
                          "-e", f"ansible_python_interpreter={sys.executable}", str(pb)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120).stdout
    line = next(ln for ln in out.splitlines() if "RESULT " in ln)
    return json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"][len("RESULT "):])


def test_one_record_task_publishes_the_fact_and_the_burnin_record(tmp_path):
    got = _play(tmp_path)
    assert got["sidecar"] == {"name": "janitor", "argv": ["python3", "janitor.py", "--loop"]}
    checks = [r["check"] for r in got["records"]]
    assert checks[0] == "janitor.dry_run" and checks[-1] == "nvidia_driver.burnin"
    assert any(c.startswith("nvidia_driver.") and c != "nvidia_driver.burnin" for c in checks)
    burnin = [r for r in got["records"] if r["check"] == "nvidia_driver.burnin"]
    assert len(burnin) == 1 and burnin[0]["status"] == "skip" and burnin[0]["host"] == "n1"


@pytest.mark.parametrize("publish", ["janitor_sidecar", {"preflight_results": []}, {"": 1}])
def test_publish_refuses_a_name_or_the_records_fact_in_one_line(publish):
    with pytest.raises(AnsibleActionFail) as err:
        PC.ActionModule._publish(publish)
    assert "'publish' must map fact names to values" in str(err.value) and "\n" not in str(err.value)


def test_nvidia_driver_check_refuses_records_given_by_name():
    with pytest.raises(AnsibleActionFail) as err:
        object.__new__(NDC.ActionModule).decide({"result": {}, "peers": {}, "records": "__nvidia_driver_burnin"},
                                                {"inventory_hostname": "n1"})
    assert "'records' must be a list of records" in str(err.value) and "\n" not in str(err.value)


def test_the_gpu_facts_call_runs_the_burnin_tier_and_returns_its_record_also_when_nvidia_smi_fails():
    from helpers import adhoc
    r = adhoc("nvidia_gpu_facts", {"burnin": "quick", "nvidia_smi": "/nonexistent/nvidia-smi", "nvlink": False})
    assert r["failed"]
    assert r["burnin_record"]["check"] == "nvidia_driver.burnin" and r["burnin_record"]["status"] == "skip"
    ok = adhoc("nvidia_gpu_facts", {"nvidia_smi": "/nonexistent/nvidia-smi", "nvlink": False})
    assert "burnin_record" not in ok
