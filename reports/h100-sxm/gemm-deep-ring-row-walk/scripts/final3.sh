#!/bin/bash
# The final heuristic on the 27 target shapes and four DeepSeek-V3-like products, blockwise and tensorwise with fast
# accumulation, each changed pick beside the previous heuristic's (--candidate: the old constants).
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/final3; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
OLD="--candidate blockwise.DEEP_NARROW_BLOCKWISE_GLUON=0 --candidate ROW_WALK_MAX_B_SHARE=0"
SH="--shape 4096x16384x7168 --shape 4096x7168x4096 --shape 4096x7168x7168 --shape 4096x16384x4096"
ALL=$(python -c "import sys; sys.path.insert(0,'tools'); from gemm_sweep import target_shapes; print(' '.join('--shape '+s.name for s in target_shapes()))")
c() { tag=$1; shift; left=$(( 585 - ($(date +%s) - start) )); [ $left -lt 30 ] && { echo "skip $tag"; return; }
  timeout $left python tools/gemm_sweep.py compare --out $R/$tag --quick $OLD $ALL $SH "$@" > $R/$tag.log 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - start )) s"; grep -A7 "geometric mean of our\|geomean per regime" $R/$tag.log | grep "│"; }
c blockwise --regime blockwise/fast_accum=off
c tensorwise-fast --regime tensorwise/fast_accum=on
c axiswise-fast --regime axiswise/fast_accum=on
tar -C /tmp/runs -czf $OUT/final3.tgz final3
echo "all done at $(( $(date +%s) - start )) s"
