#!/bin/bash
# The call as run on the GPU machine (nvidia-h200: 1 x NVIDIA H200 141 GB, driver 580.159.04, CUDA 13.0,
# torch 2.11.0+cu130) on 2026-11-27 from the repository root of main at 745153c, whose
# roles/nccl_check/files/gpu_stress.py is the one of this branch (unchanged since 331cf81). The files beside this one
# are that call's $OUT, unchanged.
ls roles/nccl_check/files/; nvidia-smi -L
PYTHONUNBUFFERED=1 python3 roles/nccl_check/files/gpu_stress.py --seconds 20 --json $OUT/stress.json 2>&1 | tee $OUT/stress.log
nvidia-smi -q > $OUT/nvidia-smi-q.txt; date -u > $OUT/date.txt
# stress.json: bf16 matmul 662.0 TFLOP/s (min 559.4, max 783.3, 601 windows), HBM copy 4271.5 GB/s (min 4206.1,
# max 4276.9, 990 windows), SM clock 1980/1980 MHz, no throttle reason; wall_s 20.5 for the one GPU at 20 s.
# Against the table (plugin_utils/gpu_stress_checks.py, H200 SXM row scaled from the H100 capture): 98% of the
# 678 TFLOP/s and 99% of the 4320 GB/s expected: pass.
