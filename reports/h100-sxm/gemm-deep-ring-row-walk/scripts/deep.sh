#!/bin/bash
# The heuristic with the five-stage whole 128 x 128 tile and the row walk, each pick beside the previous heuristic's
# (--candidate: the old constants), every regime, the 27 target shapes and four DeepSeek-V3-like products.
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/deep; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
OLD="--candidate fast.DEEP_NARROW_GLUON=0 --candidate promoted.DEEP_NARROW_GLUON=0 --candidate blockwise.DEEP_NARROW_BLOCKWISE_GLUON=0 --candidate GROUPED_WALK_MIN_WAVES=0"
SH="--shape 4096x16384x7168 --shape 4096x7168x4096 --shape 4096x7168x7168 --shape 4096x16384x4096"
ALL=$(python -c "import sys; sys.path.insert(0,'tools'); from gemm_sweep import target_shapes; print(' '.join('--shape '+s.name for s in target_shapes()))")
c() { tag=$1; shift; left=$(( 585 - ($(date +%s) - start) )); [ $left -lt 30 ] && { echo "skip $tag"; return; }
  timeout $left python tools/gemm_sweep.py compare --out $R/$tag --quick $OLD $ALL $SH "$@" > $R/$tag.log 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - start )) s"; grep -v "done$" $R/$tag.log | grep -A8 "geometric mean\|with the variant" | grep -v "^$" | tail -14; }
shift
for regime in "$@"; do c ${regime%%/*}-${regime##*=} --regime $regime; done
tar -C /tmp/runs -czf $OUT/deep.tgz deep
echo "all done at $(( $(date +%s) - start )) s"
