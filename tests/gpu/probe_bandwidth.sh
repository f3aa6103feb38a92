#!/usr/bin/env bash
# Bandwidth figures on a GPU machine with the product's all-reduce check (roles/nccl_check/files/allreduce_bench.py):
# two "nodes" on one host, one GPU each, NCCL forced onto its socket transport (P2P and SHM off, interface lo),
# NCCL defaults vs the tcp profile's socket tuning; then one node with every GPU (NVLink), the product's check
# vs a plain torch.distributed all-reduce. Usage: tests/gpu/probe_bandwidth.sh OUTDIR
set -euo pipefail
out=${1:-/tmp/ty-gpu}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TORCH_CUDA_ARCH_LIST=9.0
bench=roles/nccl_check/files/allreduce_bench.py
ngpu=$(nvidia-smi -L | wc -l)
half=$((ngpu / 2))
vis() { seq -s, "$1" "$2"; }
for prof in default tcp; do
  env="$out/$prof.env"
  printf 'NCCL_P2P_DISABLE=1\nNCCL_SHM_DISABLE=1\nNCCL_IB_DISABLE=1\nNCCL_SOCKET_IFNAME=lo\nNCCL_NVLS_ENABLE=0\n' > "$env"
  if [ "$prof" = tcp ]; then printf 'NCCL_NSOCKS_PERTHREAD=4\nNCCL_SOCKET_NTHREADS=4\n' >> "$env"; fi
  for r in 0 1; do
    first=$((r * half)); last=$((first + half - 1))
    CUDA_VISIBLE_DEVICES=$(vis $first $last) python3 -m torch.distributed.run --nnodes 2 --nproc_per_node "$half" \
      --node_rank $r --master_addr 127.0.0.1 --master_port 29611 "$bench" --env-file "$env" --size-mb 1024 \
      --label "inter-$prof" --json "$out/inter-$prof.json" > "$out/inter-$prof-node$r.log" 2>&1 &
  done
  wait
  cat "$out/inter-$prof.json"
done
python3 -m torch.distributed.run --standalone --nproc_per_node "$ngpu" "$bench" --size-mb 1024 --label intra \
  --json "$out/intra.json" > "$out/intra.log" 2>&1
cat "$out/intra.json"
python3 -m torch.distributed.run --standalone --nproc_per_node "$ngpu" tests/gpu/plain_allreduce.py 1024 2>&1 \
  | grep plain-allreduce | tee "$out/plain.txt"
nvidia-smi topo -m > "$out/topo.txt" 2>&1 || true
