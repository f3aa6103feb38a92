#!/bin/bash
# GPU acceptance with the standard burn-in tier (built-in stress at 10 s per GPU), host runtime, 2 nodes x 1 GPU on one
# 2-GPU machine (nvidia-h100-x2 asked, 2 x H200 came; driver 580.159.04), tree of commit 40c20a8.
# Run as: ACC_GPN=1 ACC_TIMEOUT=560 ACC_EXTRA='{"cluster_burnin_tier": "standard", "nccl_check_stress_standard_s": 10}' bash commands.sh
# (the wheels and collections carried in .gpucarry/ as in ../host-2x2-h100/commands.sh). The files beside this one are $OUT/acc.
set -x
date -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpucarry/whl/*.whl || exit 4
mkdir -p /tmp/colls && tar -C /tmp/colls -xJf .gpucarry/colls.tar.xz
export PYTHONPATH=/tmp/site ANSIBLE_COLLECTIONS_PATH=/tmp/colls:$PWD/collections TORCH_CUDA_ARCH_LIST=9.0
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
python3 -c 'import torch, deepspeed, ansible; print(torch.__version__, torch.cuda.device_count(), deepspeed.__version__)'
git log --oneline -1 2>/dev/null; cat .gpucarry/TREE_COMMIT
A=$OUT/acc; mkdir -p $A; : "${ACC_EXTRA:={\}}"
timeout ${ACC_TIMEOUT:-470} python3 tests/gpu/acceptance.py $A --runtime host --nodes ${ACC_NODES:-2} --gpus-per-node ${ACC_GPN:-2} --extra-vars "$ACC_EXTRA" > $A/acceptance-stdout.log 2>&1
echo "acceptance rc=$?"
tail -45 $A/acceptance-stdout.log
rm -rf $A/run-*/facts 2>/dev/null
du -sh $A
date -u
