#!/bin/bash
# The call as run on the GPU machine (nvidia-h100-x4: 4 x NVIDIA H100 80GB HBM3, NVSwitch NV18, torch 2.11.0+cu130,
# NCCL 2.28.9, no dcgmi) on 2026-11-27 from the repository root of the tree holding tests/gpu/probe_stress.sh and
# roles/nccl_check/files/gpu_stress.py. The files beside this one are that call's /tmp/cap, unchanged.
bash tests/gpu/probe_stress.sh /tmp/cap > /tmp/cap.log 2>&1; tar -C /tmp -czf $OUT/cap.tgz cap
# stress.json: every GPU alone, 20 s each (10 s matmul bf16 8192^3, 10 s HBM copy 2 GiB): 675.7-679.1 TFLOP/s,
# 3011-3017 GB/s. stress-hog-gpu3.json: the same at 10 s each while another process runs bf16 matmuls on GPU 3:
# GPU 3 323.7 TFLOP/s and 1469.8 GB/s (48% and 49% of the others' median), SM clock 1410 MHz, throttle reasons 0x4
# (SW power cap); GPUs 0-2 unchanged. allreduce-intra.json: the product's sweep on the 4 GPUs (NVLink), 1 MiB-1 GiB:
# busbw 354.9 GB/s at 1 GiB. allreduce-inter-node*.json: 2 "nodes" x 2 GPUs, NCCL_HOSTID per node, sockets on lo:
# 3.4 GB/s at 1 GiB.
