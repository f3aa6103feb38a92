"""What recover reports and how it resumes: the "recover" section of report.json, report.md and the health page
(module_utils/recover.py report_section, filter_plugins/cluster_report.py, templates/health_page_recover.html.j2),
the weights-only resume of a LLaMA-Factory job rendered by the real train_args role, and the refusal when a
checkpoint holds no optimizer state and the user did not choose weights-only."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser

import pytest
import yaml

from helpers import load
from helpers import LocalCluster

from ansible_collections.trainyard.core.plugins.module_utils import recover as rc

bt = load("tests/data/checkpoints/build_tree.py", "build_tree_rr")
report_mod = load("filter_plugins/cluster_report.py", "cluster_report_rr")
page = load("filter_plugins/health_page.py", "health_page_rr")
flt = load("filter_plugins/recover_shards.py", "recover_filters_rr")

HOSTS = ["n1", "n2", "n3"]


def _plan(unreachable=None, failed=None):
    return rc.plan_survivors(HOSTS, unreachable or {}, failed or {}, 1, 1, 39500,
                             {h: "10.0.0.%d" % i for i, h in enumerate(HOSTS, 1)})


def _report(section, records=None):
    records = records if records is not None else {
        "n2": [{"check": "cluster.disk", "status": "pass", "run": "r1"}],
        "n3": [{"check": "cluster.disk", "status": "pass", "run": "r1"},
               {"check": "nvidia_driver.xid", "status": "fail", "detail": "Xid 79 on GPU 0", "run": "r1"}]}
    plan = section["_plan"]
    rep = report_mod.build_report(records, HOSTS, plan["models"], "r1", "/runs/r1")
    rep["recover"] = {k: v for k, v in section.items() if k != "_plan"}
    return rep


def _section(plan, *args, **kw):
    return dict(rc.report_section(plan, *args, **kw), _plan=plan)


# ---- the section itself
def test_section_names_the_dropped_nodes_why_the_rank_map_and_the_head_move():
    plan = _plan({"n1": "ssh: connect to host 10.0.0.1 port 22: Connection timed out"},
                 {"n3": ["nvidia_driver.xid: Xid 79 on GPU 0"]})
    s = rc.report_section(plan, "full", "/o/checkpoint-20", True, 3, fmt="deepspeed")
    assert [(d["host"], d["why"], d["old_rank"]) for d in s["dropped"]] == [("n1", "unreachable", 0),
                                                                           ("n3", "preflight", 2)]
    assert s["dropped"][0]["detail"] == "ssh: connect to host 10.0.0.1 port 22: Connection timed out"
    assert s["dropped"][1]["checks"] == ["nvidia_driver.xid"] and "Xid 79" in s["dropped"][1]["detail"]
    assert s["ranks"] == [{"host": "n2", "node_rank": 0, "old_rank": 1, "head": True}]
    assert (s["head"], s["old_head"], s["head_moved"]) == ("n2", "n1", True)
    assert (s["world_size_before"], s["world_size"]) == (3, 1)
    assert s["resume"]["how"] == ("universal conversion from world size 3 to 1 (global_stepN_universal/: model, "
                                  "adapter and optimizer state)")
    assert s["resume"]["optimizer"] == "kept" and s["resume"]["converted"] is True


def test_section_says_how_each_resume_goes():
    plan = _plan({"n3": "gone"})
    same = rc.report_section(plan, "full", "/o/checkpoint-4", False, 2, fmt="example")
    assert same["resume"]["how"] == "as saved (world size 2 unchanged)"
    assert rc.report_section(plan, "full", "/o/checkpoint-4")["resume"]["how"].startswith("as saved (no per-rank")
    none = rc.report_section(plan, "full", "")
    assert none["resume"]["how"] == "no complete checkpoint on n1: the job starts from step 0"
    w = {"key": "adapter_name_or_path", "paths": {"n1": "/o/checkpoint-4", "n2": "/p/checkpoint-4"},
         "detail": "weights only: adapter_name_or_path=/o/checkpoint-4; the optimizer, the scheduler and the step "
                   "counter start fresh"}
    weights = rc.report_section(plan, "weights", "/o/checkpoint-4", weights=w)
    assert weights["resume"] == {"mode": "weights", "how": w["detail"], "optimizer": "fresh", "converted": False,
                                 "key": "adapter_name_or_path", "path": "/o/checkpoint-4"}


# ---- report.md and the health page
def test_markdown_has_the_recover_section():
    plan = _plan({"n1": "ssh: no route to host"}, {"n3": ["nvidia_driver.xid: Xid 79 on GPU 0"]})
    md = report_mod.markdown(_report(_section(plan, "full", "/o/checkpoint-20", True, 3, fmt="deepspeed")))
    rec = md.split("## Recover", 1)[1].split("## All checks", 1)[0]
    assert "World size 3 -> 1; head n2 (moved from n1)." in rec
    assert "| n1 | 0 | unreachable | ssh: no route to host |" in rec
    assert "| n3 | 2 | failed preflight: nvidia_driver.xid | nvidia_driver.xid: Xid 79 on GPU 0 |" in rec
    assert "| n2 (head) | 0 | 1 |" in rec
    assert "- checkpoint: `/o/checkpoint-20`" in rec and "- resume: full: universal conversion from world size 3" in rec
    assert "optimizer starts fresh" not in rec
    # a plain preflight report has no such section
    assert "## Recover" not in report_mod.markdown(report_mod.build_report({}, HOSTS))


def test_markdown_says_the_optimizer_starts_fresh_for_weights_only():
    plan = _plan({"n3": "gone"})
    w = rc.weights_resume("llamafactory", "lora", "checkpoint-4", _listings(["n1", "n2"], adapter=True),
                          ["n1", "n2"], {"n1": "/o", "n2": "/o"})
    md = report_mod.markdown(_report(_section(plan, "weights", "/o/checkpoint-4", weights=w)))
    assert "- resume: weights: weights only: adapter_name_or_path=/o/checkpoint-4; the optimizer" in md
    assert "- the optimizer starts fresh (weights only, chosen with launch_recover_resume=weights)" in md


class _Tree(HTMLParser):
    """Elements with an id or data-host inside section#recover: (tag, attrs, text)."""

    def __init__(self):
        super().__init__()
        self.depth, self.inside, self.rows, self.text = 0, False, [], []
        self.section = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and attrs.get("id") == "recover":
            self.inside, self.section = True, attrs
        if self.inside and (tag == "tr" and "data-host" in attrs or tag == "p" and "id" in attrs):
            self.rows.append([tag, attrs, ""])

    def handle_endtag(self, tag):
        if tag == "section":
            self.inside = False

    def handle_data(self, data):
        if self.inside and self.rows:
            self.rows[-1][2] += data


