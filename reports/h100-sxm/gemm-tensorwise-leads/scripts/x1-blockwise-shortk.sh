#!/bin/bash
# One H100, blockwise: the products of K <= 1024 whose 192-row pick now runs four stages unsplit, each beside the
# previous pick (--candidate DEEP_TALL_BLOCKWISE_MAX_K=0); then products of K 1536-2048 with four stages forced.
start=$(date +%s)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version,memory.total --format=csv > /tmp/gpus.csv; cat /tmp/gpus.csv
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/bsk; mkdir -p $R; cp /tmp/gpus.csv $R/
( while sleep 20; do tar -C /tmp/runs -czf $OUT/bsk.tgz.tmp bsk && mv $OUT/bsk.tgz.tmp $OUT/bsk.tgz; done ) & snap=$!
K1="--shape 8192x1024x8192 --shape 16384x1024x8192 --shape 16384x1024x16384 --shape 16384x1024x2048 --shape 16384x1024x4096
 --shape 2048x1024x16384 --shape 4096x1024x16384 --shape 4096x1024x8192 --shape 8192x1024x16384 --shape 8192x1024x4096
 --shape 4096x512x32768 --shape 16384x512x32768"
K2="--shape 4096x2048x8192 --shape 8192x2048x4096 --shape 16384x2048x2048 --shape 8192x2048x8192 --shape 16384x2048x4096 --shape 4096x1536x24576"
timeout 250 python tools/gemm_sweep.py compare --out $R/k1024 --quick --regime blockwise/fast_accum=off $K1 --candidate DEEP_TALL_BLOCKWISE_MAX_K=0 > $R/k1024.log 2>&1
echo "k1024 rc=$? at $(( $(date +%s) - start )) s"; grep -A6 "geomean per regime" $R/k1024.log | grep "│"
timeout $(( 440 - ($(date +%s) - start) )) python tools/gemm_sweep.py compare --out $R/k2048 --quick --regime blockwise/fast_accum=off $K2 --fields '{"num_stages":4,"split_last_wave":false}' > $R/k2048.log 2>&1
echo "k2048 rc=$? at $(( $(date +%s) - start )) s"; grep -A6 "geomean per regime" $R/k2048.log | grep "│"
kill $snap; tar -C /tmp/runs -czf $OUT/bsk.tgz bsk
echo "all done at $(( $(date +%s) - start )) s"
