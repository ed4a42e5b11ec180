"""Candidate tiles of our FP8 GEMM against cuBLAS (torch._scaled_mm) on awkward shapes, one GPU: the data
that sets the GEMM heuristic's tile speeds (fp8kernels.gemm_configs.GLUON_TILES).

    python tools/gemm_awkward_probe.py --out DIR                          # every awkward shape, every regime
    python tools/gemm_awkward_probe.py --out DIR --shape-gen small-m --regime tensorwise/fast_accum=on
    python tools/gemm_awkward_probe.py --out DIR --only moe.dsv3 --only skinny

For each shape (a generator of fp8bench.benchmarks.shapes, `--only` keeping the names that contain any of
its words) and regime, cuBLAS and each candidate config run on the same operands with CUPTI kernel time
(tools/gemm_sweep.py's SideBySide: outputs checked against cuBLAS's first, the order alternating from
shape to shape). The candidates are the autotuner's (fp8kernels.gemm_autotune.tuning_candidates): the
heuristic's choice, every tile of the regime's GLUON_TILES (each with the split of its last wave that
last_wave_split decides for the shape) and the Gluon candidates of candidate_configs, each that splits its last
wave also whole; where the Gluon kernel cannot run (a Triton other than the one it is written for), the
Triton kernel's heuristic config only.

Writes DIR/results.csv (the result schema, the config in `options`), DIR/metadata.json and DIR/probe.csv:
shape, M, K, N, regime, config, chosen (the heuristic's pick), ms, tflops, ratio (cuBLAS time / ours),
best_ratio (the shape and regime's best candidate's) and the GPU's name and SM count. Prints, per regime,
how far the heuristic's pick is from the best candidate (geometric mean and worst shape), and the speed
of each tile relative to the fastest on the shapes whose waves it fills (grid_efficiency x tile_fill >=
0.95): the numbers GLUON_TILES holds. The 600 s limit of one device command fits about 10 shapes x 5
regimes: split the set with --only or --shape-gen.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import typer
from scipy.stats import gmean

from fp8bench.benchmarks import shapes as shape_sets
from fp8bench.config import GemmShape, Granularity, TimingConfig
from fp8kernels.gemm import device_properties, gluon_runs_on
from fp8kernels.gemm_autotune import tuning_candidates
from fp8kernels.gemm_configs import Fp8GemmConfig, config_label, grid_efficiency, tile_fill
from fp8kernels.scaling import BLOCK

sys.path.insert(0, str(Path(__file__).parent))
from gemm_sweep import (  # noqa: E402  (a sibling script, not a package)
    REGIMES,
    SideBySide,
    _open_run,
    _print_frame,
    _regime_name,
    _timer,
    console,
    parse_regime,
    precompile,
    timing_order,
)

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
# Short repeats: a probe compares candidates on the same operands one right after the other, and covers
# many shapes x regimes x configs within a device command's limit.
PROBE_TIMING = TimingConfig(repeats=2, settle_ms=50, warmup_ms=10, samples_ms=30, throttled_samples_ms=200,
                            max_dropped_repeats=1)
# A tile "fills the grid" on a shape where grid_efficiency x tile_fill reaches this: there, its time over
# the fastest tile's is its speed alone.
FILLED = 0.95


def candidates(shape: GemmShape, granularity: Granularity, fast_accum: bool) -> list[Fp8GemmConfig]:
    """The heuristic's config first, then the others the autotuner would time (fp8kernels.gemm_autotune)."""
    import torch

    device = torch.device("cuda")
    return tuning_candidates(shape.M, shape.N, shape.K, granularity, fast_accum, device_properties(device),
                             gluon_runs_on(device), BLOCK)


