"""How many 2-CTA clusters of the multicast kernel fit on the GPU at once (cuOccupancyMaxActiveClusters), and its
time against the number of clusters launched, beside the single-CTA pick and cuBLAS."""
import ctypes, dataclasses, sys, torch
sys.path.insert(0, "tools")
from gemm_sweep import QUICK
from fp8bench.harness.timing import TimerChoice
from fp8kernels.gemm import fp8_gemm, gemm_config
from fp8kernels import _gemm_ws
from fp8kernels.scaling import Granularity
import tests.test_kernels_gemm as T

class Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]
class Config(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint), ("by", ctypes.c_uint),
                ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(Attr)), ("n", ctypes.c_uint)]
cuda = ctypes.CDLL("libcuda.so.1")

def max_active_clusters(kernel):
    attr = Attr(); attr.id = 4; attr.value[0], attr.value[1], attr.value[2] = 2, 1, 1  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cfg = Config(132 * 2, 1, 1, 32 * kernel.metadata.num_warps, 1, 1, kernel.metadata.shared, None, ctypes.pointer(attr), 1)
    count = ctypes.c_int(-1)
    rc = cuda.cuOccupancyMaxActiveClusters(ctypes.byref(count), ctypes.c_void_p(kernel.function), ctypes.byref(cfg))
    return rc, count.value

timer = TimerChoice("cupti")
g = Granularity.BLOCKWISE
for M, K, N in ((4096, 16384, 7168), (8192, 8192, 8192)):
    ops = T._quantized(M, K, N, g, seed=1)
    pick = gemm_config(M, N, K, g, False, torch.device("cuda"))
    base = dataclasses.replace(pick, split_last_wave=False)
    flops = 2 * M * N * K
    def t(cfg):
        m = timer.measure(lambda: fp8_gemm(*ops, granularity=g, fast_accum=False, config=cfg), QUICK)
        return f"{m.median_ms:.3f} ms {flops / m.median_ms / 1e9:.0f} TFLOPS"
    from fp8bench.backends import REGISTRY
    print(M, K, N, "pick", pick.block_m, pick.block_n, t(pick), "unsplit", t(base), flush=True)
    out = fp8_gemm(*ops, granularity=g, fast_accum=False, config=dataclasses.replace(base, cluster_m=2))
    kernel = next(k for k, _ in _gemm_ws._COMPILED.values() if k.metadata.num_ctas == 2)
    print("  max active clusters", max_active_clusters(kernel), flush=True)
    for sms in (132, 128, 124, 120, 116, 112, 100, 88):
        print("  cluster on", sms // 2, "clusters:", t(dataclasses.replace(base, cluster_m=2, num_sms=sms)), flush=True)