def test_health_page_has_the_recover_section():
    plan = _plan({"n1": "ssh: <no route> to host"}, {"n3": ["nvidia_driver.xid: Xid 79 on GPU 0"]})
    html = page.render(_report(_section(plan, "full", "/o/checkpoint-20", True, 3, fmt="deepspeed")))
    t = _Tree()
    t.feed(html)
    assert t.section["data-world-before"] == "3" and t.section["data-world"] == "1"
    assert t.section["data-head"] == "n2" and t.section["data-head-moved"] == "true"
    rows = {(a.get("data-why") and "dropped" or "rank", a["data-host"]): (a, " ".join(x.split())) for tag, a, x in t.rows
            if tag == "tr"}
    assert "ssh: <no route> to host" in rows[("dropped", "n1")][1] and "&lt;no route&gt;" in html  # escaped
    assert rows[("dropped", "n1")][0]["data-why"] == "unreachable"
    assert rows[("dropped", "n3")][0]["data-why"] == "preflight" and "failed preflight: nvidia_driver.xid" in \
        rows[("dropped", "n3")][1]
    assert rows[("rank", "n2")][0] == {"data-host": "n2", "data-rank": "0", "data-head": "true"}
    assert "n2 (head)" in rows[("rank", "n2")][1]
    resume = next(a for tag, a, _ in t.rows if a.get("id") == "recover-resume")
    assert resume["data-mode"] == "full" and resume["data-optimizer"] == "kept"
    assert "moved from n1" in html
    # the unreachable node is also in the page's failures, as in every preflight report
    assert 'data-host="n1" data-check="host.reachable"' in html
    assert 'id="recover"' not in page.render(report_mod.build_report({}, HOSTS))


