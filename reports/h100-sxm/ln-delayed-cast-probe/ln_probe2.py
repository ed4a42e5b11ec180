# Follow-up of ln_delayed_probe.py: the slow LayerNorm + delayed-cast kernel's source, and inductor knobs.
import glob
import json
import os
import shutil

import torch

from fp8bench.config import GemmShape
from fp8bench.env import run_metadata
from fp8bench.float8_linear import convert_to_float8
from fp8bench.layer import Built, LayerInputs, _torch_layer, make_step
from fp8bench.recipes import get_recipe
from fp8bench.timing import CuptiTimer, GpuClock

OUT = os.environ["OUT_DIR"]
os.makedirs(OUT, exist_ok=True)
timer = CuptiTimer(GpuClock(True))
KNOBS = {
    "default": {},
    "coordinate-descent": {"coordinate_descent_tuning": True},
    "no-persistent-reductions": {"triton.persistent_reductions": False},
    "autotune-pointwise": {"max_autotune_pointwise": True},
}
rows = []
for dims in ((8192, 4096, 4096), (16384, 16384, 16384)):
    shape = GemmShape(*dims)
    inputs = LayerInputs.random(shape, "cuda")
    for recipe in ("tensorwise-delayed", "rowwise"):
        for knob, patch in KNOBS.items():
            if recipe == "rowwise" and knob != "default":
                continue
            cache = f"/tmp/ind-{dims[0]}-{recipe}-{knob}"
            shutil.rmtree(cache, ignore_errors=True)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            torch._dynamo.reset()
            with torch._inductor.config.patch(patch):
                layer = _torch_layer(shape, inputs.weight)
                convert_to_float8(layer, get_recipe(recipe))
                step = make_step(Built(torch.compile(layer, dynamic=False), layer[1].weight, (layer[1].weight,), {}), inputs)
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                kernels = timer.kernel_ms(step, 30)
            ln = {k: v for k, v in kernels.items() if "layer_norm" in k and "backward" not in k}
            row = {"shape": "x".join(map(str, dims)), "recipe": recipe, "knob": knob, "step_ms": sum(kernels.values()), "ln": ln, "kernels": kernels}
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("shape", "recipe", "knob", "step_ms", "ln")}), flush=True)
            for i, path in enumerate(sorted(glob.glob(f"{cache}/**/*.py", recursive=True))):
                text = open(path).read()
                if any(f"def {name}(" in text for name in ln):
                    shutil.copy(path, os.path.join(OUT, f"src-{dims[0]}-{recipe}-{knob}-{i}.py"))
            del layer, step
            torch.cuda.empty_cache()
    del inputs
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(OUT, "ln_probe2.json"), "w"), indent=1)
json.dump(run_metadata("python .probe/ln_probe2.py"), open(os.path.join(OUT, "metadata.json"), "w"), indent=1, default=str)
