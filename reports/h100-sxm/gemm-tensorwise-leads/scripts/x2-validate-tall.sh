#!/bin/bash
# Two H100s at the four-stage 192-row rule. GPU 0: the Gluon kernel's GPU tests on the new candidate and the picks at
# real sizes; then the pow2-extended products it changes, beside the previous picks. GPU 1: the unaligned and skinny
# awkward products through fp8bench matmul (BF16, cuBLAS, ours).
start=$(date +%s)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version,memory.total --format=csv > /tmp/gpus.csv; cat /tmp/gpus.csv
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/val; mkdir -p $R; cp /tmp/gpus.csv $R/
( while sleep 20; do tar -C /tmp/runs -czf $OUT/val.tgz.tmp val && mv $OUT/val.tgz.tmp $OUT/val.tgz; done ) & snap=$!
left() { echo $(( 560 - ($(date +%s) - start) )); }
( export CUDA_VISIBLE_DEVICES=0
  timeout 240 python -m pytest -q -m gpu tests/test_kernels_gemm.py -k "(gluon_kernel and m192-n128-stages4) or real_sizes" > $R/gpu-tests.log 2>&1
  echo "gpu tests rc=$? at $(( $(date +%s) - start )) s"; tail -3 $R/gpu-tests.log
  timeout $(left) python tools/gemm_sweep.py compare --out $R/pow2-compare --quick --shape 1536x1536x1536 --shape 3072x3072x3072 \
    --regime tensorwise/fast_accum=on --regime tensorwise/fast_accum=off --regime axiswise/fast_accum=on --regime axiswise/fast_accum=off \
    --candidate DEEP_NARROW_MAX_MACS=0 > $R/pow2-compare.log 2>&1
  echo "pow2 compare rc=$? at $(( $(date +%s) - start )) s"; grep -A8 "candidate\|geomean per regime" $R/pow2-compare.log | grep "│" ) & g0=$!
( export CUDA_VISIBLE_DEVICES=1
  timeout $(left) fp8bench matmul --shape-gen awkward --shape-name unaligned --shape-name skinny --out $R/matmul-unaligned > $R/matmul-unaligned.log 2>&1
  echo "matmul rc=$? at $(( $(date +%s) - start )) s"; tail -5 $R/matmul-unaligned.log ) & g1=$!
wait $g0 $g1
kill $snap; tar -C /tmp/runs -czf $OUT/val.tgz val
echo "all done at $(( $(date +%s) - start )) s"
