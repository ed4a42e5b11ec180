#!/bin/bash
# ncu: single CTA, cluster with no cross-CTA traffic, full cluster, 8192^3 blockwise.
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/prof2; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
p() { tag=$1; shift; env "$@" timeout 150 python tools/gemm_profile.py run --shape 8192x8192x8192 --regime blockwise/fast_accum=off --out $R/$tag > $R/$tag.log 2>&1; echo "$tag rc=$? at $(( $(date +%s) - start )) s"; grep -v Warning $R/$tag.log | head -24; }
p single FP8KERNELS_GEMM_CONFIG='{"split_last_wave": false}'
p cluster-only DBG_MC=0 DBG_PEER=0 PYTHONPATH=$PWD/.dev/dbg:$PYTHONPATH TRITON_CACHE_DIR=/tmp/tc_dbg FP8KERNELS_GEMM_CONFIG='{"cluster_m": 2, "split_last_wave": false}'
p cluster FP8KERNELS_GEMM_CONFIG='{"cluster_m": 2, "split_last_wave": false}'
rm -f $R/*/*.ncu-rep; gzip -f $R/*/*.csv
tar -C /tmp/runs -czf $OUT/prof2.tgz prof2
echo "all done at $(( $(date +%s) - start )) s"
