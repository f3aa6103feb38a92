# -*- coding: utf-8 -*-
"""Validate a DeepSpeed configuration on the controller with DeepSpeed's own configuration classes."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deepspeed_validate
short_description: Validate a ds_config.json dict with DeepSpeed's own configuration classes, on the controller
description:
  - Builds C(deepspeed.runtime.config.DeepSpeedConfig) from the dict in a separate Python process on the
    controller (the nodes need nothing), so a mistyped or mistyped-type key inside a section (C(zero_optimization),
    C(bf16), C(offload_optimizer), ...) fails with DeepSpeed's (pydantic's) own message.
  - DeepSpeed ignores top-level keys it does not read; this plugin records which top-level keys
    C(DeepSpeedConfig) reads and reports any other one as unknown, with the nearest key DeepSpeed reads.
  - "C(\"auto\") is accepted only where the chosen integration fills the value at run time (I(auto_filler):
    the Hugging Face Trainer, or Accelerate's DeepSpeedPlugin; plugin_utils/ds_config.py lists the keys of each);
    elsewhere the message names the file and key and which integration would fill it. For validation the filled
    ones are replaced by typed stand-ins."
  - "Results are cached on the controller by the config's hash and the DeepSpeed version (importing DeepSpeed takes
    seconds). Never fails by itself: returns C(ok) and C(errors) so the role can record the check, then stop."
  - "With I(build) (run once: every rank runs with the same config, and the validate play refuses deepspeed_config_*
    values that differ between nodes) it builds the config (plugin_utils/ds_config.py render), failing naming
    C(deepspeed_config_base_file) when that file cannot be read, and validates it in the same task: what the write
    refuses and the records every node records."
options:
  config: {description: The DeepSpeed configuration (one config)., type: dict}
  build:
    description: "One node's config from C({settings, overrides, base_file, base_text, finetuning_type, profile}):
      I(settings) are the deepspeed_config_* variables the config is generated from (plugin_utils/ds_config.py
      generated) and what the product adds to a user's file; or C({generated, wants, ...}) given ready."
    type: dict
  validate: {description: With I(build), whether to run DeepSpeed (false builds only)., type: bool, default: true}
  refuse:
    description: "With I(write): what the write refuses (the run-once call's C(refuse)), each reason put after this
      node's name; nothing is written then."
    type: list
    elements: str
    default: []
  publish: {description: With I(write), facts to set on the node (the file's path)., type: dict, default: {}}
  consistent:
    description: "C({written, majority, path}): this node's job_files answer for ds_config.json, the nodes' majority
      sha256 and the file's path; records C(deepspeed_config.consistent) (pending in check mode while the write would
      change the file). With I(write), C(written) is the write's own answer and may be left out."
    type: dict
  records:
    description: "With I(write): the validation's records (the run-once call's C(records)), recorded on this node
      before the write; when the write refuses or fails they come back as C(preflight_records) for a rescue
      to record."
    type: list
    elements: dict
    default: []
  write:
    description: "C(job_files)' arguments for ds_config.json (C(refuse), C(directories), C(files), C(read),
      C(return_content)): the module runs on the node in this task, and its answer is the task's result, with the
      records; with I(consistent), this node's file is then compared with the
      majority in the same task. One task per node for the records, the write and the comparison."
    type: dict
  allow_unknown_keys:
    description: Top-level keys to accept although DeepSpeedConfig does not read them (another consumer reads them).
    type: list
    elements: str
    default: []
  auto_filler:
    description: Which integration fills C("auto") values at run time.
    type: str
    choices: [trainer, accelerate, none]
    default: trainer
  source:
    description: Where the config came from (the user's file or the variables), for the messages.
    type: str
    default: the config
extends_documentation_fragment: [trainyard.core.attributes.controller, trainyard.core.attributes.python_child]
"""

EXAMPLES = r"""
- name: Validate the DeepSpeed config with DeepSpeed's own classes
  deepspeed_validate:
    config: "{{ _deepspeed_config }}"
  register: __deepspeed_config_validated
  run_once: true
"""

