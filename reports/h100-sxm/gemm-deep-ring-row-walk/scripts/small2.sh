#!/bin/bash
# Low shapes: cuBLAS, the pick and tile / stage / cluster / split / group_m variants side by side (two rounds).
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/small2; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
v() { left=$(( 575 - ($(date +%s) - start) )); [ $left -lt 20 ] && { echo "skip $2"; return; }; timeout $(( left < $1 ? left : $1 )) python .dev/variants2.py "${@:2}" 2>&1 | grep -v -i warn >> $R/variants.log; echo "$2 $3 at $(( $(date +%s) - start )) s"; }
v 90 8192x8192x1280 tensorwise fast 128x256:3:1:1:1 128x256:3:1:1:4 128x256:3:1:0:1 128x128:4:1:1:1 128x128:5:1:0:1 128x128:4:2:0 192x128:3:1:1:1
v 90 8192x8192x1280 blockwise promoted 192x128:3:1:1:1 192x128:3:1:0:1 192x128:3:1:0 128x128:4o:1:1:1 128x128:4:2:0:1 192x128:3:2:0:1 192x128:3:2:0
v 90 4096x4096x4096 blockwise promoted 192x128:3:1:0 192x128:3:1:1:4 192x128:3:1:1:16 128x128:4o 128x128:5:1:0 128x128:4:2:0 128x128:5:2:0 192x128:3:2:0
v 70 8192x14336x4096 blockwise promoted 192x128:3:1:0 192x128:3:1:1:4 192x128:3:1:1:16 192x128:3:2:0 128x128:4:2:0
v 70 16384x8192x1280 blockwise promoted 128x128:4o:1:1:1 192x128:3:1:1:1 192x128:3:1:1:4 128x128:4:2:0:1 192x128:3:2:0:1
v 70 8192x8192x1280 tensorwise promoted 128x256:3:1:1:1 128x256:3:1:1:4 128x256:3:1:0:1
v 80 4096x16384x7168 blockwise promoted 192x128:3:1:0 192x128:3:1:1:4 192x128:3:1:1:16 192x128:3:2:0 128x128:4:2:0 128x128:5:2:0 192x128:3:2:0:4
grep SUMMARY $R/variants.log
tar -C /tmp/runs -czf $OUT/small2.tgz small2
echo "all done at $(( $(date +%s) - start )) s"
