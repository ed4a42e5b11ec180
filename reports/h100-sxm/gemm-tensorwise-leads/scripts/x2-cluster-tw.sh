#!/bin/bash
# Two H100s: tensorwise 2-CTA clusters multicasting B. GPU 0: the training products back to back under the power cap
# (tools/clock_trace.py --cases training), ours on the heuristic's picks and with cluster configs forced; GPU 1: the
# 27 target shapes, tensorwise fast and promoted, each pick beside the cluster configs (quick compare).
start=$(date +%s)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version,memory.total --format=csv > /tmp/gpus.csv; cat /tmp/gpus.csv
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=$1 PYTHONUNBUFFERED=1
R=/tmp/runs/cl; mkdir -p $R; cp /tmp/gpus.csv $R/
echo "installed at $(( $(date +%s) - start )) s"
( while sleep 20; do tar -C /tmp/runs -czf $OUT/cl.tgz.tmp cl && mv $OUT/cl.tgz.tmp $OUT/cl.tgz; done ) & snap=$!
left() { echo $(( 570 - ($(date +%s) - start) )); }
C192='{"block_m":192,"block_n":128,"cluster_m":2,"split_last_wave":false}'
C128='{"block_m":128,"block_n":128,"num_stages":4,"cluster_m":2,"split_last_wave":false}'
(
  export CUDA_VISIBLE_DEVICES=0
  for v in pick c192 c128 pick2; do
    case $v in c192) export FP8KERNELS_GEMM_CONFIG="$C192";; c128) export FP8KERNELS_GEMM_CONFIG="$C128";; *) unset FP8KERNELS_GEMM_CONFIG;; esac
    l=$(left); [ $l -lt 60 ] && { echo "skip trace $v"; continue; }
    timeout $l python tools/clock_trace.py $R/trace-$v --cases training > $R/trace-$v.log 2>&1
    echo "trace $v rc=$? at $(( $(date +%s) - start )) s"
    python - $R/trace-$v <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
for case, v in (s.items() if isinstance(s, dict) else []):
    if isinstance(v, dict):
        print(case, {k: v[k] for k in v if any(w in k for w in ("median_ms", "joules", "tflops", "clock_med"))})
PY
  done
) & g0=$!
(
  export CUDA_VISIBLE_DEVICES=1
  l=$(left); timeout $l python tools/gemm_sweep.py compare --out $R/compare-tw --quick --regime tensorwise/fast_accum=off \
    --regime tensorwise/fast_accum=on --fields "$C192" --fields "$C128" > $R/compare-tw.log 2>&1
  echo "compare rc=$? at $(( $(date +%s) - start )) s"; grep -A12 "geomean per regime\|geometric mean of our" $R/compare-tw.log | grep "│"
) & g1=$!
wait $g0 $g1
kill $snap; tar -C /tmp/runs -czf $OUT/cl.tgz cl
echo "all done at $(( $(date +%s) - start )) s"
