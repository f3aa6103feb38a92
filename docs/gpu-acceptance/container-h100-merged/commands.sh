#!/bin/bash
# The two calls as run on the GPU machine (nvidia-h100-x1) on the tree of commit 4601370, from its root;
# .gpu18 carried the engine (docker-*.tar.xz, as in ../container-h100/commands.sh), .gpu18b the wheels (lf/, an/) and colls.tar.xz.
# ---- call 1 (prepare): bash .gpu18/call1.sh
# Stage "prepare" on the merged tree: unpack the engine, start dockerd and the registry, build and push the base image.
set -x
date -u; git log -1 --format='%H %s' 2>/dev/null || true
mkdir -p /tmp/dk /tmp/acc-out && for f in docker-engine docker-cli docker-registry; do tar -C /tmp/dk -xJf .gpu18/$f.tar.xz; done
nvidia-smi -L; nvidia-smi --query-gpu=driver_version,uuid --format=csv
export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
time python3 tests/gpu/acceptance.py /tmp/acc-out/acc --mode container-llamafactory --stage prepare --engine /tmp/dk --work /tmp/dkw > $OUT/prepare-stdout.log 2>&1
echo "prepare rc=$?"
tail -40 $OUT/prepare-stdout.log
tail -5 /tmp/dkw/dockerd.log; tail -3 /tmp/dkw/registry.log
cp /tmp/acc-out/acc/prepare.json $OUT/ 2>/dev/null; cp /tmp/dkw/dockerd.log $OUT/dockerd-prepare.log 2>/dev/null; ls -la $OUT
# ---- call 2 (run): bash .gpu18b/call2.sh (launch.json of each node was read, not kept: it holds the sidecar tokens)
# Stage "run" on the merged tree: LLaMA-Factory image, then the product's playbooks. Needs call1's engine on this machine.
set -x
[ -x /tmp/dk/bin/dockerd ] || { echo "FRESH MACHINE: the engine of the prepare stage is gone"; exit 9; }
date -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/lfsite .gpu18b/lf/*.whl || exit 4
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu18b/an/*.whl || exit 4
mkdir -p /tmp/colls && tar -C /tmp/colls -xJf .gpu18b/colls.tar.xz
export PYTHONPATH=/tmp/site:/tmp/lfsite ANSIBLE_COLLECTIONS_PATH=/tmp/colls TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
timeout ${ACC_TIMEOUT:-520} python3 tests/gpu/acceptance.py /tmp/acc-out/acc --mode container-llamafactory --stage run \
  --engine /tmp/dk --work /tmp/dkw --site /tmp/lfsite > /tmp/acc-out/acc/acceptance-stdout.log 2>&1
echo "acceptance rc=$?"
tail -45 /tmp/acc-out/acc/acceptance-stdout.log
A=/tmp/acc-out/acc; mkdir -p $A/nodes
for n in 0 1; do S=/tmp/trainyard-gpu/node$n/state/gpu-accept; find $S -maxdepth 2 > $A/nodes/node$n-state.txt 2>&1
  for f in $(find $S -maxdepth 2 -type f \( -name '*.log' -o -name 'llamafactory.yaml' -o -name 'launch.json' \)); do
    cp $f $A/nodes/node$n-$(basename $f); done
  cp /tmp/trainyard-gpu/node$n/outputs/trainer_log.jsonl $A/nodes/node$n-trainer_log.jsonl 2>/dev/null
  ls -la /tmp/trainyard-gpu/node$n/outputs > $A/nodes/node$n-outputs.txt 2>&1; done
cp /tmp/dkw/dockerd.log $A/ 2>/dev/null
tar -C /tmp/acc-out -czf $OUT/acc.tgz acc; ls -la $OUT; du -sh $A
