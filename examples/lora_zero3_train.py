#!/usr/bin/env python3
"""Example GPU job: a tiny randomly initialised Llama with a PEFT LoRA adapter, trained by the HF Trainer
under DeepSpeed ZeRO-3 (bf16) with the ds_config.json the deepspeed_config role rendered. No downloads.

    torchrun ... lora_zero3_train.py --output-dir DIR --deepspeed ds_config.json [--max-steps 20] [--save-steps 10]

Resumes from $TRAINYARD_RESUME_FROM (set by the launch module to the latest complete checkpoint) or
--resume-from. Prints "trainyard: first step done" after the first optimizer step, and at the end checks
that the saved adapter holds every LoRA tensor, non-empty (the empty-save failure that
stage3_gather_16bit_weights_on_model_save prevents).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch.utils.data import Dataset


class RandomTokens(Dataset):
    def __init__(self, n: int, seq: int, vocab: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        ids = self.data[i]
        return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


def count_adapter_tensors(checkpoint: str) -> tuple[int, int]:
    """(number of lora_ tensors, number of them with zero elements) in checkpoint/adapter_model.safetensors."""
    from safetensors import safe_open
    n = empty = 0
    with safe_open(os.path.join(checkpoint, "adapter_model.safetensors"), framework="pt") as f:
        for key in f.keys():
            if "lora_" in key:
                n += 1
                empty += f.get_tensor(key).numel() == 0
    return n, empty


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--deepspeed", required=True)
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--save-steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--resume-from", default=os.environ.get("TRAINYARD_RESUME_FROM", ""))
    p.add_argument("--logging-dir", default="")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step (tests)")
    # Output roots are node-local: every node keeps trainer state next to its own DeepSpeed shards, or no worker
    # node can resume (and the janitor never sees a complete checkpoint there).
    p.add_argument("--no-save-on-each-node", dest="save_on_each_node", action="store_false")
    args = p.parse_args()

    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    if args.logging_dir:  # transformers 5 dropped TrainingArguments.logging_dir; TensorBoard reads this
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", args.logging_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=args.seq_len)
    model = LlamaForCausalLM(cfg)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(model, lora)
    expected = sum(1 for n, _ in model.named_parameters() if "lora_" in n)

    class FirstStep(TrainerCallback):
        def on_step_end(self, targs, state, control, **kw):
            if state.global_step >= 1 and not getattr(self, "done", False):
                self.done = True
                print(f"trainyard: first step done (step {state.global_step})", flush=True)
            if args.step_sleep > 0:
                time.sleep(args.step_sleep)

    targs = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=args.batch_size, max_steps=args.max_steps,
        save_steps=args.save_steps, save_strategy="steps", logging_steps=1, bf16=True, deepspeed=args.deepspeed,
        report_to=["tensorboard"] if args.logging_dir else [],
        learning_rate=1e-3, save_only_model=False, save_on_each_node=args.save_on_each_node,
        # the deliberate collective timeout of the rendered environment (role nccl_env), not torch's 30 minutes
        ddp_timeout=int(os.environ.get("TRAINYARD_COLLECTIVE_TIMEOUT_S", "1800")),
        dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=model, args=targs, train_dataset=RandomTokens(512, args.seq_len, cfg.vocab_size),
                      callbacks=[FirstStep()])
    resume = args.resume_from if args.resume_from and os.path.isdir(args.resume_from) else None
    if resume:
        print(f"trainyard: resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        ckpts = sorted((d for d in os.listdir(args.output_dir) if d.startswith("checkpoint-")),
                       key=lambda d: int(d.split("-")[1]) if d.split("-")[1].isdigit() else -1)
        last = os.path.join(args.output_dir, ckpts[-1])
        n, empty = count_adapter_tensors(last)
        result = {"checkpoint": last, "lora_tensors": n, "expected": expected, "empty": empty,
                  "global_step": trainer.state.global_step}
        print("trainyard: adapter " + json.dumps(result), flush=True)
        if n != expected or empty:
            print("trainyard: the saved adapter is incomplete or empty", file=sys.stderr, flush=True)
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
