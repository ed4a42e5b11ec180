#!/bin/bash
# Two H100s: GPU 0 forced-field variants beside the heuristic's picks (the five-stage 128 x 128 tile on short
# products whose B stays in L2; blockwise variants on the DeepSeek-V3-like products); GPU 1 the promoted regimes on
# the 27 target shapes, then the roofline layer at 16384^3 (tensorwise and blockwise, ours beside TE).
start=$(date +%s)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version,memory.total --format=csv > /tmp/gpus.csv; cat /tmp/gpus.csv
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/x2; mkdir -p $R; cp /tmp/gpus.csv $R/
echo "installed at $(( $(date +%s) - start )) s"
( while sleep 20; do tar -C /tmp/runs -czf $OUT/x2.tgz.tmp x2 && mv $OUT/x2.tgz.tmp $OUT/x2.tgz; done ) & snap=$!
left() { echo $(( 570 - ($(date +%s) - start) )); }
c() { tag=$1; shift; l=$(left); [ $l -lt 30 ] && { echo "skip $tag"; return; }
  timeout $l python tools/gemm_sweep.py compare --out $R/$tag --quick "$@" > $R/$tag.log 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - start )) s"; grep -A12 "geomean per regime\|geometric mean of our" $R/$tag.log | grep "│"; }
DEEP='{"block_m":128,"block_n":128,"num_stages":5,"split_last_wave":false}'
WALK="--shape 8192x8192x1280 --shape 4096x4096x2000 --shape 4096x4096x1376 --shape 4096x7008x1376 --shape 4096x4096x1040
 --shape 8192x8192x1024 --shape 8192x4096x1024 --shape 4096x8192x1024 --shape 4096x4096x2048 --shape 8192x2048x2048
 --shape 16384x1024x1024 --shape 16384x8192x1024"
(
  export CUDA_VISIBLE_DEVICES=0
  c deep-walk-fast --regime tensorwise/fast_accum=on --regime axiswise/fast_accum=on $WALK --fields "$DEEP"
  c deep-walk-promoted --regime tensorwise/fast_accum=off --regime axiswise/fast_accum=off $WALK --fields "$DEEP"
  c dsv3-blockwise --regime blockwise/fast_accum=off --shape 4096x16384x4096 --shape 4096x7168x7168 --shape 4096x16384x7168 \
    --shape 4096x7168x4096 --shape 8192x8192x8192 --fields "$DEEP" --fields '{"split_last_wave":false}' \
    --fields '{"block_m":128,"block_n":128,"num_stages":4,"overlap_promotion":true}'
) & g0=$!
(
  export CUDA_VISIBLE_DEVICES=1
  c promoted-27 --regime tensorwise/fast_accum=off --regime axiswise/fast_accum=off
  l=$(left); timeout $l fp8bench run suites/roofline.toml --only roofline-16384-tensorwise-blockwise --out $R/roofline > $R/roofline.log 2>&1
  echo "roofline rc=$? at $(( $(date +%s) - start )) s"; grep -i "gemm\|ms" $R/roofline.log | tail -30
) & g1=$!
wait $g0 $g1
kill $snap; tar -C /tmp/runs -czf $OUT/x2.tgz x2
echo "all done at $(( $(date +%s) - start )) s"
