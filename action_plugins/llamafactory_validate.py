# -*- coding: utf-8 -*-
"""Validate a LLaMA-Factory training config on the controller with LLaMA-Factory's own argument parser."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llamafactory_validate
short_description: Validate a LLaMA-Factory training config with LLaMA-Factory's own parser, on the controller
description:
  - "Runs C(llamafactory.hparams.get_train_args) on the config (with the C(key=value) overrides the job gets, merged
    the way C(llamafactory.launcher) merges them with OmegaConf) in a separate Python process on the controller:
    C(HfArgumentParser) over LLaMA-Factory's dataclasses (model, data, training, finetuning, generating
    arguments), then LLaMA-Factory's own checks. A misspelt key fails here with the nearest valid key, before any
    node is changed."
  - The controller has no GPU and is not the job. For the parse only, C(deepspeed) is pointed at a temporary copy
    of the rendered DeepSpeed config, C(use_cpu) is set when the controller has no CUDA device (Hugging Face checks
    bf16 support against the local hardware), and a one-process rendezvous on 127.0.0.1 stands in for torchrun
    (LLaMA-Factory refuses DeepSpeed outside torchrun). C(HF_HUB_OFFLINE=1); nothing is downloaded.
  - "LLaMA-Factory and its pinned dependencies come from C(pythonpath) (C(make venv) installs
    C(requirements-llamafactory.txt) there without dependencies: its metadata requires torchaudio and torchvision
    builds of the torch it runs with, and none exists for the controller's CPU torch)."
  - "Results are cached on the controller by the config's hash and the LLaMA-Factory version; the nodes' tasks
    wait for one another, so each distinct config is validated once. Never fails by itself: returns C(ok) and
    C(errors) so the role can record the check, then stop."
  - "With I(profile) (role train_args, one task per node) it records C(train_args.llamafactory_config) (profile
    C(llamafactory); skip when I(validate) is false) and C(train_args.entrypoint) (looked for on the node with one
    C(job_files) call; train_args_records says each status), and sets the launch role's facts (launch_facts:
    C(train_args_entrypoint), C(train_args_argv), C(train_args_torchrun_args), C(train_args_resume_arg)). It returns C(content), the LLaMA-Factory config's YAML text, and C(refuse), what the task writing it
    refuses."
options:
  config:
    description: The LLaMA-Factory config (what C(llamafactory.launcher) reads from the YAML file).
    type: dict
  overrides:
    description: C(key=value) arguments given after the YAML path (OmegaConf dotlist).
    type: list
    elements: str
    default: []
  deepspeed_config:
    description: The rendered DeepSpeed config the C(deepspeed) key points at on the nodes.
    type: dict
    default: {}
  profile: {description: The train_args profile; given, the action records the role's checks., type: str}
  validate: {description: With I(profile) C(llamafactory), whether to run LLaMA-Factory., type: bool, default: true}
  entrypoint: {description: The entry point to look for on the node., type: str}
  example: {description: Where the launch role copies its bundled example (absent there yet is a skip)., type: str}
  argv: {description: The entry point's arguments (the record's data)., type: list, elements: str}
  fix: {description: "The fixes of the records: C({entrypoint: ..., llamafactory_config: ...}).", type: dict}
  config_file: {description: The LLaMA-Factory config's path on the nodes (the record's data)., type: str}
  timeouts:
    description: "With I(profile), the job's collective timeout and its ceiling, for the C(train_args.timeout) record:
      C({collective: nccl_env_collective_timeout_s, max: nccl_env_collective_timeout_max_s, above_max:
      nccl_env_collective_timeout_above_max}); a ddp_timeout above the ceiling without above_max is refused."
    type: dict
  weights_from:
    description: With I(profile), a weights-only resume (C(train_args_weights_from)); the resume path then reaches the
      job by no argument.
    type: str
    default: ""
  pythonpath:
    description: Directory holding llamafactory and its pinned dependencies (prepended to PYTHONPATH).
    type: str
    default: ""
extends_documentation_fragment: [trainyard.core.attributes.controller, trainyard.core.attributes.python_child]
"""

EXAMPLES = r"""
- name: Validate the LLaMA-Factory config with LLaMA-Factory's own parser
  llamafactory_validate:
    config: "{{ _train_args_llamafactory_config }}"
    deepspeed_config: "{{ __deepspeed_config_built.config }}"
    pythonpath: "{{ train_args_validate_pythonpath }}"
  register: __train_args_validated
  run_once: true
"""

