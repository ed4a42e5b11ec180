"""Grades the GEMM heuristic (fp8kernels.gemm_configs.choose_config) against the autotuner's timed candidates,
offline: for each problem of one or more tuner caches (a run's `gemm-tune-cache.json`, or the GPU model's cache
file), the time of the candidate the heuristic picks over the fastest candidate's. No GPU needed: the times are
the ones the tuner measured, so a change to the heuristic's constants can be weighed on committed data before a
GPU run.

    python tools/gemm_heuristic_grade.py reports/h100-sxm/matmul-moe-tuned/gemm-tune-cache.json [--sms 132]
        [--shared-memory 232448] [--worst 10] [--set PARTIAL_SUM_K_TILES=3] [--set promoted.TALL_GLUON=0.97]

Prints the geomean and the worst of pick / fastest, and the problems whose pick is slowest against their
fastest. A problem whose pick the tuner did not time (the heuristic changed since) is counted apart.

`--set` (repeatable) grades the heuristic again with a changed constant: one of the split and tile-speed model's
numbers read at each pick (MODEL_CONSTANTS), or a tile's speed in one regime of GLUON_TILES (`REGIME.TILE=SPEED`,
e.g. `fast.NARROW_GLUON=0.9`). It then also counts the picks the change alters over fp8bench's shape sets
(`fp8bench matmul --shape-gen`, every regime), the products a change would have to be measured on.

`--splits` lists every candidate the tuner timed both whole and with its last wave split along K: the split model's
gain (gemm_configs.grid_efficiency split over whole: the busiest program's K-tiles) beside the measured one, the
measured gain's geomean by how many waves of tiles the product makes, and the measured gain over the model's by K,
under one wave and from one wave apart.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from statistics import geometric_mean
from typing import Iterator, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
console = Console(width=200)

# gemm_configs' numbers that choose_config reads at each pick (others are folded into presets at import).
MODEL_CONSTANTS = ("PARTIAL_SUM_K_TILES", "SPLIT_ALONE_SPEED", "SLIM_MAX_ROWS", "SLIM_SPEED_MANY_ROWS", "OVERLAP_MIN_WAVES",
                   "ROW_WALK_MAX_B_SHARE", "DEEP_NARROW_MAX_MACS", "DEEP_TALL_BLOCKWISE_MAX_K", "SECTOR_BYTES",
                   "SLIM_DEEP_MIN_K", "SLIM_DEEP_MAX_SPLIT_K")


def grade(entries: dict[str, dict], sms: int, shared_memory: int) -> tuple[list[tuple[str, str, float]], list[str]]:
    """([(problem key, the heuristic's pick, its time over the fastest candidate's)], [keys whose pick was not
    timed]), over tuner cache entries (fp8kernels.gemm_autotune.problem_key keys)."""
    from fp8kernels.gemm_autotune import problem_of
    from fp8kernels.gemm_configs import DeviceProperties, choose_config, config_label

    device = DeviceProperties(sms, shared_memory)
    graded, untimed = [], []
    for key, entry in entries.items():
        problem = problem_of(key)
        pick = choose_config(problem.M, problem.N, problem.K, problem.granularity, problem.fast_accum, device, True,
                             problem.b_rows)
        label = config_label(pick.options_for(problem.M, problem.N, problem.K))
        times = entry["candidate_ms"]
        if label in times:
            graded.append((key, label, times[label] / min(times.values())))
        else:
            untimed.append(key)
    return graded, untimed


def parse_setting(text: str) -> tuple[str, float]:
    """`NAME=VALUE` -> (NAME, VALUE); ValueError saying what NAME may be (the caller names its option: --set here,
    gemm_sweep.py compare's --candidate)."""
    from fp8kernels import gemm_configs

    name, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = None
    if not sep or number is None:
        raise ValueError(f"{text!r}: expected NAME=NUMBER")
    regime, dot, tile = name.partition(".")
    if dot:
        if regime not in gemm_configs.GLUON_TILES:
            raise ValueError(f"{text!r}: no regime {regime!r}; choose one of {', '.join(gemm_configs.GLUON_TILES)}")
        names = [_tile_name(t) for t, _ in gemm_configs.GLUON_TILES[regime]]
        if tile not in names:
            raise ValueError(f"{text!r}: {regime}'s tiles are {', '.join(names)}")
    elif name not in MODEL_CONSTANTS:
        raise ValueError(f"{text!r}: a constant of {', '.join(MODEL_CONSTANTS)}, or REGIME.TILE=SPEED")
    return name, number


def _tile_name(tile) -> str:
    """The gemm_configs preset name a GLUON_TILES entry is (e.g. TALL_GLUON)."""
    from fp8kernels import gemm_configs

    return next(name for name, value in vars(gemm_configs).items() if name.endswith("_GLUON") and value == tile)


@contextlib.contextmanager
def changed(settings: list[tuple[str, float]]) -> Iterator[None]:
    """gemm_configs with `settings` in place (the heuristic's caches cleared on the way in and out)."""
    from fp8kernels import gemm_configs

    saved_tiles, saved = dict(gemm_configs.GLUON_TILES), {}
    for name, value in settings:
        regime, dot, tile = name.partition(".")
        if dot:
            gemm_configs.GLUON_TILES[regime] = tuple((t, value if _tile_name(t) == tile else speed)
                                                     for t, speed in gemm_configs.GLUON_TILES[regime])
        else:
            saved.setdefault(name, getattr(gemm_configs, name))
            setattr(gemm_configs, name, type(getattr(gemm_configs, name))(value))
    _clear_caches()
    try:
        yield
    finally:
        gemm_configs.GLUON_TILES.update(saved_tiles)
        for name, value in saved.items():
            setattr(gemm_configs, name, value)
        _clear_caches()


def _clear_caches() -> None:
    from fp8kernels import gemm_configs

    gemm_configs._heuristic_config.cache_clear()
    gemm_configs.last_wave_split.cache_clear()


def shape_set_picks(sms: int, shared_memory: int) -> dict[tuple, str]:
    """{(M, K, N, granularity, fast accumulation): the heuristic's pick} over every product of fp8bench's shape
    sets, every regime (blockwise where K and N are multiples of 128)."""
    from fp8bench.benchmarks.shapes import SHAPE_GENERATORS
    from fp8kernels.gemm_configs import DeviceProperties, choose_config, config_label
    from fp8kernels.scaling import BLOCK, Granularity

    device = DeviceProperties(sms, shared_memory)
    regimes = [(g, fast) for g in (Granularity.TENSORWISE, Granularity.AXISWISE) for fast in (True, False)]
    picks = {}
    for generate in SHAPE_GENERATORS.values():
        for s in generate():
            blockwise = [(Granularity.BLOCKWISE, False)] if not (s.K % BLOCK or s.N % BLOCK) else []
            for granularity, fast in regimes + blockwise:
                config = choose_config(s.M, s.N, s.K, granularity, fast, device, True)
                picks[(s.M, s.K, s.N, granularity.value, fast)] = config_label(config.options_for(s.M, s.N, s.K))
    return picks


def split_pairs(entries: dict[str, dict], sms: int) -> list[dict]:
    """One record per candidate timed both whole and split in `entries`: the problem, the tile, K, waves of tiles,
    the split (tiles x pieces), the model's gain and the measured one (time whole / time split)."""
    import dataclasses
    import functools
    import re

    from fp8kernels import gemm_configs
    from fp8kernels.gemm_autotune import problem_of

    records = []
    for key, entry in entries.items():
        problem, times = problem_of(key), entry["candidate_ms"]
        for label, split_ms in times.items():
            split = re.search(r" last-wave (\d+)x(\d+)$", label)
            whole = label[:split.start()] if split else None
            if whole not in times:
                continue
            block_m, block_n, block_k = (int(x) for x in label.split()[0].split("x"))
            tile = dataclasses.replace(gemm_configs.WIDE_GLUON, block_m=block_m, block_n=block_n, block_k=block_k, num_sms=sms)
            split_tiles, pieces = int(split.group(1)), int(split.group(2))
            efficiency = functools.partial(gemm_configs.grid_efficiency, problem.M, problem.N, problem.K, tile)
            records.append(dict(problem=key, tile=whole, K=problem.K, waves=tile.tiles(problem.M, problem.N) / sms,
                                split=f"{split_tiles}x{pieces}", model_gain=efficiency((split_tiles, pieces)) / efficiency((0, 1)),
                                measured_gain=times[whole] / split_ms))
    return records


def _print_splits(records: list[dict]) -> None:
    table = Table("problem", "tile (whole)", "waves", "split", "model's gain", "measured gain")
    for r in sorted(records, key=lambda r: (r["waves"], r["problem"])):
        table.add_row(r["problem"], r["tile"], f"{r['waves']:.2f}", r["split"], f"{r['model_gain']:.3f}", f"{r['measured_gain']:.3f}")
    console.print(table)
    for low, high in ((0, 1), (1, 2), (2, 4), (4, math.inf)):
        gains = [r["measured_gain"] for r in records if low <= r["waves"] < high]
        if gains:
            console.print(f"{low}-{high} waves: {len(gains)} splits, measured gain {geometric_mean(gains):.3f} "
                          f"geomean ({min(gains):.3f}-{max(gains):.3f})")
    # Where the model errs, by K (a partial sum's hand-over costs the model the same K-tiles whatever K), apart for
    # products under one wave of tiles (every tile split) and the others (the last wave's split).
    for name, below_one_wave in (("under one wave", True), ("from one wave", False)):
        for low, high in ((0, 2048), (2048, 4096), (4096, 8192), (8192, math.inf)):
            errors = [r["measured_gain"] / r["model_gain"] for r in records
                      if low < r["K"] <= high and (r["waves"] < 1) == below_one_wave]
            if errors:
                console.print(f"{name}, K {low + 1}-{high}: {len(errors)} splits, measured over the model's gain "
                              f"{geometric_mean(errors):.3f} geomean")


def _summary(graded: list[tuple[str, str, float]], untimed: list[str]) -> str:
    ratios = [ratio for _, _, ratio in graded]
    return (f"{len(graded)} problems: the heuristic's pick takes {geometric_mean(ratios):.4f}x "
            f"the fastest candidate's time (geomean), {max(ratios):.3f}x at worst; {sum(r <= 1.0 for r in ratios)} "
            f"picks are the fastest; {len(untimed)} problems' picks were not timed")


@app.command()
def main(
    caches: list[Path] = typer.Argument(..., help="tuner cache files (JSON)"),
    sms: int = typer.Option(132, help="the GPU's SM count (an H100's and an H200's: 132)"),
    shared_memory: int = typer.Option(232448, help="shared memory a program may use, bytes (H100 / H200: 227 KiB)"),
    worst: int = typer.Option(10, help="problems to list, slowest pick first (and changed picks with --set)"),
    setting: Optional[list[str]] = typer.Option(None, "--set", help="repeatable: grade again with NAME=VALUE (see the docstring)"),
    splits: bool = typer.Option(False, "--splits", help="also list each candidate timed whole and split: the model's gain and the measured one"),
) -> None:
    from fp8kernels.gemm_autotune import TuneCache

    try:
        settings = [parse_setting(text) for text in setting or []]
    except ValueError as err:
        console.print(f"[red]--set {err}[/]")
        raise typer.Exit(2) from None
    entries: dict[str, dict] = {}
    for path in caches:
        try:
            entries |= TuneCache(path).read()
        except ValueError as err:
            console.print(f"[red]{err}[/]")
            raise typer.Exit(2) from None
    graded, untimed = grade(entries, sms, shared_memory)
    if not graded:
        console.print(f"no problem graded ({len(untimed)} whose pick was not timed)")
        raise typer.Exit(1)
    console.print(_summary(graded, untimed))
    table = Table("problem", "the heuristic's pick", "pick / fastest")
    for key, label, ratio in sorted(graded, key=lambda row: -row[2])[:worst]:
        table.add_row(key, label, f"{ratio:.3f}")
    console.print(table)
    if splits:
        _print_splits(split_pairs(entries, sms))
    if not settings:
        return
    names = ", ".join(f"{name}={value:g}" for name, value in settings)
    with changed(settings):
        changed_graded, changed_untimed = grade(entries, sms, shared_memory)
    console.print(f"with {names}: " + (_summary(changed_graded, changed_untimed) if changed_graded
                                          else f"no problem graded ({len(changed_untimed)} whose pick was not timed)"))
    before = shape_set_picks(sms, shared_memory)
    with changed(settings):
        after = shape_set_picks(sms, shared_memory)
    moved = [(problem, before[problem], after[problem]) for problem in before if before[problem] != after[problem]]
    console.print(f"picks the change alters over fp8bench's shape sets: {len(moved)} of {len(before)}")
    if moved:
        table = Table("M x K x N", "regime", "pick now", f"with {names}")
        for (M, K, N, granularity, fast), now, then in moved[:worst]:
            table.add_row(f"{M}x{K}x{N}", f"{granularity} fast_accum={'on' if fast else 'off'}", now, then)
        console.print(table)


if __name__ == "__main__":
    app()
