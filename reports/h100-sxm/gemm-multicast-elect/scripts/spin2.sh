#!/bin/bash
# Cluster waits: tests on the kernel (spin waits), then wait variants side by side, then compare --multicast.
set -o pipefail
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/spin; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
left() { echo $(( ${LIMIT:-585} - ($(date +%s) - start) )); }
timeout 200 python -m pytest -q tests/test_kernels_gemm.py -m gpu -k cluster -p no:cacheprovider --tb=short -x > $R/gpu-tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - start )) s"; tail -5 $R/gpu-tests.log
for w in ${WAITS:-spin try}; do
  for shape in 8192x8192x8192 4096x16384x7168; do
    WAIT=$w TAG=$w TRITON_CACHE_DIR=/tmp/tc_$w PYTHONPATH=$PWD/.dev/dbg:$PYTHONPATH timeout 100 python .dev/dbg/variants.py $shape blockwise promoted 192:3 192:3:2 128:4 128:4:2 2>&1 | grep -v -i warn | tee -a $R/variants.log
    echo "   at $(( $(date +%s) - start )) s"
  done
done
timeout $(left) python tools/gemm_sweep.py compare --out $R/compare --quick --multicast --regime blockwise/fast_accum=off > $R/compare.log 2>&1
echo "compare rc=$? at $(( $(date +%s) - start )) s"; grep -v "done$" $R/compare.log | tail -45
tar -C /tmp/runs -czf $OUT/spin.tgz spin
echo "all done at $(( $(date +%s) - start )) s"
