#!/bin/bash
# Cluster (elect) with spin / try_wait / try_wait+hint waits, and cluster-only, beside the single CTA.
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/waits; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
v() { tag=$1; shift; env TAG=$tag TRITON_CACHE_DIR=/tmp/tc_$tag PYTHONPATH=$PWD/.dev/dbg:$PYTHONPATH "$@" 2>&1 | grep -v -i warn | tee -a $R/variants.log; echo "   at $(( $(date +%s) - start )) s"; }
for shape in 8192x8192x8192 16384x28672x8192 4096x16384x7168; do
  v spin timeout 80 python .dev/dbg/variants.py $shape blockwise promoted 192:3 192:3:2 128:4:2
  v try env WAIT=try timeout 60 python .dev/dbg/variants.py $shape blockwise promoted 192:3:2 128:4:2
  v try100 env WAIT=try:100 timeout 60 python .dev/dbg/variants.py $shape blockwise promoted 192:3:2
done
v cluster-only env DBG_MC=0 DBG_PEER=0 timeout 60 python .dev/dbg/variants.py 8192x8192x8192 blockwise promoted 192:3 192:3:2 128:4 128:4:2
v spin timeout 60 python .dev/dbg/variants.py 8192x8192x8192 tensorwise fast 128:4 128:4:2
v try env WAIT=try timeout 60 python .dev/dbg/variants.py 8192x8192x8192 tensorwise fast 128:4:2
tar -C /tmp/runs -czf $OUT/waits.tgz waits
echo "all done at $(( $(date +%s) - start )) s"
