#!/bin/bash
# Correctness of the five-stage tile and the row walk (GPU tests), then each changed pick beside the previous heuristic's.
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/validate2; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
timeout 150 python -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/test_kernels_gemm.py -k "(gluon_kernel and stages5) or real_sizes" > $R/gpu-tests.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - start )) s"; tail -3 $R/gpu-tests.log
c() { tag=$1; shift; left=$(( 585 - ($(date +%s) - start) )); [ $left -lt 30 ] && { echo "skip $tag"; return; }
  timeout $left python tools/gemm_sweep.py compare --out $R/$tag --quick "$@" > $R/$tag.log 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - start )) s"; grep -A7 "geomean per regime" $R/$tag.log | grep "│"; }
c blockwise --regime blockwise/fast_accum=off --candidate blockwise.DEEP_NARROW_BLOCKWISE_GLUON=0 --candidate ROW_WALK_MAX_B_SHARE=0 \
  --shape 4096x4096x4096 --shape llama3-70b-tp8.wqkv.M8192 --shape llama3-70b-tp8.wqkv.M16384 --shape llama3-70b-tp8.wo.M8192 \
  --shape llama3-70b-tp8.wo.M16384 --shape 4096x7168x4096 --shape 2048x7168x4096 --shape 1024x4096x28672 --shape 4096x4096x7008 \
  --shape 512x4096x28672 --shape 4096x1040x4096 --shape 4096x2000x7008 --shape 8192x2048x4096 --shape 4096x16384x1024 \
  --shape 2048x2048x2048 --shape 1000x14336x4096
c walk --regime tensorwise/fast_accum=on --regime tensorwise/fast_accum=off --regime axiswise/fast_accum=on --regime axiswise/fast_accum=off \
  --candidate ROW_WALK_MAX_B_SHARE=0 --shape llama3-70b-tp8.wqkv.M8192 --shape llama3-70b-tp8.wqkv.M16384 --shape llama3-70b-tp8.wo.M8192 \
  --shape llama3-70b-tp8.wo.M16384 --shape 2048x2048x2048 --shape 4096x1040x4096 --shape 4096x4096x1376 --shape 4096x7008x1376
tar -C /tmp/runs -czf $OUT/validate2.tgz validate2
echo "all done at $(( $(date +%s) - start )) s"
