#!/bin/bash
# Post-refactor check on the H100: the committed square matmul command, then the GPU tests of the layers.
source tools/gpu-env.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv,noheader
mkdir -p $OUT/runs
( time timeout 330 fp8bench matmul --shape-gen square --granularity all --backend bf16 --backend cublas --out $OUT/runs/matmul-square ) > $OUT/runs/matmul-square.log 2>&1
tail -5 $OUT/runs/matmul-square.log
timeout 230 python -m pytest -q -m gpu tests/test_float8_linear.py tests/test_float8_layernorm_linear.py tests/test_gpu_benchmarks.py tests/test_gpu_backends.py -x 2>&1 | tail -8
cd $OUT && tar czf runs.tgz runs && rm -rf runs
