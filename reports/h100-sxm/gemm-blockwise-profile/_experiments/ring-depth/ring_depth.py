"""192 x 128 blockwise: the heuristic's pick beside the same tile unsplit at 3 and 4 stages, cuBLAS alongside, one process."""
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, "tools")
import torch
from gemm_sweep import QUICK, SideBySide, _open_run, _print_frame, target_shapes, console
from fp8bench.config import Granularity
from fp8kernels.gemm import gemm_config

out = Path(sys.argv[1])
cuda = torch.device("cuda")
shapes = target_shapes()
with _open_run(out, "stages") as writer:
    bench = SideBySide(writer, QUICK, "cupti")
    for index, shape in enumerate(shapes):
        pick = gemm_config(shape.M, shape.N, shape.K, Granularity.BLOCKWISE, False, cuda)
        if pick.block_m != 192:
            continue
        configs = [pick, dataclasses.replace(pick, split_last_wave=False),
                   dataclasses.replace(pick, split_last_wave=False, num_stages=4)]
        bench.measure_shape(shape, [(Granularity.BLOCKWISE, False)], lambda g, f, c=configs: c, ours_first=index % 2 == 1)
        console.print(f"{shape.name} done", highlight=False)
frame = bench.frame()
frame.to_csv(out / "summary.csv", index=False)
ours = frame[frame.backend == "triton"]
_print_frame(ours.pivot_table(index="shape", columns="config", values="ratio").reset_index(), "cuBLAS time / ours")
from scipy.stats import gmean
_print_frame(ours.groupby("config")["ratio"].agg(gmean).reset_index(), "geomean")
