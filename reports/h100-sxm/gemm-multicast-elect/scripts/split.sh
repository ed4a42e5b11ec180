#!/bin/bash
# The kernel with elect predicates and the cluster heuristic: cluster tests, then the blockwise compare (twins: the other form).
set -o pipefail
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/split; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
timeout 260 python -m pytest -q tests/test_kernels_gemm.py -m gpu -k cluster -p no:cacheprovider --tb=short -x > $R/gpu-tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - start )) s"; tail -3 $R/gpu-tests.log
timeout $(( 470 - ($(date +%s) - start) )) python tools/gemm_sweep.py compare --out $R/compare --quick --multicast --regime blockwise/fast_accum=off > $R/compare.log 2>&1
echo "compare rc=$? at $(( $(date +%s) - start )) s"; grep -v "done$" $R/compare.log | tail -52
timeout $(( 575 - ($(date +%s) - start) )) python tools/gemm_sweep.py compare --out $R/compare-dsv3 --quick --multicast --regime blockwise/fast_accum=off --shape 4096x16384x7168 --shape 4096x7168x4096 --shape 4096x7168x7168 --shape 4096x16384x4096 > $R/compare-dsv3.log 2>&1
echo "compare-dsv3 rc=$? at $(( $(date +%s) - start )) s"; grep -v "done$" $R/compare-dsv3.log | tail -25
tar -C /tmp/runs -czf $OUT/split.tgz split
echo "all done at $(( $(date +%s) - start )) s"
