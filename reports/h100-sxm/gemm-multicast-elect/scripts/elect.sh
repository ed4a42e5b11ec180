#!/bin/bash
# Cluster with elect.sync predicates (uniform TMA issue in the producer) against the tid predicates.
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/elect; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
v() { tag=$1; shift; env TAG=$tag TRITON_CACHE_DIR=/tmp/tc_$tag PYTHONPATH=$PWD/.dev/dbg:$PYTHONPATH "$@" 2>&1 | grep -v -i warn | tee -a $R/variants.log; echo "   at $(( $(date +%s) - start )) s"; }
v elect env MCPRED=elect APPRED=elect timeout 60 python .dev/dbg/check.py
v elect env MCPRED=elect APPRED=elect timeout 120 python .dev/dbg/variants.py 8192x8192x8192 blockwise promoted 192:3 192:3:2 128:4 128:4:2 128:5:2
v tid timeout 60 python .dev/dbg/variants.py 8192x8192x8192 blockwise promoted 192:3:2 128:4:2
v elect env MCPRED=elect APPRED=elect timeout 90 python .dev/dbg/variants.py 4096x16384x7168 blockwise promoted 192:3 192:3:2 128:4 128:4:2
v elect env MCPRED=elect APPRED=elect timeout 90 python .dev/dbg/variants.py 8192x8192x8192 tensorwise fast 128:4 128:4:2 192:3 192:3:2
env MCPRED=elect APPRED=elect TRITON_CACHE_DIR=/tmp/tc_elect PYTHONPATH=$PWD/.dev/dbg:$PYTHONPATH timeout $(( 570 - ($(date +%s) - start) )) python tools/gemm_sweep.py compare --out $R/compare --quick --multicast --regime blockwise/fast_accum=off > $R/compare.log 2>&1
echo "compare rc=$? at $(( $(date +%s) - start )) s"; grep -v "done$" $R/compare.log | grep -A8 "geomean_ratio_with_variant\|over 27"
tar -C /tmp/runs -czf $OUT/elect.tgz elect
echo "all done at $(( $(date +%s) - start )) s"
