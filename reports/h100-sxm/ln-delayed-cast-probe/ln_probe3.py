# Follow-up 2: formulations of the delayed cast's amax that might keep inductor from computing LayerNorm's
# Welford reduction twice in the fused LayerNorm + cast kernel (ln_probe2: loops 1 and 2 are the same Welford).
import glob
import json
import os
import shutil

import torch

from fp8bench import float8_linear
from fp8bench import _float8_ops as ops
from fp8bench.config import GemmShape
from fp8bench.env import run_metadata
from fp8bench.float8_linear import convert_to_float8
from fp8bench.layer import Built, LayerInputs, _torch_layer, make_step
from fp8bench.recipes import get_recipe
from fp8bench.timing import CuptiTimer, GpuClock
from fp8kernels import reference

OUT = os.environ["OUT_DIR"]
os.makedirs(OUT, exist_ok=True)
timer = CuptiTimer(GpuClock(True))
original = float8_linear._delayed_in_producer


def amax_first(x, call, history):
    """The same ops, the amax taken before the cast."""
    fp8 = ops.FP8_DTYPES[call.fp8_dtype]
    amax = float8_linear._row_amax(x)
    recorded = history.max()
    data, scale = reference.quantize_with_amax(x, torch.where(recorded > 0, recorded, reference.fp8_max(fp8)), fp8, call.power_of_two)
    ops.record_amax(history, amax)
    return data, scale, ops.transpose_fp8(data) if call.columnwise else None, None


def aminmax(x):
    low, high = torch.aminmax(x, dim=1)
    return torch.maximum(high, -low).amax().to(torch.float32)


def max_of_max_and_neg(x):
    return torch.maximum(x.amax(dim=1), (-x).amax(dim=1)).amax().to(torch.float32)


VARIANTS = {
    "as-is": (original, float8_linear._row_amax),
    "amax-first": (amax_first, float8_linear._row_amax),
    "aminmax": (original, aminmax),
    "max-and-neg-max": (original, max_of_max_and_neg),
}
rows = []
for dims in ((8192, 4096, 4096), (16384, 16384, 16384)):
    shape = GemmShape(*dims)
    inputs = LayerInputs.random(shape, "cuda")
    for name, (producer, row_amax) in VARIANTS.items():
        cache = f"/tmp/ind3-{dims[0]}-{name}"
        shutil.rmtree(cache, ignore_errors=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        torch._dynamo.reset()
        float8_linear._delayed_in_producer, float8_linear._row_amax = producer, row_amax
        layer = _torch_layer(shape, inputs.weight)
        convert_to_float8(layer, get_recipe("tensorwise-delayed"))
        step = make_step(Built(torch.compile(layer, dynamic=False), layer[1].weight, (layer[1].weight,), {}), inputs)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        kernels = timer.kernel_ms(step, 30)
        ln = {k: v for k, v in kernels.items() if "layer_norm" in k and "backward" not in k}
        welford_loops = None
        for path in glob.glob(f"{cache}/**/*.py", recursive=True):
            text = open(path).read()
            for kernel in ln:
                start = text.find(f"def {kernel}(")
                if start >= 0 and welford_loops is None:
                    body = text[start:text.find("\n\n\n", start) if text.find("\n\n\n", start) > 0 else None]
                    welford_loops = body.count("welford_reduce(")
                    open(os.path.join(OUT, f"ln-{dims[0]}-{name}.py"), "w").write(body)
        row = {"shape": "x".join(map(str, dims)), "variant": name, "step_ms": sum(kernels.values()), "ln": ln,
               "welford_loops": welford_loops, "kernels": kernels}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("shape", "variant", "step_ms", "ln", "welford_loops")}), flush=True)
        del layer, step
        torch.cuda.empty_cache()
    float8_linear._delayed_in_producer = original
    del inputs
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(OUT, "ln_probe3.json"), "w"), indent=1)
json.dump(run_metadata("python .probe/ln_probe3.py"), open(os.path.join(OUT, "metadata.json"), "w"), indent=1, default=str)
