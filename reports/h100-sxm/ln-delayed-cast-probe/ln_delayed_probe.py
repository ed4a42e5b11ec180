# Why is the LayerNorm kernel inductor makes for our compiled tensorwise-delayed layer (LN + fp8 cast with the
# history's scale + the row amax) ~1.7x slower than the one of the rowwise recipe (LN + row amax + cast)?
# Variants of fp8bench.float8_linear._row_amax, each compiled afresh; CUPTI kernel times of a training step
# (L2 flushed per step); the generated sources of the LayerNorm-forward kernels are copied to $OUT_DIR/src.
import glob
import json
import os
import shutil
import sys

import torch

from fp8bench import float8_linear
from fp8bench.config import GemmShape
from fp8bench.env import run_metadata
from fp8bench.float8_linear import convert_to_float8
from fp8bench.layer import LayerInputs, _torch_layer, make_step, Built
from fp8bench.recipes import get_recipe
from fp8bench.timing import CuptiTimer, GpuClock

OUT = os.environ["OUT_DIR"]
os.makedirs(OUT, exist_ok=True)
timer = CuptiTimer(GpuClock(True))

VARIANTS = {
    "row-then-global": lambda x: x.abs().amax(dim=1).amax().to(torch.float32),
    "global": lambda x: x.abs().amax().to(torch.float32),
    "fp32-row-then-global": lambda x: x.float().abs().amax(dim=1).amax(),
}
CASES = [("tensorwise-delayed", v) for v in VARIANTS] + [("rowwise", "row-then-global"), ("bf16", None)]
rows = []
for dims in ((8192, 4096, 4096), (16384, 16384, 16384)):
    shape = GemmShape(*dims)
    inputs = LayerInputs.random(shape, "cuda")
    for recipe, variant in CASES:
        cache = f"/tmp/inductor-{recipe}-{variant}-{dims[0]}"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        shutil.rmtree(cache, ignore_errors=True)
        torch._dynamo.reset()
        if variant:
            float8_linear._row_amax = VARIANTS[variant]
        layer = _torch_layer(shape, inputs.weight)
        if recipe != "bf16":
            convert_to_float8(layer, get_recipe(recipe))
        compiled = torch.compile(layer, dynamic=False)
        step = make_step(Built(compiled, layer[1].weight, (layer[1].weight,), {}), inputs)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        kernels = timer.kernel_ms(step, 30)
        ln = {k: v for k, v in kernels.items() if "layer_norm" in k and "backward" not in k}
        row = {"shape": "x".join(map(str, dims)), "recipe": recipe, "variant": variant, "step_ms": sum(kernels.values()),
               "ln_forward_kernels": ln, "kernels": kernels}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("shape", "recipe", "variant", "step_ms", "ln_forward_kernels")}), flush=True)
        dest = os.path.join(OUT, "src", f"{dims[0]}-{recipe}-{variant}")
        os.makedirs(dest, exist_ok=True)
        for path in glob.glob(f"{cache}/**/*.py", recursive=True):
            text = open(path).read()
            if any(f"def {name}(" in text for name in ln):
                shutil.copy(path, os.path.join(dest, os.path.basename(path)))
        del compiled, layer, step
        torch.cuda.empty_cache()
    del inputs
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(OUT, "ln_probe.json"), "w"), indent=1)
json.dump(run_metadata("python .probe/ln_delayed_probe.py"), open(os.path.join(OUT, "metadata.json"), "w"), indent=1, default=str)
