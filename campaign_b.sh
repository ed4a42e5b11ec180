#!/bin/bash
# Post-refactor check on the H100: one roofline shape of the committed suite, and TransformerEngine in e2e.
source tools/gpu-env.sh
export FP8BENCH_GIT_REV=51119c7b72a4c6694554d6f5f1d91450df95c1b5
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader
mkdir -p $OUT/runs
( time timeout 400 fp8bench run suites/roofline.toml --only roofline-8192 --out $OUT/runs/roofline ) > $OUT/runs/roofline.log 2>&1
tail -25 $OUT/runs/roofline.log
cd /tmp && timeout 150 fp8bench e2e --implementation te --layers 1 --steps 4 --warmup 2 --out $OUT/runs/e2e-te-check 2>&1 | grep -v -i warn | tail -8
cd $OUT && tar czf runs.tgz runs && rm -rf runs
