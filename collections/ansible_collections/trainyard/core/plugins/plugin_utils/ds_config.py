# -*- coding: utf-8 -*-
"""DeepSpeed configs the user brings: field aliases, "auto" fillers, and merging the product's additions.

Pure functions, stdlib only, used on the controller by action_plugins/deepspeed_validate.py (building
ds_config.json once per play, and the "auto" rules); unit-tested in tests/unit/actions/test_byo.py against
DeepSpeed's own classes and a corpus of real configs (tests/data/byo/deepspeed/).

Where the tables come from:
- ZERO_ALIASES: DeepSpeed 0.19.8, deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig: every
  ``Field(..., alias="stage3_...")`` and every field whose ``json_schema_extra`` is ``deprecated`` with a
  ``new_param`` (stage3_gather_fp16_weights_on_model_save, cpu_offload, cpu_offload_param). The model sets
  ``populate_by_name``, so DeepSpeed reads both spellings; tests/unit/actions/test_byo.py compares this table
  with the installed DeepSpeed's model fields.
- TOP_ALIASES: deepspeed/runtime/precision_config.py, get_bfloat16_config: ``bf16`` or the older ``bfloat16``.
- AUTO_FILLED["trainer"]: transformers 5.6.0 (the version `make venv` puts in .cache/llamafactory-site),
  integrations/deepspeed.py: every fill_match/fill_only of HfTrainerDeepSpeedConfig.trainer_config_process (batch
  sizes, gradient clipping, optimizer lr/betas/eps/weight_decay, scheduler warmup_min_lr/warmup_max_lr, fp16/bf16)
  and trainer_config_finalize (the three hidden-size based ZeRO sizes, scheduler total_num_steps and
  warmup_num_steps); the Trainer also builds Accelerate's DeepSpeedPlugin(hf_ds_config=...) (training_args.py), whose
  __post_init__ fills the PLUGIN_AUTO keys. transformers 4.x also filled amp.enabled and amp.opt_level; 5.x does not.
- AUTO_FILLED["accelerate"]: accelerate 1.11.0, utils/dataclasses.py DeepSpeedPlugin.__post_init__
  (plugin_to_config_mapping: PLUGIN_AUTO) and set_mixed_precision (fp16/bf16), and accelerator.py
  Accelerator._prepare_deepspeed's config_kwargs (batch sizes, gradient clipping, the three hidden-size based sizes,
  and with DummyOptim/DummyScheduler only optimizer lr and weight_decay and scheduler warmup_min_lr, warmup_max_lr,
  warmup_num_steps, total_num_steps; never betas or eps).
- Both integrations find a key by its literal dotted path (HfDeepSpeedConfig.find_config_node): an "auto" under
  another spelling DeepSpeed reads (prefetch_bucket_size for stage3_prefetch_bucket_size) is left as "auto", and
  DeepSpeed's config models drop an "auto" value (deepspeed/runtime/config_utils.py, DeepSpeedConfigModel.__init__)
  and silently use their default; auto_errors() refuses it, naming the spelling the integration fills.
- tests/unit/actions/test_byo.py compares these tables with the installed transformers and accelerate sources.
"""

from __future__ import annotations

import copy
import json

from ansible_collections.trainyard.core.plugins.plugin_utils.did_you_mean import nearest

# canonical DeepSpeedZeroConfig field → the other spellings DeepSpeed reads for it (first: the stage3_ alias)
ZERO_ALIASES = {
    "prefetch_bucket_size": ("stage3_prefetch_bucket_size",),
    "param_persistence_threshold": ("stage3_param_persistence_threshold",),
    "model_persistence_threshold": ("stage3_model_persistence_threshold",),
    "max_live_parameters": ("stage3_max_live_parameters",),
    "max_reuse_distance": ("stage3_max_reuse_distance",),
    "gather_16bit_weights_on_model_save": ("stage3_gather_16bit_weights_on_model_save",
                                           "stage3_gather_fp16_weights_on_model_save"),
    "module_granularity_threshold": ("stage3_module_granularity_threshold",),
    "use_all_reduce_for_fetch_params": ("stage3_use_all_reduce_for_fetch_params",),
    "allgather_sequential": ("stage3_allgather_sequential",),
    "offload_optimizer": ("cpu_offload",),
    "offload_param": ("cpu_offload_param",),
}
TOP_ALIASES = {"bf16": ("bfloat16",)}

