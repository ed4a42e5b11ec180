"""The Gluon tiles on the shapes where the heuristic's config trails cuBLAS most (N 1280 / 10240 wqkv, 70b w2):
WIDE (group_m 4/8/16), NARROW (s4/s5), TALL (s3/s4), each with and without the last-wave split, against cuBLAS
side by side (gemm_sweep.SideBySide, CUPTI, STEADY timing). Usage: python wqkv_tune.py OUTDIR"""
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, "kernels/bench")
try:
    import scipy.stats  # noqa: F401
except ImportError:  # the device host may lack scipy; gemm_sweep only takes gmean from it
    import types
    import numpy as np
    stats = types.ModuleType("scipy.stats")
    stats.gmean = lambda a: float(np.exp(np.mean(np.log(np.asarray(a, dtype=float)))))
    sys.modules["scipy"] = types.ModuleType("scipy"); sys.modules["scipy.stats"] = stats
import gemm_sweep as gs  # noqa: E402
from fp8bench.config import Granularity as G  # noqa: E402
from fp8kernels.gemm_configs import NARROW_GLUON, TALL_GLUON, WIDE_GLUON  # noqa: E402

def main():
    out = Path(sys.argv[1])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = [dataclasses.replace(WIDE_GLUON, group_m=g) for g in (4, 8, 16)]
    base += [NARROW_GLUON, dataclasses.replace(NARROW_GLUON, num_stages=5, split_last_wave=False)]
    base += [TALL_GLUON, dataclasses.replace(TALL_GLUON, num_stages=4, split_last_wave=False)]
    configs = []
    for c in base:
        for split in (True, False):
            try:
                configs.append(dataclasses.replace(c, split_last_wave=split).with_sms(sms))
            except ValueError as e:
                print("skip", e)
    regimes = [(G.TENSORWISE, True), (G.AXISWISE, True), (G.TENSORWISE, False)]
    names = ["llama3-70b-tp8.wqkv.M8192", "llama3-70b-tp8.wqkv.M16384", "llama3-70b.wqkv.M8192", "llama3-70b.w2.M8192"]
    shapes = [s for s in gs.target_shapes() if s.name in names]
    failed = gs.precompile([(g, f, c) for g, f in regimes for c in configs])
    with gs._open_run(out, "wqkv_tune") as writer:
        bench = gs.SideBySide(writer, gs.STEADY, "cupti")
        for i, shape in enumerate(shapes):
            bench.measure_shape(shape, regimes, lambda g, f: [c for c in configs if (g, f, c) not in failed], ours_first=i % 2 == 1)
            print(shape.name, "done", flush=True)
    frame = bench.frame()
    frame.to_csv(out / "summary.csv", index=False)
    ours = frame[frame.backend == "triton"]
    import pandas as pd  # noqa: E402
    pd.set_option("display.width", 250); pd.set_option("display.max_rows", 500); pd.set_option("display.max_colwidth", 70)
    print(ours.pivot_table(index="config", columns=["shape", "regime"], values="ratio").round(3).T.to_string())
    print(frame[frame.backend == "cublas"][["shape", "regime", "ms", "sm_clock_mhz"]].to_string())


if __name__ == "__main__":
    main()