# ---- weights-only resume: what each survivor loads
def _listings(hosts, name="checkpoint-4", **weights):
    return {h: {"name": name, "checkpoint": "/o/" + name, "shards": {"weights": dict(weights)}} for h in hosts}


def test_weights_resume_lora_full_generic_and_a_survivor_without_them():
    roots = {"n1": "/o", "n2": "/p/"}
    lora = rc.weights_resume("llamafactory", "lora", "checkpoint-4", _listings(["n1", "n2"], adapter=True),
                             ["n1", "n2"], roots)
    assert lora["key"] == "adapter_name_or_path"
    assert lora["paths"] == {"n1": "/o/checkpoint-4", "n2": "/p/checkpoint-4"}
    assert "optimizer, the scheduler and the step counter start fresh" in lora["detail"]
    full = rc.weights_resume("llamafactory", "full", "checkpoint-4", _listings(["n1", "n2"], model=True),
                             ["n1", "n2"], roots)
    assert full["key"] == "model_name_or_path"
    gen = rc.weights_resume("generic", "lora", "checkpoint-4", {}, ["n1", "n2"], roots)
    assert gen["key"] == "" and "TRAINYARD_RESUME_MODE=weights" in gen["detail"]
    listings = _listings(["n1"], adapter=True)
    listings["n2"] = {"name": "checkpoint-4", "checkpoint": "/p/checkpoint-4", "shards": {"weights": {"adapter": False}}}
    with pytest.raises(rc.RecoverError) as e:
        rc.weights_resume("llamafactory", "lora", "checkpoint-4", listings, ["n1", "n2"], roots)
    assert str(e.value).startswith("Cannot resume weights-only from checkpoint-4: n2 (/p/checkpoint-4) hold(s) no adapter")
    assert "train_args_save_on_each_node: true" in str(e.value) and "launch_recover_resume: full" in str(e.value)
    with pytest.raises(rc.RecoverError, match="deepspeed_config_gather_16bit_weights_on_model_save: true"):
        rc.weights_resume("llamafactory", "full", "checkpoint-4", _listings(["n1", "n2"], adapter=True),
                          ["n1", "n2"], roots)
    # the filter hands the failure to an assert instead of raising
    bad = flt.recover_weights(listings, "llamafactory", "lora", "checkpoint-4", ["n1", "n2"], roots)
    assert bad["failed"] and bad["msg"].startswith("Cannot resume weights-only")


