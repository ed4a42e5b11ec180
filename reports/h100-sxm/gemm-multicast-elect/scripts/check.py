"""The cluster's output against the single CTA's, bit for bit, on a few shapes (blockwise and tensorwise fast)."""
import dataclasses, sys, torch
from fp8kernels.gemm import fp8_gemm, gemm_config
from fp8kernels.scaling import Granularity
import tests.test_kernels_gemm as T
for (M, K, N), g, fast in (((5000, 4096, 2048), Granularity.BLOCKWISE, False), ((1040, 1152, 1296), Granularity.TENSORWISE, True)):
    ops = T._quantized(M, K, N, g, seed=3)
    single = dataclasses.replace(gemm_config(M, N, K, g, fast, torch.device("cuda")), split_last_wave=False, block_n=128)
    ref = fp8_gemm(*ops, granularity=g, fast_accum=fast, config=single)
    out = fp8_gemm(*ops, granularity=g, fast_accum=fast, config=dataclasses.replace(single, cluster_m=2))
    torch.cuda.synchronize()
    print(M, K, N, g.value, fast, single.block_m, "bit-identical" if torch.equal(out, ref) else "DIFFERENT", flush=True)
