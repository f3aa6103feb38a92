#!/bin/bash
# The two calls as run on the GPU machine, from the repository root, on the tree of TREE_COMMIT 26feaf0
# (git archive of that commit), device kind nvidia-h100-x4 (the reply named 4 x NVIDIA H100 80GB HBM3, driver 580.159.04,
# NV18 between every pair), 2026-11-27 16:38-16:49 UTC. .gpucarry/ca carried
# tree.tar.gz and engine.tar.xz (bin/: dockerd 20.10.24, containerd, containerd-shim-runc-v2, runc, docker-init,
# docker CLI 28.2.2, docker-registry, stripped; lib/: libdevmapper.so.1.02.1, libseccomp.so.2); .gpucarry/cb the tree,
# lf/ (requirements-llamafactory.txt pure-Python and cp312 wheels less pandas/pyarrow/regex/safetensors/xxhash, which the
# machine has; deepspeed 0.19.8, hjson, pydantic), an/ (ansible-core 2.19.14, resolvelib, cryptography, cffi, pycparser,
# docker 7.2.0) and colls.tar.xz (community.docker, community.general, ansible.posix).
# Device tool calls:
#   run(kind=nvidia-h100-x4, carry=[".gpucarry/ca"], command="bash .gpucarry/ca/call.sh", timeout_s=420)        -> rc 0, 306.8 s
#   run(kind=nvidia-h100-x4, carry=[".gpucarry/cb"], command="ACC_TIMEOUT=540 bash .gpucarry/cb/call.sh", timeout_s=600) -> rc 0, 356.8 s
#   (second call on the still warm machine, issued right after the first)
# ---- call 1 (prepare): bash .gpucarry/ca/call.sh
# call 1 (prepare): unpack the tree and the engine, start dockerd and the registry, build and push the base image.
set -x
date -u
H=.gpucarry/ca
mkdir -p /tmp/ty /tmp/dk && tar -C /tmp/ty -xzf $H/tree.tar.gz && cat /tmp/ty/TREE_COMMIT
tar -C /tmp/dk -xJf $H/engine.tar.xz
ls /tmp/dk/bin /tmp/dk/lib
nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=driver_version,uuid --format=csv
python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count())'
cd /tmp/ty && export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/acc
time python3 tests/gpu/acceptance.py /tmp/acc --runtime container --stage prepare --engine /tmp/dk --work /tmp/dkw > $OUT/prepare-stdout.log 2>&1
echo "prepare rc=$?"
tail -30 $OUT/prepare-stdout.log
tail -5 /tmp/dkw/dockerd.log; tail -3 /tmp/dkw/registry.log
cp /tmp/acc/prepare.json $OUT/ 2>/dev/null; cp /tmp/dkw/dockerd.log $OUT/dockerd-prepare.log 2>/dev/null; ls -la $OUT
date -u
# ---- call 2 (run), on the still warm machine: ACC_TIMEOUT=540 bash .gpucarry/cb/call.sh (ACC_NODES unset = 2, ACC_GPN unset = 2)
# call 2 (run): LLaMA-Factory image, then the product's playbooks, 2 nodes x 2 GPUs in training containers.
# Needs call 1's engine, registry and base image on this (still warm) machine.
set -x
date -u
[ -x /tmp/dk/bin/dockerd ] || { echo "FRESH MACHINE: the engine of the prepare stage is gone"; exit 9; }
H=.gpucarry/cb
rm -rf /tmp/ty && mkdir -p /tmp/ty && tar -C /tmp/ty -xzf $H/tree.tar.gz && cat /tmp/ty/TREE_COMMIT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/lfsite $H/lf/*.whl || exit 4
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $H/an/*.whl || exit 4
mkdir -p /tmp/colls && tar -C /tmp/colls -xJf $H/colls.tar.xz
export PYTHONPATH=/tmp/site:/tmp/lfsite ANSIBLE_COLLECTIONS_PATH=/tmp/colls:/tmp/ty/collections TORCH_CUDA_ARCH_LIST=9.0
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
cd /tmp/ty
A=/tmp/acc; mkdir -p $A
timeout ${ACC_TIMEOUT:-500} python3 tests/gpu/acceptance.py $A --runtime container --nodes ${ACC_NODES:-2} --gpus-per-node ${ACC_GPN:-2} \
  --stage run --engine /tmp/dk --work /tmp/dkw --site /tmp/lfsite > $A/acceptance-stdout.log 2>&1
echo "acceptance rc=$?"
tail -60 $A/acceptance-stdout.log
mkdir -p $A/nodes
for n in 0 1; do S=/tmp/trainyard-gpu/node$n/state/gpu-accept; find $S -maxdepth 2 > $A/nodes/node$n-state.txt 2>&1
  for f in $(find $S -maxdepth 2 -type f \( -name '*.log' -o -name 'llamafactory.yaml' -o -name 'nccl*.json' -o -name 'nccl*.env' \)); do
    cp $f $A/nodes/node$n-$(basename $f); done
  # the exit record without the launch token
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("token", None); json.dump(d, open(sys.argv[2], "w"), indent=1)' \
    $S/job-rw/launch.exit.json $A/nodes/node$n-launch.exit.json 2>/dev/null
  cp /tmp/trainyard-gpu/node$n/outputs/trainer_log.jsonl $A/nodes/node$n-trainer_log.jsonl 2>/dev/null
  ls -la /tmp/trainyard-gpu/node$n/outputs > $A/nodes/node$n-outputs.txt 2>&1; done
cp /tmp/dkw/dockerd.log $A/ 2>/dev/null
rm -rf $A/run-*/facts 2>/dev/null
tar -C /tmp -czf $OUT/acc.tgz acc; ls -la $OUT; du -sh $A
date -u
