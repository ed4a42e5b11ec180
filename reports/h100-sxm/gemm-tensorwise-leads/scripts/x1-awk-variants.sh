#!/bin/bash
# One H100: the unaligned and skinny products (and 1536^3, 3072^3), each pick beside the four-stage 192-row tile
# (where the pick is another tile), that tile as a 2-CTA cluster multicasting B, and the five-stage 128 x 128 tile.
start=$(date +%s)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version,memory.total --format=csv > /tmp/gpus.csv; cat /tmp/gpus.csv
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/awkv; mkdir -p $R; cp /tmp/gpus.csv $R/
( while sleep 20; do tar -C /tmp/runs -czf $OUT/awkv.tgz.tmp awkv && mv $OUT/awkv.tgz.tmp $OUT/awkv.tgz; done ) & snap=$!
SH=$(python -c "
from fp8bench.benchmarks.shapes import SHAPE_GENERATORS as G
print(' '.join(f'--shape {s.M}x{s.K}x{s.N}' for s in G['awkward']() if s.M == 4096 and ('unaligned' in s.name or 'skinny' in s.name)))")
T4='{"block_m":192,"block_n":128,"num_stages":4,"split_last_wave":false}'
T4C='{"block_m":192,"block_n":128,"num_stages":4,"split_last_wave":false,"cluster_m":2}'
D5='{"block_m":128,"block_n":128,"num_stages":5,"split_last_wave":false}'
timeout 420 python tools/gemm_sweep.py compare --out $R/variants --quick $SH --shape 1536x1536x1536 --shape 3072x3072x3072 \
  --regime tensorwise/fast_accum=on --regime tensorwise/fast_accum=off --regime axiswise/fast_accum=on \
  --fields "$T4" --fields "$T4C" --fields "$D5" > $R/variants.log 2>&1
echo "variants rc=$? at $(( $(date +%s) - start )) s"; grep -A8 "geomean per regime" $R/variants.log | grep "│"
kill $snap; tar -C /tmp/runs -czf $OUT/awkv.tgz awkv
echo "all done at $(( $(date +%s) - start )) s"
