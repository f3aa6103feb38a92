#!/usr/bin/env bash
# Real captures for the burn-in tiers on a GPU machine: the quick tier's inputs (nvidia-smi -q -x / -q, nvlink
# errors and status, topology; dcgmi where installed), the built-in stress (roles/nccl_check/files/gpu_stress.py) on
# every GPU, again with a competing process on the last GPU (a GPU that is slow for a reason the verdict must name), and
# the product's all-reduce sweep (roles/nccl_check/files/allreduce_bench.py) inside one node (NVLink) and across two
# "nodes" of half the GPUs each (NCCL_HOSTID per node: sockets on lo). Usage: tests/gpu/probe_stress.sh OUTDIR
set -uo pipefail
out=${1:-/tmp/ty-stress}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TORCH_CUDA_ARCH_LIST=9.0
py=python3
python3 -c 'import torch' 2>/dev/null || py=/opt/torch/.venv/bin/python3
date -u > "$out/date.txt"
nvidia-smi -L > "$out/nvidia-smi-L.txt" 2>&1
nvidia-smi -q -x > "$out/nvidia-smi-q.xml" 2>&1
nvidia-smi -q > "$out/nvidia-smi-q.txt" 2>&1
nvidia-smi nvlink -e > "$out/nvlink-e.txt" 2>&1
nvidia-smi nvlink -s > "$out/nvlink-s.txt" 2>&1
nvidia-smi topo -m > "$out/topo.txt" 2>&1
{ command -v dcgmi && dcgmi --version; } > "$out/dcgmi.txt" 2>&1 || echo "dcgmi: not installed" >> "$out/dcgmi.txt"
$py -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.device_count())' > "$out/torch.txt" 2>&1
stress=roles/nccl_check/files/gpu_stress.py
bench=roles/nccl_check/files/allreduce_bench.py
ngpu=$(nvidia-smi -L | wc -l); half=$((ngpu / 2)); last=$((ngpu - 1))
$py $stress --seconds 20 --json "$out/stress.json" > "$out/stress.log" 2>&1
# A competing process on the last GPU for the whole second run (killed by its PID).
$py -c 'import sys, time, torch
d = torch.device("cuda", int(sys.argv[1])); a = torch.randn(8192, 8192, device=d, dtype=torch.bfloat16)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for _ in range(20): a @ a
    torch.cuda.synchronize(d)' "$last" 200 > "$out/hog.log" 2>&1 &
hog=$!
sleep 5
$py $stress --seconds 10 --json "$out/stress-hog-gpu$last.json" > "$out/stress-hog.log" 2>&1
kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null
sizes=1,4,16,64,256,1024
$py -m torch.distributed.run --standalone --nproc_per_node "$ngpu" $bench --sizes-mb $sizes --iters 20 \
  --label "intra-$ngpu" --json "$out/allreduce-intra.json" > "$out/allreduce-intra.log" 2>&1
for r in 0 1; do
  first=$((r * half)); lastg=$((first + half - 1))
  CUDA_VISIBLE_DEVICES=$(seq -s, $first $lastg) NCCL_HOSTID=node$r NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
    $py -m torch.distributed.run --nnodes 2 --nproc_per_node "$half" --node_rank $r --master_addr 127.0.0.1 \
    --master_port 29611 $bench --sizes-mb $sizes --iters 10 --iface lo --label "inter-2x$half" \
    --json "$out/allreduce-inter-node$r.json" > "$out/allreduce-inter-node$r.log" 2>&1 &
done
wait
date -u >> "$out/date.txt"
ls -la "$out"
