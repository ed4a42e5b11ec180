#!/bin/bash
# Low shapes: cuBLAS, the pick and tile / stage / cluster / split variants side by side; then ncu at 4096^3 blockwise
# and at the tp8 wqkv shard (M 8192) tensorwise fast.
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/small; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
v() { timeout $1 python .dev/variants2.py "${@:2}" 2>&1 | grep -v -i warn >> $R/variants.log; echo "$2 $3 rc=$? at $(( $(date +%s) - start )) s"; }
v 100 4096x4096x4096 blockwise promoted 192x128:3:1:0 128x128:4o 128x128:4 128x128:5 128x128:4:2:0 128x128:5:2:0 192x128:3:2:0
v 80 8192x8192x1280 tensorwise fast 128x256:3:1:0 128x128:4 128x128:5 192x128:3 128x128:4:2:0 128x128:5:2:0
v 80 8192x8192x1280 blockwise promoted 192x128:3:1:0 128x128:4o 128x128:5 128x128:4:2:0 128x128:5:2:0 192x128:3:2:0
v 70 4096x16384x7168 blockwise promoted 192x128:3:1:0 128x128:5 128x128:4:2:0 128x128:5:2:0 192x128:3:2:0
v 70 4096x7168x4096 blockwise promoted 192x128:3:1:0 128x128:5 128x128:4:2:0 128x128:5:2:0 192x128:3:2:0
grep SUMMARY $R/variants.log
p() { tag=$1; left=$(( 570 - ($(date +%s) - start) )); [ $left -lt 60 ] && { echo "skip $tag"; return; }; timeout $(( left < 150 ? left : 150 )) python tools/gemm_profile.py run --shape $2 --regime $3 --out $R/$tag > $R/$tag.log 2>&1; echo "$tag rc=$? at $(( $(date +%s) - start )) s"; grep -v Warning $R/$tag.log | head -30; }
p bw4096 4096x4096x4096 blockwise/fast_accum=off
p tw-wqkv 8192x8192x1280 tensorwise/fast_accum=on
rm -f $R/*/*.ncu-rep; gzip -f $R/*/*.csv 2>/dev/null
tar -C /tmp/runs -czf $OUT/small.tgz small
echo "all done at $(( $(date +%s) - start )) s"
