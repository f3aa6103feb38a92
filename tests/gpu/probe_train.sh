#!/usr/bin/env bash
# Quick probe of the example LoRA + ZeRO-3 job on a GPU machine, outside the product (plain torchrun).
set -euo pipefail
out=${1:-/tmp/ty-probe}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cat > /tmp/ds.json <<'JSON'
{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
 "bf16": {"enabled": "auto"},
 "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
   "stage3_gather_16bit_weights_on_model_save": true}}
JSON
python3 -m torch.distributed.run --standalone --nproc_per_node 2 examples/lora_zero3_train.py \
  --output-dir /tmp/ckpt --deepspeed /tmp/ds.json --max-steps 6 --save-steps 3 2>&1 | tail -25
find /tmp/ckpt -maxdepth 2 | sort | head -40