RETURN = r"""
ok:
  description: Whether DeepSpeed accepted the configuration.
  returned: always
  type: bool
errors:
  description: DeepSpeed's messages (and unknown top-level keys with the nearest valid one).
  returned: always
  type: list
  elements: str
deepspeed_version:
  description: The DeepSpeed version that validated it.
  returned: when DeepSpeed could be imported
  type: str
cached:
  description: Whether the result came from the cache.
  returned: always
  type: bool
refuse:
  description: "With I(build): what the task writing the file refuses on every node (the LoRA save flag, DeepSpeed's
    errors)."
  returned: with I(build)
  type: list
  elements: str
records:
  description: "With I(build): the C(deepspeed_config.lora_gather) and C(deepspeed_config.valid) records every node
    records."
  returned: with I(build)
  type: list
  elements: dict
majority:
  description: "With I(build): the sha256 of the file's text, what every node's file is compared with after the write."
  returned: with I(build)
  type: str
write:
  description: "With I(write), when the write failed: the answer of C(job_files). When it succeeded, that answer's keys
    (C(files), C(directories), C(read), C(diff), ...) are the task's own, as if C(job_files) had run alone."
  returned: with I(write), when the write failed
  type: dict
preflight_records:
  description: "With I(write): the records this task recorded (when the write failed, those it could not record: the
    rescue records them)."
  returned: with I(write)
  type: list
"""

import copy
import hashlib
import json
import os
import sys

from ansible_collections.trainyard.core.plugins.plugin_utils import ds_config, python_child
from ansible_collections.trainyard.core.plugins.plugin_utils.did_you_mean import nearest

# Typed stand-ins for "auto" values an integration fills at run time (ds_config.AUTO_FILLED says which
# integration fills which key), keyed by DeepSpeed's canonical path; None: leave the key out (DeepSpeed computes it).
AUTO_STANDIN = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "train_batch_size": None,  # = micro x accumulation x world size; computed by DeepSpeed when absent
    "gradient_clipping": 1.0,
    "optimizer.params.lr": 1e-4,
    "optimizer.params.betas": [0.9, 0.999],
    "optimizer.params.eps": 1e-8,
    "optimizer.params.weight_decay": 0.0,
    "scheduler.params.warmup_min_lr": 0.0,
    "scheduler.params.warmup_max_lr": 1e-4,
    "scheduler.params.warmup_num_steps": 0,
    "scheduler.params.total_num_steps": 1000,
    "fp16.enabled": False,
    "bf16.enabled": True,
    "zero_optimization.reduce_bucket_size": 16777216,
    "zero_optimization.prefetch_bucket_size": 15099494,
    "zero_optimization.param_persistence_threshold": 40960,
    # DeepSpeedPlugin defaults when no ACCELERATE_DEEPSPEED_* variable says otherwise (accelerate utils/dataclasses.py)
    "zero_optimization.stage": 2,
    "zero_optimization.offload_optimizer.device": "none",
    "zero_optimization.offload_param.device": "none",
    "zero_optimization.offload_optimizer.nvme_path": None,
    "zero_optimization.offload_param.nvme_path": None,
    "zero_optimization.gather_16bit_weights_on_model_save": False,
}


def auto_paths(config, prefix=""):
    """Dotted paths of every "auto" value in a nested dict."""
    return ds_config.auto_paths(config, prefix)


def fill_auto(config, filler="trainer", source="the config"):
    """(config with "auto" replaced by typed stand-ins, [errors for "auto" the chosen integration does not fill]).

    fp16 and bf16 both "auto" stand in as bf16 (the integration turns on at most one of them).
    """
    filled = copy.deepcopy(config)
    errors = ds_config.auto_errors(config, filler, source)
    if errors:
        return filled, errors
    for path in auto_paths(config):
        *parents, leaf = path.split(".")
        node = filled
        for p in parents:
            node = node[p]
        standin = AUTO_STANDIN.get(ds_config.canonical_path(path), "auto")
        if standin is None:
            del node[leaf]
        else:
            node[leaf] = standin
    return filled, errors


