#!/bin/bash
# Cluster bisect with spin waits: full / coupled (no multicast) / cluster-only, deeper rings; then an ncu profile.
start=$(date +%s)
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/bisect2; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpus.csv; cat $R/gpus.csv
v() { tag=$1; shift; env TAG=$tag TRITON_CACHE_DIR=/tmp/tc_$tag PYTHONPATH=$PWD/.dev/dbg:$PYTHONPATH "$@" 2>&1 | grep -v -i warn | tee -a $R/variants.log; echo "   at $(( $(date +%s) - start )) s"; }
v full timeout 120 python .dev/dbg/variants.py 8192x8192x8192 blockwise promoted 192:3 192:3:2 128:4 128:4:2 128:5 128:5:2 128:6:2
v coupled env DBG_MC=0 timeout 60 python .dev/dbg/variants.py 8192x8192x8192 blockwise promoted 192:3:2 128:4:2
v cluster-only env DBG_MC=0 DBG_PEER=0 timeout 60 python .dev/dbg/variants.py 8192x8192x8192 blockwise promoted 192:3:2 128:4:2
v tw-full timeout 60 python .dev/dbg/variants.py 8192x8192x8192 tensorwise fast 128:4 128:4:2 192:3 192:3:2
v tw-coupled env DBG_MC=0 timeout 60 python .dev/dbg/variants.py 8192x8192x8192 tensorwise fast 128:4:2 192:3:2
FP8KERNELS_GEMM_CONFIG='{"cluster_m": 2, "split_last_wave": false}' timeout $(( 560 - ($(date +%s) - start) )) python tools/gemm_profile.py run --shape 4096x16384x7168 --regime blockwise/fast_accum=off --out $R/blockwise-4096x16384x7168-multicast > $R/profile.log 2>&1
echo "profile rc=$? at $(( $(date +%s) - start )) s"; grep -v Warning $R/profile.log | head -40; rm -f $R/*/*.ncu-rep; gzip -f $R/*/*.csv
tar -C /tmp/runs -czf $OUT/bisect2.tgz bisect2
echo "all done at $(( $(date +%s) - start )) s"
