"""Filters of role train_args: the llamafactory profile's YAML config, built from the role's options."""

from __future__ import annotations

import re

_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def typed(value):
    """A rendered option value as LLaMA-Factory's YAML would hold it: true/false -> bool, numbers -> int/float,
    lists -> comma-joined (lora_target), other strings unchanged."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text


def llamafactory_config(options: dict, extra: dict | None = None) -> dict:
    """{'--key': value} options (null or '' left out) -> LLaMA-Factory's config {key: typed value}, then `extra`
    ({key: value}, taken as given) on top."""
    config = {}
    for key, value in (options or {}).items():
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        config[str(key).lstrip("-")] = typed(value)
    for key, value in (extra or {}).items():
        config[str(key).lstrip("-")] = value
    return config


def llamafactory_weights(config: dict, weights_from: str = "", finetuning_type: str = "lora") -> dict:
    """A weights-only resume: the checkpoint's adapter (LoRA: adapter_name_or_path) or model (full, freeze:
    model_name_or_path), overwrite_output_dir so LLaMA-Factory does not resume the output directory's latest
    checkpoint by itself, and no resume_from_checkpoint. Unchanged without weights_from."""
    path = str(weights_from or "").strip()
    if not path:
        return config
    out = {k: v for k, v in (config or {}).items() if k != "resume_from_checkpoint"}
    out["adapter_name_or_path" if finetuning_type == "lora" else "model_name_or_path"] = path
    out["overwrite_output_dir"] = True
    return out


class FilterModule:
    def filters(self):
        return {
            "train_args_llamafactory_config": llamafactory_config,
            "train_args_llamafactory_weights": llamafactory_weights,
        }
