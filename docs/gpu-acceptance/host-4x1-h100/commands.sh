# GPU acceptance, host runtime, 4 nodes x 1 GPU on one 4-GPU machine (tests/gpu/acceptance.py).
# Run as: ACC_TIMEOUT=265 bash commands.sh (the wheels and collections carried in .gpucarry/: ansible-core 2.19.14,
# resolvelib, cryptography, cffi, pycparser, deepspeed 0.19.8, hjson, pydantic and its needs; community.general,
# community.docker, ansible.posix from the pinned ansible package), on the tree of commit 7f9392b.
set -x
date -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpucarry/whl/*.whl || exit 4
mkdir -p /tmp/colls && tar -C /tmp/colls -xJf .gpucarry/colls.tar.xz
export PYTHONPATH=/tmp/site ANSIBLE_COLLECTIONS_PATH=/tmp/colls:$PWD/collections TORCH_CUDA_ARCH_LIST=9.0
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
python3 -c 'import torch, deepspeed, ansible; print(torch.__version__, torch.cuda.device_count(), deepspeed.__version__)'
git log --oneline -1 2>/dev/null; cat .gpucarry/TREE_COMMIT
A=$OUT/acc; mkdir -p $A
timeout ${ACC_TIMEOUT:-470} python3 tests/gpu/acceptance.py $A --runtime host --nodes 4 --gpus-per-node 1 > $A/acceptance-stdout.log 2>&1
echo "acceptance rc=$?"
tail -45 $A/acceptance-stdout.log
rm -rf $A/run-*/facts 2>/dev/null
du -sh $A
date -u