def test_list_shards_finds_the_weights_of_a_real_lora_checkpoint(tmp_path):
    ckpt = bt.write_checkpoint(tmp_path, 4)
    got = rc.list_shards(str(ckpt))["weights"]
    assert got == {"adapter": True, "model": False, "optimizer": False}
    # a planted link is not the adapter
    (ckpt / "adapter_model.safetensors").unlink()
    (ckpt / "adapter_model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    assert rc.list_shards(str(ckpt))["weights"]["adapter"] is False


# ---- the refusal: no optimizer state and no explicit weights-only choice
def _save_only_model(tmp_path):
    """A real LoRA checkpoint saved with save_only_model: the fixture's layout without global_stepN/ and latest."""
    ckpt = bt.write_checkpoint(tmp_path / "out", 4)
    shutil.rmtree(ckpt / "global_step4")
    (ckpt / "latest").unlink()
    return ckpt


def test_full_resume_of_a_checkpoint_without_optimizer_state_is_refused_naming_the_variable(tmp_path):
    ckpt = _save_only_model(tmp_path)
    listing = {"checkpoint": str(ckpt), "name": "checkpoint-4", "shards": rc.list_shards(str(ckpt))}
    msg = rc.full_resume_problem("llamafactory", listing)
    assert msg.startswith(f"Cannot resume {ckpt} with its optimizer state: it holds none")
    assert msg.endswith("Fix: resume from its weights alone, explicitly: -e launch_recover_resume=weights "
                        "(the optimizer starts fresh)")
    assert "\n" not in msg
    # resumable: ZeRO shards, or the Trainer's optimizer.pt; the generic entry point decides itself
    full = bt.write_checkpoint(tmp_path / "full", 4)
    assert rc.full_resume_problem("llamafactory", {"checkpoint": str(full), "shards": rc.list_shards(str(full))}) == ""
    (ckpt / "optimizer.pt").write_bytes(b"x")
    assert rc.full_resume_problem("llamafactory", {"checkpoint": str(ckpt), "shards": rc.list_shards(str(ckpt))}) == ""
    (ckpt / "optimizer.pt").unlink()
    assert rc.full_resume_problem("generic", listing) == ""
    assert rc.full_resume_problem("llamafactory", {"checkpoint": "", "shards": {}}) == ""


# ---- the LLaMA-Factory config rendered by the real train_args role for a weights-only resume
LLAMAFACTORY = {"train_args_profile": "llamafactory", "train_args_model_name_or_path": "/srv/shared/models/llama",
                "train_args_dataset": "alpaca_en", "train_args_template": "default",
                "train_args_extra": ["seed=42", "resume_from_checkpoint=/srv/outputs/checkpoint-2"]}


@pytest.mark.parametrize("ftype,key", [("lora", "adapter_name_or_path"), ("full", "model_name_or_path")])
def test_weights_only_llamafactory_config_loads_the_checkpoint_and_does_not_resume(tmp_path, ftype, key):
    ckpt = bt.write_checkpoint(tmp_path / "outputs", 4)
    c = LocalCluster(tmp_path, nodes=2)
    p = c.run(roles=["deepspeed_config", "train_args"], extra=dict(
        LLAMAFACTORY, train_args_finetuning_type=ftype, deepspeed_config_finetuning_type=ftype,
        train_args_weights_from=str(ckpt)))
    assert p.returncode == 0, p.stdout[-3000:]
    for h in c.hosts:
        cfg = yaml.safe_load(c.path(h, "llamafactory.yaml").read_text())
        assert cfg[key] == str(ckpt) and cfg["overwrite_output_dir"] is True
        assert "resume_from_checkpoint" not in cfg
        if ftype == "lora":
            assert cfg["model_name_or_path"] == "/srv/shared/models/llama"
        else:
            assert "adapter_name_or_path" not in cfg
        facts = p.report[h]
        assert facts["train_args_resume_arg"] == ""  # the launch role passes no resume_from_checkpoint=
        assert facts["train_args_argv"] == [str(c.path(h, "llamafactory.yaml")), "seed=42"]
    valid = c.records(p, "train_args.llamafactory_config")["n1" if "n1" in c.hosts else c.hosts[0]]
    assert valid["status"] == "pass" and "accepted by LLaMA-Factory" in valid["detail"], valid
    # without it: the resume path reaches LLaMA-Factory, nothing is loaded from the checkpoint
    p = c.run(roles=["deepspeed_config", "train_args"], extra=dict(LLAMAFACTORY, train_args_finetuning_type=ftype,
                                                                   deepspeed_config_finetuning_type=ftype))
    assert p.returncode == 0, p.stdout[-3000:]
    cfg = yaml.safe_load(c.path(c.hosts[0], "llamafactory.yaml").read_text())
    assert "overwrite_output_dir" not in cfg and "adapter_name_or_path" not in cfg
    assert cfg["model_name_or_path"] == "/srv/shared/models/llama"
    assert p.report[c.hosts[0]]["train_args_resume_arg"] == "resume_from_checkpoint="
    assert json.dumps(p.report[c.hosts[0]]["train_args_argv"]).count("resume_from_checkpoint=") == 1


# ---- recover's own tasks (roles/recover/tasks/recover_convert.yml) on two local nodes with real checkpoint trees
_PLAY = """
- hosts: trainers
  gather_facts: false
  tasks:
    - checkpoint_shards: {output_root: "{{ cluster_output_root }}", checkpoint: checkpoint-4}
      register: launch_recover_shards
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.set_fact:
        launch_recover_plan: {head: n1, survivors: [n1, n2], world_size: 2, world_size_before: 3,
                              old_rank_map: {n1: 0, n2: 1, n3: 2}}
        cluster_models: {n1: {nproc_per_node: 1}}
    - ansible.builtin.import_role: {name: trainyard_defaults}
    - ansible.builtin.import_role: {name: recover, tasks_from: recover_convert.yml}
    - ansible.builtin.copy:
        dest: "{{ out }}"
        mode: "0644"
        content: "{{ {'n1': hostvars.n1.train_args_weights_from, 'n2': hostvars.n2.train_args_weights_from,
                      'env': hostvars.n2.launch_env} | to_json }}"
"""


def _recover_convert(tmp_path, mode, profile="llamafactory", ftype="lora", strip=None):
    import os
    import subprocess
    import sys

    from helpers import BIN, REPO
    hosts = {}
    for h in ("n1", "n2"):
        ckpt = bt.write_checkpoint(tmp_path / h, 4)
        if strip and h in strip:
            for rel in strip[h]:
                p = ckpt / rel
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        hosts[h] = {"cluster_output_root": str(tmp_path / h), "train_args_profile": profile,
                    "train_args_finetuning_type": ftype, "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable}
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"trainers": {"hosts": hosts}}}}))
    (tmp_path / "play.yml").write_text(_PLAY)
    out = tmp_path / "out.json"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    p = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(tmp_path / "play.yml"),
                        "-e", json.dumps({"out": str(out), "launch_recover_resume": mode})],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return p, (json.loads(out.read_text()) if out.exists() else None)