RETURN = r"""
content:
  description: With I(profile) C(llamafactory), the config file's YAML text (empty for another profile).
  returned: with I(profile)
  type: str
refuse:
  description: With I(profile), what the task writing the config refuses (the host and LLaMA-Factory's messages), or none.
  returned: with I(profile)
  type: list
  elements: str
ok:
  description: Whether LLaMA-Factory accepted the config.
  returned: always
  type: bool
errors:
  description: LLaMA-Factory's (HfArgumentParser's) messages, unknown keys with the nearest valid one.
  returned: always
  type: list
  elements: str
llamafactory_version:
  description: The LLaMA-Factory version that validated it.
  returned: when LLaMA-Factory could be imported
  type: str
cached:
  description: Whether the result came from the cache.
  returned: always
  type: bool
"""

import json
import os
import socket
import sys
import tempfile

from ansible_collections.trainyard.core.plugins.plugin_utils import python_child
from ansible_collections.trainyard.core.plugins.plugin_utils.did_you_mean import nearest


def merge_overrides(config, overrides):
    """The config with `key=value` overrides applied as LLaMA-Factory's launcher does (OmegaConf.from_cli)."""
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.create(config), OmegaConf.from_cli(list(overrides)))
    return OmegaConf.to_container(merged)


def as_argv(config):
    """The config as command-line arguments, so HfArgumentParser converts and checks every value's type (a YAML
    dict is passed through unconverted, and a wrong type would only fail in the middle of the job)."""
    argv = []
    for key, value in config.items():
        if value is None:
            continue
        if isinstance(value, bool):
            argv += [f"--{key}", str(value).lower()]
        elif isinstance(value, (list, tuple)):
            argv += [f"--{key}", *[str(v) for v in value]]
        elif isinstance(value, dict):
            argv += [f"--{key}", json.dumps(value)]
        else:
            argv += [f"--{key}", str(value)]
    return argv


def known_keys():
    """Every key LLaMA-Factory's training parser accepts."""
    import dataclasses

    from llamafactory.hparams.parser import _TRAIN_ARGS

    return sorted({f.name for cls in _TRAIN_ARGS for f in dataclasses.fields(cls) if f.init})


