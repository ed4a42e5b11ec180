#!/bin/bash
# H200: blockwise compare with the cluster heuristic, each pick's other form beside it.
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/h200; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
timeout 300 python tools/gemm_sweep.py compare --out $R/h200-compare --quick --multicast --regime blockwise/fast_accum=off > $R/compare.log 2>&1
echo "compare rc=$? at $(( $(date +%s) - start )) s"; grep -v "done$" $R/compare.log | grep -B3 -A40 "geometric mean"
timeout $(( 540 - ($(date +%s) - start) )) python tools/gemm_sweep.py compare --out $R/h200-compare-dsv3 --quick --multicast --regime blockwise/fast_accum=off --shape 4096x16384x7168 --shape 4096x7168x4096 --shape 4096x7168x7168 --shape 4096x16384x4096 > $R/compare-dsv3.log 2>&1
echo "compare-dsv3 rc=$? at $(( $(date +%s) - start )) s"; grep -v "done$" $R/compare-dsv3.log | grep -A6 "geometric mean"
tar -C /tmp/runs -czf $OUT/h200.tgz h200
echo "all done at $(( $(date +%s) - start )) s"
