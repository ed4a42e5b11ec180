# LayerNorm + delayed tensorwise cast, kernel time: our fused kernel (every candidate config), against torch's
# LayerNorm alone, inductor's LayerNorm + delayed cast (the torch ops Float8Linear's compiled delayed cast
# runs: fp8bench.float8_linear._delayed_in_producer), and the device copy of x. CUPTI, L2 flushed per call.
import json
import os
import sys

import torch
import torch.nn.functional as F

from fp8bench.env import run_metadata
from fp8bench.timing import CuptiTimer, GpuClock
from fp8kernels import reference
from fp8kernels.layernorm_cast import layernorm_cast_tensorwise
from fp8kernels.quantize import QuantizeSpec
from fp8kernels.quantize_configs import QuantizeKernel, candidates, multiprocessors

OUT = os.environ["OUT_DIR"]
os.makedirs(OUT, exist_ok=True)
timer = CuptiTimer(GpuClock(True))
CALLS = 30
spec = QuantizeSpec(columnwise=False)


def inductor_form(x, history):
    y = F.layer_norm(x, (x.shape[1],))
    recorded = history.max()
    data, scale = reference.quantize_with_amax(y, torch.where(recorded > 0, recorded, 448.0), reference.E4M3, False)
    return data, scale, y.abs().amax(dim=1).amax().float()


compiled = torch.compile(inductor_form, dynamic=False)
rows = []
for dims in ((8192, 4096), (8192, 8192), (8192, 14336), (8192, 28672), (16384, 16384), (16384, 8192)):
    x = torch.randn(*dims, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
    history = torch.full((16,), 5.0, device="cuda")
    amax = history.max()
    destination = torch.empty_like(x)
    copy_ms = sum(timer.kernel_ms(lambda: destination.copy_(x), CALLS).values())
    copy_gbps = 2 * x.numel() * 2 / copy_ms / 1e6
    least_bytes = x.numel() * 3  # bf16 read, fp8 written

    def record(name, kernels, config=None):
        ms = sum(kernels.values())
        row = {"shape": "x".join(map(str, dims)), "impl": name, "ms": round(ms, 5), "pct_copy": round(100 * least_bytes / ms / 1e6 / copy_gbps, 1),
               "config": config, "kernels": {k[:80]: round(v, 5) for k, v in kernels.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)

    ref_out = F.layer_norm(x.float(), (dims[1],))
    ref_q, _ = reference.quantize_with_amax(ref_out, amax)
    configs = candidates(QuantizeKernel.LAYERNORM_CAST, *dims, False, multiprocessors(x))
    for index, config in enumerate(configs):
        recorded = torch.zeros((), device="cuda")
        out = layernorm_cast_tensorwise(x, None, None, 1e-5, amax, spec, recorded, config)
        differ = (out.quantized.data.view(torch.uint8) != ref_q.view(torch.uint8)).float().mean().item()
        fn = lambda: layernorm_cast_tensorwise(x, None, None, 1e-5, amax, spec, torch.zeros((), device="cuda"), config)
        fn()
        record("ours" + (" (default)" if index == 0 else ""), timer.kernel_ms(fn, CALLS), {**config.as_dict(), "fp8_differ_frac": differ})
    record("torch layer_norm alone", timer.kernel_ms(lambda: F.layer_norm(x, (dims[1],)), CALLS))
    for _ in range(2):
        compiled(x, history)
    record("inductor layer_norm + delayed cast", timer.kernel_ms(lambda: compiled(x, history), CALLS))
    del x, destination
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(OUT, "ln_cast_probe.json"), "w"), indent=1)
json.dump(run_metadata("python .probe/ln_cast_probe.py"), open(os.path.join(OUT, "metadata.json"), "w"), indent=1, default=str)
