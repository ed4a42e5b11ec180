#!/bin/bash
# ncu, ours against cuBLAS, on the awkward-N products where tensorwise trails most (M 4096, N 1040 / 1376).
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/prof; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
p() { tag=$1; left=$(( 560 - ($(date +%s) - start) )); [ $left -lt 60 ] && { echo "skip $tag"; return; }
  timeout $(( left < 150 ? left : 150 )) python tools/gemm_profile.py run --shape $2 --regime $3 --out $R/$tag > $R/$tag.log 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - start )) s"; grep -v Warning $R/$tag.log | head -40; }
p n1040 4096x4096x1040 tensorwise/fast_accum=on
p n1376-k7008 4096x7008x1376 tensorwise/fast_accum=on
FP8KERNELS_GEMM_CONFIG='{"block_m":128,"block_n":128,"num_stages":5,"split_last_wave":false}' p n1376-k7008-deep 4096x7008x1376 tensorwise/fast_accum=on
rm -f $R/*/*.ncu-rep; gzip -f $R/*/*.csv 2>/dev/null
tar -C /tmp/runs -czf $OUT/prof.tgz prof
echo "all done at $(( $(date +%s) - start )) s"
