"""Times one shape and regime: cuBLAS, the heuristic's pick, and variants BMxBN:stages[:cluster[:split[:group_m]]] (split 1 =
the heuristic's last-wave split, 0 none; overlap only where the spec ends in 'o'), two rounds interleaved."""
import dataclasses, os, sys, torch
sys.path.insert(0, "tools")
from gemm_sweep import QUICK
from fp8bench.harness.timing import TimerChoice
from fp8bench.backends import Operands
from fp8bench.backends.cublas import scaled_mm_products, fastest
from fp8bench.config import Granularity as G2
from fp8kernels.gemm import fp8_gemm, gemm_config
from fp8kernels.gemm_configs import config_label
from fp8kernels.scaling import Granularity
import tests.test_kernels_gemm as T
M, K, N = map(int, sys.argv[1].split("x"))
g, fast = Granularity(sys.argv[2]), sys.argv[3] == "fast"
ops = T._quantized(M, K, N, g, seed=1)
gen = torch.Generator().manual_seed(1)
operands = Operands(T._random_bf16(M, K, gen).cuda(), T._random_bf16(N, K, gen).cuda())
products = scaled_mm_products(operands, G2(g.value), fast)
cublas = products[fastest(products)]
pick = gemm_config(M, N, K, g, fast, torch.device("cuda"))
timer = TimerChoice("cupti")
tag = os.environ.get("TAG", "")
cases = [("cublas", cublas), (f"pick {config_label(pick.options_for(M, N, K))}", None)]
for spec in sys.argv[4:]:
    overlap = "o" in spec
    parts = spec.replace("o", "").split(":")
    bm, bn = map(int, parts[0].split("x"))
    values = list(map(int, parts[1:]))
    stages, cluster, split, group = values + [1, 1, 0][len(values) - 1:]
    try:
        cfg = dataclasses.replace(pick, block_m=bm, block_n=bn, num_stages=stages, cluster_m=cluster,
                                  overlap_promotion=overlap, split_last_wave=bool(split), group_m=group or pick.group_m)
    except ValueError as e:
        print(f"{tag:>10} {sys.argv[1]} {spec}: invalid: {e}", flush=True)
        continue
    cases.append((spec, cfg))
ms = {name: [] for name, _ in cases}
for rnd in range(2):
    for name, cfg in cases:
        if name == "cublas":
            fn = cublas
        else:
            c = pick if cfg is None else cfg
            fn = lambda c=c: fp8_gemm(*ops, granularity=g, fast_accum=fast, config=c)
        try:
            m = timer.measure(fn, QUICK)
        except Exception as e:
            print(f"{tag:>10} {sys.argv[1]} {name}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        ms[name].append(m.median_ms)
        print(f"{tag:>10} {sys.argv[1]} {g.value}{' fast' if fast else ''} {name:>40}: {m.median_ms:.4f} ms "
              f"{2 * M * N * K / m.median_ms / 1e9:.0f} TFLOPS (spread {m.spread_pct:.1f}%, round {rnd})", flush=True)
base = sorted(ms["cublas"])[len(ms["cublas"]) // 2] if ms["cublas"] else None
for name, v in ms.items():
    if v and base:
        print(f"SUMMARY {tag} {sys.argv[1]} {g.value}{' fast' if fast else ''} {name:>40}: ours/cublas {base / min(v):.3f} (best of {len(v)})")
