#!/bin/bash
# The two calls as run on the GPU machine (nvidia-h100-x1), from a folder holding the tree, the engine and the wheels.
# ---- call 1 (prepare): .gpu18/call1.sh
# Stage "prepare": unpack the tree and the engine, start dockerd and the registry, build and push the base image.
set -x
mkdir -p /tmp/ty /tmp/dk && tar -C /tmp/ty -xzf .gpu18/tree.tar.gz
for f in docker-engine docker-cli docker-registry; do tar -C /tmp/dk -xJf .gpu18/$f.tar.xz; done
ls -la /tmp/dk/bin /tmp/dk/lib
nvidia-smi -L; nvidia-smi --query-gpu=driver_version,uuid --format=csv
/sbin/ldconfig -p | grep -E 'libcuda|libnvidia' ; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; command -v nvidia-smi
ls -la /dev/nvidia* ; cat /opt/torch/.venv/pyvenv.cfg; readlink -f /opt/torch/.venv/bin/python3
du -sh /usr /opt/torch/.venv /usr/local/* 2>/dev/null | sort -h | tail -8; df -h /tmp /
mount | grep -E ' / | /tmp ' 
cd /tmp/ty && export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
time python3 tests/gpu/acceptance.py $OUT/acc --mode container-llamafactory --stage prepare --engine /tmp/dk --work /tmp/dkw 2>&1 | tail -60
echo "rc=${PIPESTATUS[0]}"
tail -20 /tmp/dkw/dockerd.log; tail -5 /tmp/dkw/registry.log
cp /tmp/dkw/dockerd.log $OUT/ 2>/dev/null
# ---- call 2 (run): .gpu18b/call2.sh
# Stage "run": LLaMA-Factory image, then the product's playbooks. Needs call1's engine still running on this machine.
set -x
[ -x /tmp/dk/bin/dockerd ] || { echo "FRESH MACHINE: the engine of the prepare stage is gone"; exit 9; }
rm -rf /tmp/ty && mkdir -p /tmp/ty && tar -C /tmp/ty -xzf .gpu18b/tree.tar.gz
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/lfsite .gpu18b/lf/*.whl || exit 4
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu18b/an/*.whl || exit 4
mkdir -p /tmp/colls && tar -C /tmp/colls -xJf .gpu18b/colls.tar.xz
export PYTHONPATH=/tmp/site:/tmp/lfsite ANSIBLE_COLLECTIONS_PATH=/tmp/colls TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
cd /tmp/ty
timeout ${ACC_TIMEOUT:-540} python3 tests/gpu/acceptance.py $OUT/acc --mode container-llamafactory --stage run \
  --engine /tmp/dk --work /tmp/dkw --site /tmp/lfsite > $OUT/acceptance-stdout.log 2>&1
echo "acceptance rc=$?"
tail -45 $OUT/acceptance-stdout.log
mkdir -p $OUT/acc/nodes && for n in 0 1; do cp /tmp/trainyard-gpu/node$n/state/gpu-accept/*.log $OUT/acc/nodes/ 2>/dev/null; \
  for f in /tmp/trainyard-gpu/node$n/state/gpu-accept/*.log; do cp $f $OUT/acc/nodes/node$n-$(basename $f); done; \
  cp /tmp/trainyard-gpu/node$n/state/gpu-accept/llamafactory.yaml $OUT/acc/nodes/node$n-llamafactory.yaml; \
  cp /tmp/trainyard-gpu/node$n/outputs/trainer_log.jsonl $OUT/acc/nodes/node$n-trainer_log.jsonl 2>/dev/null; \
  ls -la /tmp/trainyard-gpu/node$n/outputs > $OUT/acc/nodes/node$n-outputs.txt 2>&1; done
cp /tmp/dkw/dockerd.log $OUT/acc/ 2>/dev/null
tar -C $OUT -czf $OUT/acc.tgz acc && rm -rf $OUT/acc; ls -la $OUT
