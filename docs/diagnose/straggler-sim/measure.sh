#!/bin/bash
# Where a CPU quota slows the ranks of a simulated node (tests/sim: docker-in-docker nodes, cgroup v1, the host's
# /sys/fs/cgroup bind-mounted into every node). Run from the host while the example job of
# tests/integration/test_diagnose.py runs on cluster NAME (2 nodes, one rank each):
#   bash docs/diagnose/straggler-sim/measure.sh NAME > docs/diagnose/straggler-sim/measure.txt 2>&1
# Each phase waits 25 s (more than 20 steps, the window the progress files average over) and prints both ranks'
# progress records (compute_s: the rank's own compute time per step; step_s: the lock-stepped step time).
set -u
N=$1; SLOW=$N-node2; FAST=$N-node1; C=trainyard-train; RW=/var/lib/trainyard/train/job-rw
rec() { for n in $FAST $SLOW; do echo "$n: $(docker exec $n sh -c "cat $RW/progress/rank_*.json")"; done; }
phase() { echo; echo "== $1"; sleep 25; rec; }
echo "== cgroups: the node container and the training container inside $SLOW"
echo "node $SLOW: $(docker inspect -f '{{.Id}}' $SLOW)"
docker exec $SLOW sh -c "echo \"training container: \$(docker inspect -f '{{.Id}}' $C)\"; \
  pid=\$(ps -eo pid=,args= | grep '[d]dp_train.py' | grep -v torchrun | awk '{print \$1}'); \
  echo \"rank pid \$pid: \$(grep ':cpu:' /proc/\$pid/cgroup)\""
phase "no quota"
docker exec $SLOW docker update --cpu-period 100000 --cpu-quota 20000 $C >/dev/null
phase "quota 0.2 CPU on the training container (docker update in the node's own engine)"
docker exec $SLOW docker update --cpu-quota 5000 $C >/dev/null
phase "quota 0.05 CPU on the training container (docker update in the node's own engine)"
docker exec $SLOW docker update --cpu-quota -1 $C >/dev/null
docker update --cpu-period 100000 --cpu-quota 5000 $SLOW >/dev/null
phase "quota 0.05 CPU on the node container (docker update in the host's engine), none on the training container"
docker update --cpu-quota -1 $SLOW >/dev/null
echo; echo "== quotas removed"