def _validate_in_process(config, allow_unknown_keys):
    """Run DeepSpeedConfig on `config` (already without "auto"); returns {ok, errors, deepspeed_version}."""
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    import logging

    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    seen = set()

    class Recorder(dict):
        """The top-level dict; remembers which keys DeepSpeedConfig looks up."""

        def __getitem__(self, key):
            seen.add(key)
            return super().__getitem__(key)

        def get(self, key, default=None):
            seen.add(key)
            return super().get(key, default)

        def __contains__(self, key):
            seen.add(key)
            return super().__contains__(key)

    errors = []
    try:
        DeepSpeedConfig(Recorder(config))
    except Exception as exc:  # DeepSpeed raises pydantic ValidationError, AssertionError, ValueError, ...
        errors.append(f"DeepSpeed {deepspeed.__version__} rejects the config: {type(exc).__name__}: {exc}")
    else:
        for key in config:
            if key not in seen and key not in allow_unknown_keys:
                near = nearest(key, seen)
                hint = f"; did you mean {near}?" if near else ""
                errors.append(f"{key}: DeepSpeed {deepspeed.__version__} does not read this top-level key{hint}")
    return {"ok": not errors, "errors": errors, "deepspeed_version": deepspeed.__version__}


def _child_main():
    """`python deepspeed_validate.py` reads {config, allow_unknown_keys} on stdin and prints the result as JSON."""
    python_child.child_main(
        lambda request: _validate_in_process(request["config"], set(request.get("allow_unknown_keys") or [])),
        lambda exc: f"cannot import deepspeed on the controller ({exc}): install requirements-ml.txt into the "
                    f"controller venv (make venv), or set deepspeed_config_validate: false")


def validate(config, allow_unknown_keys=(), python=None, cache_dir="", timeout=180, auto_filler="trainer",
             source="the config"):
    """Controller side: "auto" checks here, DeepSpeed in a child process, results cached by hash."""
    python = python or sys.executable
    filled, errors = fill_auto(config, auto_filler, source)
    if errors:
        return {"ok": False, "errors": errors, "cached": False}
    env = python_child.child_env()
    env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    version = python_child.dist_version(python, "deepspeed") or "none"
    result = python_child.run_cached(
        python, os.path.abspath(__file__), {"config": filled, "allow_unknown_keys": list(allow_unknown_keys)},
        [filled, sorted(allow_unknown_keys), version], cache_dir=cache_dir, timeout=timeout, env=env,
        what="DeepSpeed", version_key="deepspeed_version")
    return _named(result, source)


def _named(result, source):
    """DeepSpeed's messages, each prefixed with where the config came from (the user's file or the variables)."""
    if source and source != "the config":
        result["errors"] = [e if e.startswith(source) else f"{source}: {e}" for e in result.get("errors") or []]
    return result


if __name__ == "__main__":
    sys.exit(_child_main())

# After the child entry point: the child needs no Ansible.
from ansible.errors import AnsibleActionFail  # noqa: E402
from ansible.module_utils.parsing.convert_bool import boolean  # noqa: E402
from ansible_collections.trainyard.core.plugins.plugin_utils import bases, render_checks  # noqa: E402


def refusals(lora, verdict, enabled=True):
    """What the task writing ds_config.json refuses (on every node: the write puts the node's name first): LoRA under
    ZeRO-3 saving an empty adapter, or a config DeepSpeed rejected (when validation is on)."""
    out = [f"{lora['detail']}; remove {lora['variable']} or set it to true."] if lora["status"] == "fail" else []
    if enabled and not verdict["ok"]:
        out.append("; ".join(verdict["errors"]))
    return out


