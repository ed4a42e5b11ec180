# A/B on the GPU: the tensorwise quantize (amax pass + cast pass) with the cast pass walking its tiles from
# the end of x (this revision) against the previous revision's 2-D grid walking from the start, same run,
# alternating, CUPTI kernel time with L2 flushed before each call (as fp8bench cast times it).
import importlib.util
import json
import os
import statistics
import sys

import torch
import triton

from fp8bench.config import TimingConfig
from fp8bench.env import run_metadata
from fp8bench.timing import TimerChoice
from fp8kernels import reference as ref
from fp8kernels._quantize_common import empty_fp8, empty_scales, fp8_constants, launch_config
from fp8kernels.quantize import QuantizeSpec
from fp8kernels.quantize_configs import QuantizeKernel
from fp8kernels.quantize_tensorwise import quantize_tensorwise, tensor_amax

spec_ = importlib.util.spec_from_file_location("old_tw", ".probe/old_quantize_tensorwise.py")
old = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(old)


def quantize_old(x, spec):
    config = launch_config(x, QuantizeKernel.TENSORWISE, spec.columnwise, None)
    amax = tensor_amax(x, config)
    rows, cols = x.shape
    q, q_t = empty_fp8((rows, cols), spec, x, spec.rowwise), empty_fp8((cols, rows), spec, x, spec.columnwise)
    scale = empty_scales((), x, True)
    grid = (triton.cdiv(rows, config.block_rows), triton.cdiv(cols, config.block_cols))
    old._cast_tensorwise_kernel[grid](
        x, q, q_t, scale, amax, amax, rows, cols, **fp8_constants(spec), ROWWISE=True, COLUMNWISE=spec.columnwise,
        RECORD_AMAX=False, BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols, num_warps=config.num_warps,
    )
    return q, q_t, scale


out_dir = os.path.join(os.environ["OUT_DIR"])
os.makedirs(out_dir, exist_ok=True)
timer = TimerChoice("cupti")
timing = TimingConfig(repeats=3)
rows = []
for shape in ((4096, 8192), (8192, 8192), (8192, 28672), (16384, 16384)):
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    copy_dst = torch.empty_like(x)
    copy = timer.measure(lambda: copy_dst.copy_(x), timing).median_ms
    for columnwise in (False, True):
        spec = QuantizeSpec(ref.E4M3, False, rowwise=True, columnwise=columnwise)
        new_out, old_out = quantize_tensorwise(x, spec), quantize_old(x, spec)
        assert torch.equal(new_out.data.view(torch.uint8), old_out[0].view(torch.uint8))
        assert torch.equal(new_out.scale, old_out[2])
        if columnwise:
            assert torch.equal(new_out.data_t.view(torch.uint8), old_out[1].view(torch.uint8))
        times = {"reverse": [], "forward": []}
        for _ in range(3):
            times["forward"] += timer.measure(lambda: quantize_old(x, spec), timing).repeat_ms
            times["reverse"] += timer.measure(lambda: quantize_tensorwise(x, spec), timing).repeat_ms
        least = x.numel() * (x.element_size() + 1 + columnwise)
        row = {"shape": f"{shape[0]}x{shape[1]}", "mib": x.numel() * 2 / 2**20, "copies": 1 + columnwise, "copy_ms": copy}
        for name, ms in times.items():
            median = statistics.median(ms)
            row[f"{name}_ms"] = median
            row[f"{name}_spread_pct"] = 100 * (max(ms) - min(ms)) / median
            row[f"{name}_pct_of_copy"] = 100 * (least / median) / (2 * x.numel() * 2 / copy)
        row["forward_over_reverse"] = row["forward_ms"] / row["reverse_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    del x, copy_dst
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(out_dir, "ab.json"), "w"), indent=1)
json.dump(run_metadata("python .probe/tw_reverse_ab.py"), open(os.path.join(out_dir, "metadata.json"), "w"), indent=1, default=str)