_ZERO_SPELLINGS = {}
for _canon, _others in ZERO_ALIASES.items():
    for _name in (_canon,) + _others:
        _ZERO_SPELLINGS[_name] = (_canon,) + _others
_TOP_SPELLINGS = {}
for _canon, _others in TOP_ALIASES.items():
    for _name in (_canon,) + _others:
        _TOP_SPELLINGS[_name] = (_canon,) + _others

# Filled by Accelerate's DeepSpeedPlugin.__post_init__ (plugin_to_config_mapping), which runs under both.
PLUGIN_AUTO = (
    "gradient_accumulation_steps", "gradient_clipping", "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
    "zero_optimization.offload_param.nvme_path", "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
)
HIDDEN_SIZE_AUTO = (
    "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)
TRAINER_AUTO = tuple(dict.fromkeys((
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps", "fp16.enabled", "bf16.enabled",
) + HIDDEN_SIZE_AUTO + PLUGIN_AUTO))
ACCELERATE_AUTO = tuple(dict.fromkeys((
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping",
    "optimizer.params.lr", "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps", "fp16.enabled", "bf16.enabled",
) + HIDDEN_SIZE_AUTO + PLUGIN_AUTO))
AUTO_FILLED = {"trainer": TRAINER_AUTO, "accelerate": ACCELERATE_AUTO, "none": ()}
FILLER_NAMES = {"trainer": "the Hugging Face Trainer (transformers)", "accelerate": "Accelerate's DeepSpeedPlugin",
                "none": "nothing (deepspeed_config_auto_filler: none)"}


def canonical_path(path):
    """A dotted path with every alias spelling replaced by DeepSpeed's canonical field name."""
    parts = path.split(".")
    if parts and parts[0] in _TOP_SPELLINGS:
        parts[0] = _TOP_SPELLINGS[parts[0]][0]
    if len(parts) >= 2 and parts[0] == "zero_optimization" and parts[1] in _ZERO_SPELLINGS:
        parts[1] = _ZERO_SPELLINGS[parts[1]][0]
    return ".".join(parts)


def spellings(section, key):
    """Every spelling DeepSpeed reads for `key` in `section` ("" for the top level, or zero_optimization)."""
    table = _TOP_SPELLINGS if section == "" else _ZERO_SPELLINGS if section == "zero_optimization" else {}
    return table.get(key, (key,))


def find(config, path):
    """(the spelling used, its value) of the dotted path in config, any alias spelling; (None, None) if unset."""
    node = config
    parts = path.split(".")
    section = ""
    for i, part in enumerate(parts):
        if not isinstance(node, dict):
            return None, None
        hit = next((s for s in spellings(section, part) if s in node), None)
        if hit is None:
            return None, None
        if i == len(parts) - 1:
            return ".".join(parts[:i] + [hit]), node[hit]
        node = node[hit]
        section = part if i == 0 else "?"
    return None, None


def alias_combine(base, over):
    """Deep-merge `over` into a copy of `base`; a key of `over` replaces every alias spelling of it in `base`
    (so the result never holds two spellings of one DeepSpeed field)."""
    return _combine(copy.deepcopy(base) if isinstance(base, dict) else {}, over or {}, "")


def _combine(base, over, section):
    for key, value in over.items():
        for other in spellings(section, key):
            if other != key and other in base:
                del base[other]
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = _combine(base[key], value, key if section == "" else "?")
        else:
            base[key] = copy.deepcopy(value)
    return base


def duplicate_spellings(config):
    """["zero_optimization: max_live_parameters and stage3_max_live_parameters", ...] where one config gives
    two spellings of one field (DeepSpeed then reads only one of them)."""
    out = []
    for section, table, node in (("top level", _TOP_SPELLINGS, config or {}),
                                 ("zero_optimization", _ZERO_SPELLINGS,
                                  (config or {}).get("zero_optimization") or {})):
        if not isinstance(node, dict):
            continue
        seen = set()
        for key in node:
            if key in table and key not in seen:
                both = [s for s in table[key] if s in node]
                seen.update(both)
                if len(both) > 1:
                    out.append(f"{section}: {' and '.join(both)}")
    return out


def load(text, source):
    """{ok, config, error}: the user's ds_config.json text parsed, or why not (naming the file)."""
    if text is None or text == "":
        return {"ok": False, "config": {}, "error": f"{source} cannot be read on the controller (missing or empty)"}
    try:
        config = json.loads(text)
    except ValueError as exc:
        return {"ok": False, "config": {}, "error": f"{source} is not JSON: {exc}"}
    if not isinstance(config, dict):
        return {"ok": False, "config": {}, "error": f"{source} holds a JSON {type(config).__name__}, not an object"}
    return {"ok": True, "config": config, "error": ""}


def _enabled(value):
    """None (unset), "auto", True or False of an enabled flag."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return "auto"
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def precision(config):
    """(mode, key): which precision the config asks for: fp16, bf16, auto, fp32 or None (nothing said)."""
    _, bf16 = find(config, "bf16.enabled")
    _, fp16 = find(config, "fp16.enabled")
    _, amp = find(config, "amp.enabled")
    bf16, fp16, amp = _enabled(bf16), _enabled(fp16), _enabled(amp)
    if fp16 is True or amp is True:
        return "fp16", "fp16.enabled" if fp16 is True else "amp.enabled"
    if bf16 is True:
        return "bf16", "bf16.enabled"
    if "auto" in (fp16, bf16, amp):
        return "auto", "fp16.enabled/bf16.enabled"
    if fp16 is False or bf16 is False:
        return "fp32", "fp16.enabled/bf16.enabled"
    return None, ""


def additions(config, wants, source):
    """The product's additions to the user's config, only where it leaves a field unset.

    wants: {bf16, fp16 (true, false or "auto"), finetuning_type, gather_16bit (bool), node_local (bool),
    moe_leaf_classes (list, empty: none)}. Returns {config, added: [{key, value, why}], kept: [text]}: the
    config with the additions, what was added (for the report) and what of the user's was kept where the
    product would have set something else.
    """
    out = copy.deepcopy(config)
    added, kept = [], []

    def add(path, value, why):
        parent = out
        *parents, leaf = path.split(".")
        for p in parents:
            parent = parent.setdefault(p, {})
        parent[leaf] = value
        added.append({"key": path, "value": value, "why": why})

    mode, key = precision(config)
    if mode is None:
        bf16, fp16 = _enabled(wants.get("bf16")), _enabled(wants.get("fp16"))
        if fp16 in (True, "auto") and bf16 is not True:
            add("fp16.enabled", wants.get("fp16"), f"{source} sets no precision; deepspeed_config_fp16")
        elif bf16 in (True, "auto"):
            add("bf16.enabled", wants.get("bf16"), f"{source} sets no precision; deepspeed_config_bf16")
        else:
            kept.append(f"{source} sets no precision and deepspeed_config_bf16/fp16 are off: fp32")
    else:
        kept.append(f"precision from {source} ({key}: {mode}); deepspeed_config_bf16/fp16 not applied")

    zero = out.get("zero_optimization") if isinstance(out.get("zero_optimization"), dict) else {}
    try:
        stage = int(zero.get("stage", 0))
    except (TypeError, ValueError):
        stage = zero.get("stage")
    if str(wants.get("finetuning_type", "lora")).lower() == "lora" and stage == 3:
        hit, value = find(out, "zero_optimization.gather_16bit_weights_on_model_save")
        if hit is None and wants.get("gather_16bit", True):
            short = any(k in zero for k in ZERO_ALIASES if k not in ("offload_optimizer", "offload_param"))
            name = "gather_16bit_weights_on_model_save" if short else "stage3_gather_16bit_weights_on_model_save"
            add(f"zero_optimization.{name}", True,
                "LoRA under ZeRO-3 saves an empty adapter without it; deepspeed_config_gather_16bit_weights_on_model_save")
        elif hit is not None:
            kept.append(f"{hit}: {json.dumps(value)} from {source}")

    hit, value = find(out, "checkpoint.use_node_local_storage")
    if hit is None and wants.get("node_local"):
        add("checkpoint.use_node_local_storage", True,
            "node-local output roots: every node resumes from its own copy; deepspeed_config_node_local_checkpoints")
    elif hit is not None:
        kept.append(f"checkpoint.use_node_local_storage: {json.dumps(value)} from {source}")

    classes = list(wants.get("moe_leaf_classes") or [])
    if classes and stage == 3:
        hit, _ = find(out, "zero_optimization.leaf_module")
        if hit is None:
            add("zero_optimization.leaf_module", {"classes": classes}, "deepspeed_config_moe")
        else:
            kept.append(f"zero_optimization.leaf_module from {source}")
    return {"config": out, "added": added, "kept": kept}


def auto_paths(config, prefix=""):
    """Dotted paths of every "auto" value in a nested dict."""
    paths = []
    if isinstance(config, dict):
        for key, value in config.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, str) and value == "auto":
                paths.append(path)
            else:
                paths += auto_paths(value, path)
    return paths


def auto_errors(config, filler, source="the config"):
    """One message per "auto" the chosen integration does not fill, naming which integration would (or the spelling
    it fills: both look a key up by its literal path, so another spelling of the same DeepSpeed field stays "auto")."""
    filled = set(AUTO_FILLED.get(filler, ()))
    errors = []
    for path in auto_paths(config):
        if path in filled:
            continue
        same = [k for k in filled if canonical_path(k) == canonical_path(path)]
        if same:
            errors.append(f"{source} key {path}: \"auto\" is filled by {FILLER_NAMES[filler]} only under the "
                          f"spelling {same[0]} (it looks the key up by that name; DeepSpeed would drop this "
                          f"\"auto\" and use its default); rename the key to {same[0].split('.')[-1]} or give a value")
            continue
        would = [name for name, keys in AUTO_FILLED.items() if path in keys]
        if would:
            fillers = " and ".join(FILLER_NAMES[w] for w in would)
            errors.append(f"{source} key {path}: \"auto\" is filled by {fillers}, not by {FILLER_NAMES[filler]}; "
                          f"set deepspeed_config_auto_filler: {would[0]} if the job runs under it, or give a value")
        else:
            top = path.split(".")[0]
            near = nearest(top, {k.split(".")[0] for k in TRAINER_AUTO} - {top})
            hint = f" (the top-level key {top}: did you mean {near}?)" if near else ""
            errors.append(f"{source} key {path}: \"auto\" is filled by neither the Hugging Face Trainer nor "
                          f"Accelerate; give a value{hint}")
    return errors


GATHER_KEYS = ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
               "stage3_gather_fp16_weights_on_model_save")
GATHER_VAR = "deepspeed_config_gather_16bit_weights_on_model_save"


def lora_gather(config, overrides=None, finetuning_type="lora", base_file=""):
    """Whether a LoRA job's ZeRO-3 config gathers the 16-bit weights on save (else the saved adapter is empty).

    Returns {status: pass|fail|skip, detail, variable}: variable names what turned it off (the user's override
    path, the key of the user's base file, or deepspeed_config_gather_16bit_weights_on_model_save).
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
    off = [k for k in GATHER_KEYS if k in zero and _enabled(zero[k]) is not True]
    if off or not any(_enabled(zero.get(k)) is True for k in GATHER_KEYS):
        key = off[0] if off else GATHER_KEYS[0]
        variable = (f"deepspeed_config_overrides.zero_optimization.{key}" if key in over
                    else f"{base_file} key zero_optimization.{key}" if base_file else GATHER_VAR)
        return {"status": "fail", "variable": variable,
                "detail": f"LoRA under ZeRO-3 with zero_optimization.{key} = false (set by {variable}): "
                          f"the saved adapter would be empty"}
    on = next(k for k in GATHER_KEYS if _enabled(zero.get(k)) is True)
    return {"status": "pass", "variable": "", "detail": f"LoRA under ZeRO-3: zero_optimization.{on} is true"}


def build(generated, overrides=None, user_config=None, base_file="", wants=None):
    """The DeepSpeed config to write, and what the product added to what the user gave.

    With base_file (the user's json, already parsed into user_config) the user's config is the base:
    the product adds only what wants asks for and the config leaves unset (additions); without it,
    `generated` (built from the deepspeed_config_* variables) is the base. deepspeed_config_overrides is merged
    last either way, alias-aware (a key replaces every DeepSpeed spelling of the same field). Returns
    {config, added: [{key, value, why}], kept: [text], overridden: [paths], duplicates: [text], source}.
    """
    overrides = overrides or {}
    wants = wants or {}
    if base_file:
        result = additions(user_config or {}, wants, base_file)
        base, added, kept = result["config"], result["added"], result["kept"]
        duplicates = duplicate_spellings(user_config or {})
    else:
        base, added, kept, duplicates = generated or {}, [], [], []
        mode, key = precision(overrides)
        _, bf16 = find(base, "bf16.enabled")
        if mode == "fp16" and _enabled(bf16) is True:
            base = {k: v for k, v in base.items() if k not in spellings("", "bf16")}
            kept.append(f"deepspeed_config_overrides sets {key}: bf16 from deepspeed_config_bf16 left out "
                        f"(DeepSpeed refuses fp16 and bf16 together)")
    config = alias_combine(base, overrides)
    overridden = [p for p in _leaf_paths(overrides)]
    return {"config": config, "added": added, "kept": kept, "overridden": overridden, "duplicates": duplicates,
            "source": base_file or "deepspeed_config_* variables"}


def _leaf_paths(node, prefix=""):
    if isinstance(node, dict) and node:
        out = []
        for key, value in node.items():
            out += _leaf_paths(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    return [prefix] if prefix else []


def merge(base, over):
    """base with over merged in recursively (Ansible's combine(recursive=true)): a key of both that is a dict in both
    is merged, any other value of over replaces base's; base's keys keep their place, new keys follow."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def _zero3(s):
    """The ZeRO-3 block shared by the profiles; sizes given (zero3) or "auto" (zero3_offload: the Trainer fills them
    from the model's hidden size)."""
    return {"stage": 3, "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 1000000000,
            "reduce_bucket_size": s.get("zero3_reduce_bucket_size", "auto"),
            "stage3_prefetch_bucket_size": s.get("zero3_prefetch_bucket_size", "auto"),
            "stage3_param_persistence_threshold": s.get("zero3_param_persistence_threshold", "auto"),
            "stage3_max_live_parameters": 1000000000, "stage3_max_reuse_distance": 1000000000}


def generated(s):
    """The config built from the role's settings s (the deepspeed_config_* variables without the prefix; gather_16bit
    and node_local are deepspeed_config_gather_16bit_weights_on_model_save and
    deepspeed_config_node_local_checkpoints, moe a bool), merged in this order: base, profile (zero3_offload,
    zero3; another leaves ZeRO to the overrides), LoRA save flag and node-local checkpoints, MoE block, optimizer and
    scheduler (each when given)."""
    config = {"train_micro_batch_size_per_gpu": s.get("micro_batch_size"),
              "gradient_accumulation_steps": s.get("gradient_accumulation_steps"),
              "train_batch_size": s.get("train_batch_size"), "gradient_clipping": s.get("gradient_clipping"),
              "steps_per_print": s.get("steps_per_print"), "wall_clock_breakdown": False,
              "bf16": {"enabled": s.get("bf16")}, "fp16": {"enabled": s.get("fp16")}}
    profile = s.get("profile")
    if profile == "zero3_offload":
        config = merge(config, {"zero_optimization": dict(_zero3({}), offload_optimizer={"device": "cpu", "pin_memory": True},
                                                          offload_param={"device": "cpu", "pin_memory": True})})
    elif profile == "zero3":
        config = merge(config, {"zero_optimization": _zero3(s)})
    config = merge(config, {"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": s.get("gather_16bit")},
                            "checkpoint": {"use_node_local_storage": s.get("node_local")}})
    if s.get("moe"):
        config = merge(config, {"zero_optimization": {"leaf_module": {"classes": s.get("moe_leaf_classes")}}})
    for key in ("optimizer", "scheduler"):
        if len(s.get(key) or {}) > 0:
            config[key] = s[key]
    return config


def render(generated, overrides=None, base_file="", base_text="", wants=None, finetuning_type="lora", profile=""):
    """One node's config: build()'s answer with the LoRA save check (lora_gather), the file's text (content,
    to_nice_json's layout) and its label for the report. A base_file that cannot be read raises ValueError."""
    user = {}
    if base_file:
        loaded = load(base_text, base_file)
        if not loaded["ok"]:
            raise ValueError(loaded["error"])
        user = loaded["config"]
    built = build(generated, overrides, user, base_file, wants)
    built["lora"] = lora_gather(built["config"], overrides, finetuning_type, base_file)
    built["content"] = json.dumps(built["config"], indent=2, sort_keys=True, separators=(",", ": ")) + "\n"
    built["label"], built["drift"] = ((f"from {base_file}", "file " + base_file.rsplit("/", 1)[-1]) if base_file
                                      else (f"profile {profile}", profile))
    return built
