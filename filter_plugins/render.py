# -*- coding: utf-8 -*-
"""Filters of the render play (roles nccl_env, deepspeed_config, train_args). Pure functions, importable by tests."""

from __future__ import annotations

import base64
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils"))
import nccl_vars  # noqa: E402  (module_utils/ of this repository, found through the path above)


def _slurped_text(registered):
    """The text of a registered slurp result, or None when the file could not be read."""
    if not isinstance(registered, dict) or registered.get("failed") or "content" not in registered:
        return None
    return base64.b64decode(registered["content"]).decode("utf-8", errors="replace")


def env_consistency(hosts, hostvars, per_node=nccl_vars.PER_NODE, expected_envs=None,
                    slurp_var="__nccl_env_slurp"):
    """hosts (rank order) → {host: {consistent, missing, digest, reference, reference_hosts, diff}}.

    Reads each host's registered slurp of its env file from hostvars; expected_envs is the list (same order as
    hosts) of each host's rendered env, for the per-node lines.
    """
    hosts = list(hosts)
    files = {h: _slurped_text(hostvars[h].get(slurp_var)) for h in hosts}
    expected = dict(zip(hosts, expected_envs or []))
    return nccl_vars.consistency(files, list(per_node), expected)


def argv(options, extra=None):
    """An argument list from an ordered {"--option": value} dict and the user's extra list.

    None or False leave an option out, True writes the bare flag, lists become comma-joined, everything else
    str(). An option the user's extra list also gives (as --opt or --opt=value) is left to the user's.
    """
    extra = [str(a) for a in (extra or [])]
    given = {a.split("=", 1)[0] for a in extra if a.startswith("-")}
    out: list[str] = []
    for option, value in (options or {}).items():
        if option in given or value is None or value is False:
            continue
        if value is True:
            out.append(option)
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        out.extend([option, str(value)])
    return out + extra


def dict_diff_paths(base, other, prefix=""):
    """Dotted paths where two nested dicts differ (for naming the host whose config differs)."""
    paths: list[str] = []
    if isinstance(base, dict) and isinstance(other, dict):
        for key in sorted(set(base) | set(other), key=str):
            paths += dict_diff_paths(base.get(key, "<absent>"), other.get(key, "<absent>"),
                                     f"{prefix}.{key}" if prefix else str(key))
    elif base != other:
        paths.append(prefix or "<root>")
    return paths


GATHER_KEYS = ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
               "stage3_gather_fp16_weights_on_model_save")
GATHER_VAR = "deepspeed_config_gather_16bit_weights_on_model_save"


def _truthy(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def ds_lora_gather(config, overrides=None, finetuning_type="lora"):
    """Whether a LoRA job's ZeRO-3 config gathers the 16-bit weights on save (else the saved adapter is empty).

    Returns {status: pass|fail|skip, detail, variable}: variable names what turned it off (the user's override
    path, or deepspeed_config_gather_16bit_weights_on_model_save).
    """
    zero = (config or {}).get("zero_optimization") or {}
    if str(finetuning_type).lower() != "lora":
        return {"status": "skip", "variable": "", "detail": f"fine-tuning type {finetuning_type}: not a LoRA job"}
    try:
        stage = int(zero.get("stage", 0))
    except (TypeError, ValueError):
        stage = zero.get("stage")
    if stage != 3:
        return {"status": "skip", "variable": "",
                "detail": f"ZeRO stage {stage}: parameters are not partitioned, nothing to gather on save"}
    over = ((overrides or {}).get("zero_optimization") or {})
    off = [k for k in GATHER_KEYS if k in zero and not _truthy(zero[k])]
    if off or not any(_truthy(zero.get(k)) for k in GATHER_KEYS):
        key = off[0] if off else GATHER_KEYS[0]
        variable = f"deepspeed_config_overrides.zero_optimization.{key}" if key in over else GATHER_VAR
        return {"status": "fail", "variable": variable,
                "detail": f"LoRA under ZeRO-3 with zero_optimization.{key} = false (set by {variable}): "
                          f"the saved adapter would be empty"}
    return {"status": "pass", "variable": "",
            "detail": "LoRA under ZeRO-3: zero_optimization.stage3_gather_16bit_weights_on_model_save is true"}


class FilterModule:
    def filters(self):
        return {
            "trainyard_env_consistency": env_consistency,
            "trainyard_argv": argv,
            "trainyard_dict_diff_paths": dict_diff_paths,
            "trainyard_ds_lora_gather": ds_lora_gather,
        }