def test_recover_sets_weights_from_on_every_survivor_and_says_the_optimizer_starts_fresh(tmp_path):
    p, got = _recover_convert(tmp_path, "weights")
    assert p.returncode == 0, p.stdout[-3000:]
    assert got["n1"] == f"{tmp_path}/n1/checkpoint-4" and got["n2"] == f"{tmp_path}/n2/checkpoint-4"
    assert got["env"]["TRAINYARD_RESUME_MODE"] == "weights"
    assert ("weights only: adapter_name_or_path=%s/n1/checkpoint-4; the optimizer, the scheduler and the step counter "
            "start fresh" % tmp_path) in p.stdout


def test_recover_refuses_weights_only_when_a_survivor_lacks_the_adapter(tmp_path):
    p, got = _recover_convert(tmp_path, "weights", strip={"n2": ["adapter_model.safetensors"]})
    assert p.returncode != 0 and got is None
    assert f"Cannot resume weights-only from checkpoint-4: n2 ({tmp_path}/n2/checkpoint-4) hold(s) no adapter" in p.stdout


def test_recover_refuses_a_full_resume_without_optimizer_state_naming_the_variable(tmp_path):
    gone = ["global_step4", "latest"]
    p, got = _recover_convert(tmp_path, "full", strip={"n1": gone, "n2": gone})
    assert p.returncode != 0 and got is None, p.stdout[-3000:]
    assert f"Cannot resume {tmp_path}/n1/checkpoint-4 with its optimizer state: it holds none" in p.stdout
    assert "-e launch_recover_resume=weights" in p.stdout and "Traceback" not in p.stdout
