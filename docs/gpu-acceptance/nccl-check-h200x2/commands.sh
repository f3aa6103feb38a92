#!/bin/bash
# Run on nvidia-h200-x2 (2 x H200, NVLink) on 2026-11-27 from the repository root, the tree of commit c037767, with .gpucarry/ carried (wheels and collections as in ../host-2x2-h100/commands.sh):
#   bash commands.sh > call.log 2>&1   (call.log, nccl_check.log, report.json and report.md beside this file are its output)
# playbooks/nccl_check.yml alone on the whole GPU machine as one node (tests/gpu/one-node): the intra-node figure
# graded against docs/bandwidth.md's expectation, with the GPU facts the playbook now reads itself.
set -x
date -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpucarry/whl/*.whl || exit 4
mkdir -p /tmp/colls && tar -C /tmp/colls -xJf .gpucarry/colls.tar.xz
export PYTHONPATH=/tmp/site ANSIBLE_COLLECTIONS_PATH=/tmp/colls:$PWD/collections TORCH_CUDA_ARCH_LIST=9.0
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L; cat .gpucarry/TREE_COMMIT
N=$(nvidia-smi -L | wc -l)
mkdir -p $OUT/intra
timeout 400 python3 -m ansible.cli.playbook -i tests/gpu/one-node playbooks/nccl_check.yml \
  -e "{\"cluster_gpus_per_node\": $N, \"cluster_nproc_per_node\": $N, \"cluster_run_dir\": \"$OUT/intra/run\"}" > $OUT/intra/nccl_check.log 2>&1
echo "rc=$?"
tail -25 $OUT/intra/nccl_check.log
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(r["check"], r["status"], r["detail"]) for r in d["records"] if r["check"].startswith("nccl_check.")]' $OUT/intra/run/report.json
rm -rf $OUT/intra/run/facts
date -u
