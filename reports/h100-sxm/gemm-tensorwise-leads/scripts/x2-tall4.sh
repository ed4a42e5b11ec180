#!/bin/bash
# Two H100s: the 192 x 128 tile with a fourth ring stage where it splits no tile (the split's partial-sum room holds the
# stage), beside the picks. GPU 0: blockwise on the 27 target shapes and four DeepSeek-V3-like products; GPU 1: the
# tensorwise and axiswise regimes on the products whose pick is 192 x 128.
start=$(date +%s)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version,memory.total --format=csv > /tmp/gpus.csv; cat /tmp/gpus.csv
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/tall4; mkdir -p $R; cp /tmp/gpus.csv $R/
( while sleep 20; do tar -C /tmp/runs -czf $OUT/tall4.tgz.tmp tall4 && mv $OUT/tall4.tgz.tmp $OUT/tall4.tgz; done ) & snap=$!
left() { echo $(( 560 - ($(date +%s) - start) )); }
c() { tag=$1; shift; l=$(left); [ $l -lt 30 ] && { echo "skip $tag"; return; }
  timeout $l python tools/gemm_sweep.py compare --out $R/$tag --quick "$@" > $R/$tag.log 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - start )) s"; grep -A12 "geomean per regime\|geometric mean of our" $R/$tag.log | grep "│"; }
S4='{"num_stages":4,"split_last_wave":false}'
UN='{"split_last_wave":false}'
ALL=$(python -c "import sys; sys.path.insert(0,'tools'); from gemm_sweep import target_shapes; print(' '.join('--shape '+s.name for s in target_shapes()))")
DS="--shape 4096x16384x7168 --shape 4096x7168x4096 --shape 4096x7168x7168 --shape 4096x16384x4096"
c blockwise --regime blockwise/fast_accum=off $ALL $DS --fields "$S4" --fields "$UN" & g0=$!
( export CUDA_VISIBLE_DEVICES=1
  c awkward --regime tensorwise/fast_accum=on --regime tensorwise/fast_accum=off --regime axiswise/fast_accum=on \
    --regime axiswise/fast_accum=off --shape 4096x4096x1040 --shape 4096x4096x1376 --shape 4096x7008x1376 \
    --shape 4096x7168x2112 --shape 16384x7168x2112 --fields "$S4" --fields "$UN" ) & g1=$!
wait $g0 $g1
kill $snap; tar -C /tmp/runs -czf $OUT/tall4.tgz tall4
echo "all done at $(( $(date +%s) - start )) s"