@app.command()
def probe(out: Path = typer.Option(..., help="folder for results.csv, probe.csv and metadata.json"),
          shape_gen: str = typer.Option("awkward", help=f"a shape generator: {', '.join(shape_sets.SHAPE_GENERATORS)}"),
          only: list[str] = typer.Option([], help="keep the shapes whose name contains this (repeatable)"),
          regime: list[str] = typer.Option([], help="e.g. tensorwise/fast_accum=on (repeatable; default: all five)"),
          timer: str = typer.Option("cupti", help="cupti (kernel durations) | cuda-events")) -> None:
    """Time each candidate config against cuBLAS on each shape and regime; write probe.csv."""
    import torch

    timer = _timer(timer)
    try:
        shapes = shape_sets.generate(shape_gen, name_parts=only)
    except ValueError as err:  # an unknown --shape-gen, or no shape left by --only
        raise typer.BadParameter(str(err)) from None
    regimes = [parse_regime(name) for name in regime] or list(REGIMES)
    configs = {(s, g, f): candidates(s, g, f) for s in shapes for g, f in regimes}
    failed = precompile(sorted({(g, f, c) for (_, g, f), cs in configs.items() for c in cs}, key=str))
    with _open_run(out, "probe") as writer:
        bench = SideBySide(writer, PROBE_TIMING, timer)
        for shape, ours_first in timing_order(shapes):
            bench.measure_shape(shape, regimes, lambda g, f, s=shape: [c for c in configs[(s, g, f)]
                                                                       if (g, f, c) not in failed],
                                ours_first=ours_first)
            console.print(f"{shape.name} done", highlight=False)
    frame = probe_frame(bench.frame(), shapes, configs, torch.cuda.get_device_name(),
                        device_properties(torch.device("cuda")).multiprocessor_count)
    frame.to_csv(out / "probe.csv", index=False)
    summarize(frame)


def probe_frame(measured: pd.DataFrame, shapes: list[GemmShape], configs: dict, gpu: str, sms: int) -> pd.DataFrame:
    """Our rows of the run with the shape's dimensions, the heuristic's pick marked, each config's grid
    fill (grid_efficiency x tile_fill) and the best ratio of its shape and regime."""
    by_name = {s.name: s for s in shapes}
    fill, chosen = {}, set()
    for (shape, granularity, fast_accum), candidates_of in configs.items():
        regime = _regime_name(granularity, fast_accum)
        for position, config in enumerate(candidates_of):
            label = config_label(config.options_for(shape.M, shape.N, shape.K))
            fill[(shape.name, regime, label)] = (grid_efficiency(shape.M, shape.N, shape.K, config)
                                                  * tile_fill(shape.M, shape.N, config))
            if position == 0:
                chosen.add((shape.name, regime, label))
    ours = measured[measured.backend == "triton"].copy()
    keys = list(zip(ours["shape"], ours["regime"], ours["config"]))
    ours["M"], ours["K"], ours["N"] = ([getattr(by_name[name], dim) for name in ours["shape"]] for dim in "MKN")
    ours["grid_fill"] = [fill[key] for key in keys]
    ours["chosen"] = [key in chosen for key in keys]
    ours["best_ratio"] = ours.groupby(["shape", "regime"])["ratio"].transform("max")
    ours["gpu"], ours["sms"] = gpu, sms
    return ours[["gpu", "sms", "shape", "M", "K", "N", "regime", "config", "chosen", "grid_fill", "ms", "tflops",
                 "ratio", "best_ratio", "rel_diff_vs_cublas", "sm_clock_mhz"]]


def summarize(frame: pd.DataFrame) -> None:
    """The heuristic's pick against the best candidate per regime, and each tile's speed where it fills."""
    picked = frame[frame.chosen].assign(loss=lambda f: f.ratio / f.best_ratio)
    _print_frame(picked.groupby("regime").agg(chosen_vs_cublas=("ratio", gmean), best_vs_cublas=("best_ratio", gmean),
                                              chosen_vs_best=("loss", gmean), worst_vs_best=("loss", "min"),
                                              shapes=("loss", "size")).reset_index(),
                 "the heuristic's pick: geometric mean of cuBLAS time / ours, and of its speed over the best candidate's")
    worst = picked.sort_values("loss").groupby("regime").head(3)[["regime", "shape", "config", "ratio", "best_ratio"]]
    _print_frame(worst, "the shapes where the pick is furthest from the best candidate")
    _print_frame(tile_speeds(frame), f"each tile's speed over the best, on the shapes it fills (grid fill >= {FILLED})")


def tile_speeds(frame: pd.DataFrame) -> pd.DataFrame:
    """Per regime and tile (its block sizes and stages, and whether it overlaps its promotion: the two are
    different candidates of GLUON_TILES), the geometric mean of its time over the best candidate's, on the shapes
    whose grid it fills."""
    filled = frame[frame.grid_fill >= FILLED]
    tile = filled.config.str.split(" ").str[:2].str.join(" ") + filled.config.str.contains(" overlapped").map(
        {True: " overlapped", False: ""})
    speed = filled.assign(tile=tile, speed=filled.ratio / filled.best_ratio).groupby(["regime", "tile"]).agg(
        speed=("speed", gmean), shapes=("speed", "size"))
    return speed.reset_index()


if __name__ == "__main__":
    app()
