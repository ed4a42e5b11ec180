# LayerNorm + 1x128 cast of both copies: our fused pair of kernels (fp8kernels.layernorm_cast_blockwise) against
# torch's LayerNorm followed by our blockwise quantize kernel (both copies), and inductor compiling
# LayerNorm followed by that custom op (what ours compiled ran before). CUPTI, L2 flushed per call.
import json
import os

import torch
import torch.nn.functional as F

from fp8bench import _float8_ops as ops
from fp8bench.env import run_metadata
from fp8bench.timing import CuptiTimer, GpuClock
from fp8kernels.layernorm_cast import layernorm_cast_blockwise
from fp8kernels.quantize import QuantizeSpec

OUT = os.environ["OUT_DIR"]
os.makedirs(OUT, exist_ok=True)
timer = CuptiTimer(GpuClock(True))
spec = QuantizeSpec(columnwise=True)


def unfused(x):
    return ops.quantize(F.layer_norm(x, (x.shape[1],)), "blockwise", 1, "e4m3", False, True, True)


compiled = torch.compile(unfused, dynamic=False)
rows = []
for dims in ((8192, 4096), (8192, 14336), (16384, 16384), (8192, 28672)):
    x = torch.randn(*dims, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
    destination = torch.empty_like(x)
    copy_ms = sum(timer.kernel_ms(lambda: destination.copy_(x), 30).values())
    copy_gbps = 2 * x.numel() * 2 / copy_ms / 1e6
    for name, fn in (("ours fused", lambda: layernorm_cast_blockwise(x, None, None, 1e-5, spec)),
                     ("torch LN + our blockwise cast", lambda: unfused(x)), ("inductor LN + our blockwise cast", lambda: compiled(x))):
        for _ in range(2):
            fn()
        kernels = timer.kernel_ms(fn, 30)
        ms = sum(kernels.values())
        row = {"shape": "x".join(map(str, dims)), "impl": name, "ms": round(ms, 5),
               "pct_copy_least": round(100 * x.numel() * 4 / ms / 1e6 / copy_gbps, 1),  # 2 read + 2 written
               "kernels": {k[:80]: round(v, 5) for k, v in kernels.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    del x, destination
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(OUT, "ln_bw_probe.json"), "w"), indent=1)
json.dump(run_metadata("python .probe/ln_bw_probe.py"), open(os.path.join(OUT, "metadata.json"), "w"), indent=1, default=str)
