"""Times one shape and regime: the single-CTA twin of the pick and cluster variants given as block_m:stages[:cluster]."""
import dataclasses, os, sys, torch
sys.path.insert(0, "tools")
from gemm_sweep import QUICK
from fp8bench.harness.timing import TimerChoice
from fp8kernels.gemm import fp8_gemm, gemm_config
from fp8kernels.scaling import Granularity
import tests.test_kernels_gemm as T
M, K, N = map(int, sys.argv[1].split("x"))
g, fast = Granularity(sys.argv[2]), sys.argv[3] == "fast"
ops = T._quantized(M, K, N, g, seed=1)
pick = dataclasses.replace(gemm_config(M, N, K, g, fast, torch.device("cuda")), split_last_wave=False)
timer = TimerChoice("cupti")
tag = os.environ.get("TAG", "")
for spec in sys.argv[4:]:
    bm, stages, cluster = (list(map(int, spec.split(":"))) + [1])[:3]
    cfg = dataclasses.replace(pick, block_m=bm, block_n=128, num_stages=stages, cluster_m=cluster, overlap_promotion=False)
    m = timer.measure(lambda: fp8_gemm(*ops, granularity=g, fast_accum=fast, config=cfg), QUICK)
    print(f"{tag:>14} {sys.argv[1]} {g.value}{' fast' if fast else ''} {bm}x128 s{stages} cluster {cluster}: {m.median_ms:.3f} ms "
          f"{2 * M * N * K / m.median_ms / 1e9:.0f} TFLOPS (spread {m.spread_pct:.1f}%)", flush=True)