def validated(built, run=None, enabled=True, auto_filler="trainer"):
    """The built config validated once (run(config) with the task's options; none when validation is off): {ok,
    errors, refuse: [what the write refuses], records: [what every node records], majority: the text's sha256,
    deepspeed_version, configs_validated}. One config for the cluster: the validate play refuses deepspeed_config_*
    values that differ between nodes (plugin_utils/cluster_model.py one_per_cluster)."""
    verdict = run(json.loads(built["content"])) if enabled else {"ok": True, "errors": []}
    version = verdict.get("deepspeed_version") or ""
    return {"ok": verdict["ok"], "errors": verdict["errors"], "refuse": refusals(built["lora"], verdict, enabled),
            "records": render_checks.deepspeed_records(built, verdict if enabled else None, version, auto_filler),
            "majority": hashlib.sha256(built["content"].encode("utf-8")).hexdigest(), "deepspeed_version": version,
            "configs_validated": int(enabled)}


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        if args.get("write") is not None:
            return self.write(args, task_vars)
        if args.get("consistent") is not None:
            c = bases.need_dict(args["consistent"], "deepspeed_validate: 'consistent'")
            return self.record(task_vars, render_checks.deepspeed_consistent_record(
                c.get("written") or {}, str(c.get("majority") or ""), str(c.get("path") or "")))
        if args.get("build") is not None:
            b = bases.need_dict(args["build"], "deepspeed_validate: 'build'")
            settings = b.get("settings")
            if settings is not None:  # the generated config and what the product adds to a user's file
                settings = bases.need_dict(settings, "deepspeed_validate: 'build.settings'")
                b = dict(b, generated={} if b.get("base_file") else ds_config.generated(settings), wants={
                    "bf16": settings.get("bf16"), "fp16": settings.get("fp16"),
                    "finetuning_type": b.get("finetuning_type"),
                    "gather_16bit": boolean(settings.get("gather_16bit"), strict=False),
                    "node_local": boolean(settings.get("node_local"), strict=False),
                    "moe_leaf_classes": settings.get("moe_leaf_classes") if settings.get("moe") else []})
            try:
                built = ds_config.render(b.get("generated") or {}, b.get("overrides") or {},
                                         str(b.get("base_file") or ""), b.get("base_text") or "", b.get("wants") or {},
                                         str(b.get("finetuning_type") or ""), str(b.get("profile") or ""))
            except ValueError as exc:
                return dict(failed=True, msg=(
                    f"{task_vars.get('inventory_hostname')}: deepspeed_config_base_file: {exc}; give the path of a "
                    "DeepSpeed JSON config on the controller (relative paths are looked up under the playbook's "
                    "files/), or leave deepspeed_config_base_file empty to build the config from the "
                    "deepspeed_config_* variables."))
            return dict(built, **validated(built, self.validator(args), boolean(args.get("validate", True)),
                                           self.filler(args)))
        return self.validator(args)(bases.need_dict(args.get("config"), "deepspeed_validate: 'config'"))

    @staticmethod
    def filler(args):
        filler = args.get("auto_filler") or "trainer"
        if filler not in ds_config.AUTO_FILLED:
            raise AnsibleActionFail(f"deepspeed_config_auto_filler is {filler!r}; use trainer, accelerate or none")
        return filler

    def validator(self, args):
        """validate(config) with the task's options."""
        filler = self.filler(args)

        def run(config):
            return validate(config, bases.str_list(args.get("allow_unknown_keys")), python=args.get("python"),
                            cache_dir=args.get("cache_dir", "~/.cache/trainyard/deepspeed-validate"),
                            timeout=int(args.get("timeout", 180)), auto_filler=filler,
                            source=args.get("source") or "the config")
        return run

    def write(self, args, task_vars):
        """The validation's records, the write of ds_config.json by job_files on the node (it refuses what the records
        failed: nothing is written then) and, with 'consistent', the file against the majority, in one task. A failed
        task sets no fact: the records come back as preflight_records for the rescue to record."""
        records = list(args.get("records") or [])
        if not all(isinstance(r, dict) for r in records):
            raise AnsibleActionFail("deepspeed_validate: 'records' must be a list of records (the run-once call's "
                                    "records[inventory_hostname])")
        module_args = dict(bases.need_dict(args["write"], "deepspeed_validate: 'write'", " (job_files' arguments)"))
        host = task_vars.get("inventory_hostname")
        module_args["refuse"] = [f"{host}: {r}" for r in bases.str_list(args.get("refuse"))] + \
            bases.str_list(module_args.get("refuse"))
        written = self._execute_module(module_name="job_files", module_args=module_args, task_vars=task_vars)
        written.pop("invocation", None)
        if written.get("failed"):
            return dict(failed=True, msg=written.get("msg", "job_files failed"), write=written,
                        preflight_records=records)
        consistent = args.get("consistent")
        if consistent is not None:
            c = bases.need_dict(consistent, "deepspeed_validate: 'consistent'")
            records.append(render_checks.deepspeed_consistent_record(
                written, str(c.get("majority") or ""), str(c.get("path") or ""), write_task=self._task.get_name()))
        out = self.record(task_vars, *records)
        out.update({k: v for k, v in written.items() if k != "ansible_facts"}, changed=bool(written.get("changed")))
        out["ansible_facts"] = dict(out.get("ansible_facts") or {},
                                    **bases.need_dict(args.get("publish") or {}, "deepspeed_validate: 'publish'"))
        return out