def _validate_in_process(config, overrides, deepspeed_config):
    """get_train_args on the config; {ok, errors, llamafactory_version}."""
    import importlib.metadata as md

    version = md.version("llamafactory")
    try:
        merged = merge_overrides(config, overrides)
    except Exception as exc:  # OmegaConf's grammar errors
        return {"ok": False, "errors": [f"the key=value overrides do not parse: {type(exc).__name__}: {exc}"],
                "llamafactory_version": version}
    keys = known_keys()
    unknown = [k for k in merged if k not in keys]
    if unknown:
        errors = []
        for key in unknown:
            near = nearest(key, keys)
            errors.append(f"{key}: LLaMA-Factory {version} has no such argument"
                          + (f"; did you mean {near}?" if near else ""))
        return {"ok": False, "errors": errors, "llamafactory_version": version}
    import torch

    with tempfile.TemporaryDirectory(prefix="trainyard-lf-") as tmp:
        parsed = dict(merged)
        if parsed.get("deepspeed"):
            path = os.path.join(tmp, "ds_config.json")
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(deepspeed_config or {}, fh)
            parsed["deepspeed"] = path
        if not torch.cuda.is_available():
            parsed["use_cpu"] = True
        from llamafactory.hparams import get_train_args

        import contextlib
        import io

        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                get_train_args(as_argv(parsed))
        except SystemExit as exc:  # argparse: a value of the wrong type ("error: argument --x: invalid ...")
            why = [ln.split("error: ", 1)[1] for ln in said.getvalue().splitlines() if "error: " in ln]
            return {"ok": False, "errors": [f"LLaMA-Factory {version} rejects the config: "
                                            f"{why[-1] if why else 'exit %s' % exc.code}"],
                    "llamafactory_version": version}
        except Exception as exc:  # HfArgumentParser and LLaMA-Factory raise ValueError, TypeError, ...
            return {"ok": False, "errors": [f"LLaMA-Factory {version} rejects the config: {type(exc).__name__}: "
                                            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"],
                    "llamafactory_version": version}
    return {"ok": True, "errors": [], "llamafactory_version": version}


def _child_main():
    """`python llamafactory_validate.py` reads {config, overrides, deepspeed_config} on stdin, prints JSON."""
    python_child.child_main(
        lambda request: _validate_in_process(request["config"], request.get("overrides") or [],
                                             request.get("deepspeed_config") or {}),
        lambda exc: f"cannot import llamafactory on the controller ({exc}): run make venv (it installs "
                    f"requirements-llamafactory.txt into train_args_validate_pythonpath), or set "
                    f"train_args_validate: false")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def validate(config, overrides=(), deepspeed_config=None, python=None, pythonpath="", cache_dir="", timeout=300):
    """Controller side: LLaMA-Factory in a child process, results cached by hash."""
    python = python or sys.executable
    env = python_child.child_env(pythonpath)
    version = python_child.dist_version(python, "llamafactory", env)
    if not version:
        return {"ok": False, "cached": False, "errors": [
            f"llamafactory is not importable on the controller by {python}"
            + (f" with {pythonpath} on PYTHONPATH" if pythonpath else "")
            + ": run make venv (it installs requirements-llamafactory.txt there), or set train_args_validate: false"]}
    # A one-process torchrun environment: LLaMA-Factory refuses DeepSpeed outside torchrun.
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", DISABLE_VERSION_CHECK="1", RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               CUDA_VISIBLE_DEVICES="", TOKENIZERS_PARALLELISM="false")
    return python_child.run_cached(
        python, os.path.abspath(__file__),
        {"config": config, "overrides": list(overrides), "deepspeed_config": deepspeed_config or {}},
        [config, list(overrides), deepspeed_config, version], cache_dir=cache_dir, timeout=timeout, env=env,
        what="LLaMA-Factory", version_key="llamafactory_version")


if __name__ == "__main__":
    sys.exit(_child_main())

def train_args_records(profile, verdict, entrypoint, found, example, argv, fix, keys=0, overrides=0,
                       config_file=""):
    """The records of role train_args: llamafactory_config (profile llamafactory; verdict None: validation off) and
    entrypoint (found: whether the node has the entry point; None for llamafactory, whose entry point is a module)."""
    out = []
    if profile == "llamafactory":
        out.append({"check": "train_args.llamafactory_config", "fix": fix.get("llamafactory_config", ""),
                    "status": "skip" if verdict is None else "pass" if verdict["ok"] else "fail",
                    "detail": "train_args_validate is false" if verdict is None else
                    f"accepted by LLaMA-Factory {verdict.get('llamafactory_version')} ({keys} keys, {overrides} "
                    f"overrides)" if verdict["ok"] else "; ".join(verdict["errors"]),
                    "data": {"config_file": config_file}})
        status, seen = "skip", "is a Python module of the training image (torchrun --module), not a file on the node"
    else:
        status, seen = (("pass", "present") if found else ("skip", "not there yet (the launch role copies its example "
                        "there)") if entrypoint == example else ("warn", "not on the node yet"))
    out.append({"check": "train_args.entrypoint", "status": status, "fix": fix.get("entrypoint", ""),
                "detail": f"{entrypoint} {seen}; {len(argv)} arguments ({profile})", "data": {"argv": list(argv)}})
    return out


def effective_timeout(config, overrides):
    """The ddp_timeout LLaMA-Factory will use: the last ddp_timeout=N override after the config, else the config's;
    None when neither gives a whole number."""
    value = (config or {}).get("ddp_timeout")
    for entry in overrides or ():
        key, sep, text = str(entry).partition("=")
        if sep and key.strip() == "ddp_timeout":
            value = text.strip()
    try:
        return int(str(value).strip()) if value is not None and not isinstance(value, bool) else None
    except ValueError:
        return None


def timeout_record(profile, config, overrides, limits):
    """train_args.timeout: the job's collective timeout against the one timeout and its ceiling (limits:
    {collective, max, above_max}: nccl_env_collective_timeout_s, _max_s and _above_max)."""
    collective, ceiling = int(limits.get("collective") or 0), int(limits.get("max") or 0)
    record = {"check": "train_args.timeout", "data": {"collective_timeout_s": collective, "max_s": ceiling}}
    if profile != "llamafactory":
        return dict(record, status="skip", fix="", detail=f"the entry point reads TRAINYARD_COLLECTIVE_TIMEOUT_S "
                    f"({collective} s, nccl_env_collective_timeout_s); nothing of the profile sets another")
    seconds = effective_timeout(config, overrides)
    record["data"]["ddp_timeout_s"] = seconds
    fix = (f"Give the job one collective timeout, nccl_env_collective_timeout_s, at most "
           f"nccl_env_collective_timeout_max_s ({ceiling} s): drop ddp_timeout from train_args_llamafactory_options "
           f"and train_args_extra")
    if seconds is None:
        return dict(record, status="warn", fix=fix, detail="the LLaMA-Factory config sets no ddp_timeout: the "
                    "Trainer's own default (1800 s) applies, whatever nccl_env_collective_timeout_s says")
    if ceiling and seconds > ceiling:
        if limits.get("above_max"):
            return dict(record, status="warn", fix=fix, detail=f"ddp_timeout {seconds} s is above the ceiling of "
                        f"{ceiling} s, kept by nccl_env_collective_timeout_above_max: a dead rank can hang the job "
                        f"{seconds} s before anything names it")
        return dict(record, status="fail", fix=fix, detail=f"ddp_timeout {seconds} s is above the ceiling of "
                    f"{ceiling} s (nccl_env_collective_timeout_max_s)")
    if seconds != collective:
        return dict(record, status="warn", fix=fix, detail=f"ddp_timeout {seconds} s differs from the job's "
                    f"collective timeout of {collective} s (nccl_env_collective_timeout_s, which DeepSpeed and the "
                    f"NCCL watchdog use)")
    return dict(record, status="pass", fix="", detail=f"ddp_timeout {seconds} s, the job's one collective timeout "
                f"(nccl_env_collective_timeout_s; ceiling {ceiling} s)")


def launch_facts(profile, entrypoint, argv, weights_from=""):
    """The launch role's facts: the entry point and its arguments, the torchrun options before it (the llamafactory
    launcher runs as a module) and the argument the resume path reaches it by (none for a weights-only resume: the
    weights come from train_args_weights_from and the optimizer starts fresh)."""
    lf = profile == "llamafactory"
    return {"train_args_entrypoint": entrypoint, "train_args_argv": list(argv),
            "train_args_torchrun_args": ["--module"] if lf else [],
            "train_args_resume_arg": "resume_from_checkpoint=" if lf and not str(weights_from or "") else ""}


def config_text(config):
    """The LLaMA-Factory config file: a YAML document, keys in the config's order."""
    from ansible.plugins.filter.core import to_nice_yaml

    return "---\n" + to_nice_yaml(config, indent=2, sort_keys=False)


# After the child entry point: the child needs no Ansible.
import glob  # noqa: E402

from ansible.module_utils.parsing.convert_bool import boolean  # noqa: E402

from ansible_collections.trainyard.core.plugins.plugin_utils import bases  # noqa: E402


class ActionModule(bases.ControllerAction):
    _requires_connection = True  # with profile: the entry point is looked for on the node

    def decide(self, args, task_vars):
        profile = args.get("profile")
        if profile is not None and (profile != "llamafactory" or not boolean(args.get("validate", True))):
            verdict = None
        else:
            config = bases.need_dict(args.get("config"), "llamafactory_validate: 'config'")
            verdict = validate(config, [str(o) for o in bases.str_list(args.get("overrides"))],
                               deepspeed_config=args.get("deepspeed_config") or {},
                               python=args.get("python"), pythonpath=args.get("pythonpath") or "",
                               cache_dir=args.get("cache_dir", "~/.cache/trainyard/llamafactory-validate"),
                               timeout=int(args.get("timeout", 300)))
        if profile is None:
            return verdict
        entrypoint, found = str(args.get("entrypoint") or ""), None
        if profile != "llamafactory":
            probe = self._execute_module(module_name="job_files", module_args={"glob": [glob.escape(entrypoint)]},
                                         task_vars=task_vars)
            if probe.get("failed"):
                return dict(failed=True, msg=f"looking for {entrypoint} on the node: {probe.get('msg')}")
            found = bool((probe.get("globbed") or {}).get(glob.escape(entrypoint)))
        records = train_args_records(profile, verdict, entrypoint, found, str(args.get("example") or ""),
                                     bases.str_list(args.get("argv")), args.get("fix") or {},
                                     len(args.get("config") or {}), len(bases.str_list(args.get("overrides"))),
                                     str(args.get("config_file") or ""))
        if args.get("timeouts") is not None:
            records.append(timeout_record(profile, args.get("config") or {}, bases.str_list(args.get("overrides")),
                                          bases.need_dict(args.get("timeouts"), "llamafactory_validate: 'timeouts'")))
        result = self.record(task_vars, *records)
        result["ansible_facts"].update(launch_facts(profile, entrypoint, bases.str_list(args.get("argv")),
                                                    args.get("weights_from") or ""))
        verdict = verdict or {"ok": True, "errors": []}
        refuse = [] if verdict["ok"] else [f"{task_vars.get('inventory_hostname')}: {'; '.join(verdict['errors'])}"]
        refuse += [f"{task_vars.get('inventory_hostname')}: {r['detail']}" for r in records
                   if r["check"] == "train_args.timeout" and r["status"] == "fail"]
        return dict(result, **verdict, refuse=refuse,
                    content=config_text(args.get("config") or {}) if profile == "llamafactory" else "")
