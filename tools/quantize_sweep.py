"""Times every candidate launch config (quantize_configs.candidates) of each quantize kernel, and of the
fp8 transpose (recipe `transpose-fp8`: the shape's fp8 tensor), against the device copy of the same
tensor, to tune quantize_configs.choose on the GPU at hand.

    python tools/quantize_sweep.py --out DIR [--shape 8192x8192 --shape 8192x28672] [--no-transpose]

Each config's output is checked against the PyTorch reference first (a config that differs is reported,
not timed). `pct_copy_moved` is the kernel's GB/s, counting the bytes it moves by design (a two-pass
kernel reads x twice), as a % of the copy's; `pct_copy` counts the least any implementation must move.
Writes DIR/sweep.csv; prints the best config per recipe and shape, and the heuristic's rank among them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
console = Console(width=200)
DEFAULT_SHAPES = ("8192x8192", "8192x28672")


def _run_with(recipe, x, spec, config):
    from fp8bench.config import Granularity
    from fp8kernels.quantize_axiswise import quantize_axiswise
    from fp8kernels.quantize_blockwise import quantize_blockwise
    from fp8kernels.quantize_tensorwise import quantize_tensorwise

    if recipe.granularity is Granularity.TENSORWISE:
        return quantize_tensorwise(x, spec, config)
    if recipe.granularity is Granularity.AXISWISE:
        return quantize_axiswise(x, spec, config)
    return quantize_blockwise(x, recipe.block_rows, spec, config)


def copy_gbps(x, timing, timers) -> float:
    """GB/s of the device copy of x (bytes read plus written): what every kernel is measured against."""
    import torch

    destination = torch.empty_like(x)
    return 2 * x.numel() * x.element_size() / (timers.measure(lambda: destination.copy_(x), timing).median_ms * 1e6)


def sweep_shape(shape, recipes, timing, timers) -> list[dict]:
    """Every recipe's candidate configs on one tensor, against its copy; one record per config."""
    from fp8bench.backends import get_backend
    from fp8bench.backends.quantize import compare_with_reference
    from fp8bench.backends.triton import quantize_config
    from fp8bench.benchmarks import cast
    from fp8kernels.quantize import QuantizeSpec
    from fp8kernels.quantize_configs import QuantizeKernel, candidates, multiprocessors

    x = cast.random_input(shape, "bf16")
    input_bytes = x.numel() * x.element_size()
    copy = copy_gbps(x, timing, timers)
    records = []
    for recipe in recipes:
        if recipe.problem_with(shape):
            continue
        spec = QuantizeSpec(columnwise=recipe.columnwise)
        reference = get_backend("torch").quantizer(recipe, spec, x.abs().amax().float() if recipe.delayed else None).run(x)
        kernel = QuantizeKernel(quantize_config(recipe, x)["kernel"])
        least = input_bytes + recipe.bytes_written(shape)
        moved = least + (recipe.input_reads() - 1) * input_bytes
        for rank, config in enumerate(candidates(kernel, shape.rows, shape.cols, recipe.columnwise, multiprocessors(x))):
            record = {"shape": shape.name, "recipe": recipe.name, "default": rank == 0, **config.as_dict()}
            try:
                ulps, problem = compare_with_reference(_run_with(recipe, x, spec, config), reference)
                if problem:
                    raise ValueError(problem)
                call = lambda: _run_with(recipe, x, spec, config)  # noqa: E731
                ms = timers.measure(call, timing).median_ms
            except Exception as err:  # noqa: BLE001 - a config the compiler refuses is reported, the sweep goes on
                console.print(f"[yellow]{shape.name} {recipe.name} {config.as_dict()}: {type(err).__name__}: {err}[/]")
                continue
            record.update(ms=ms, pct_copy=100 * least / (ms * 1e6) / copy, pct_copy_moved=100 * moved / (ms * 1e6) / copy,
                          copy_gbps=copy)  # fmt: skip
            records.append(record)
        del reference
    return records


def sweep_transpose(shape, timing, timers) -> list[dict]:
    """The fp8 transpose's candidate configs on an fp8 tensor of `shape` (random bytes), against its copy."""
    import torch

    from fp8kernels.quantize_configs import QuantizeKernel, candidates, multiprocessors
    from fp8kernels.transpose_fp8 import transpose_fp8

    q = torch.randint(0, 256, (shape.rows, shape.cols), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    copy = copy_gbps(q, timing, timers)
    expected = q.view(torch.uint8).t().contiguous()
    records = []
    for rank, config in enumerate(candidates(QuantizeKernel.TRANSPOSE_FP8, shape.rows, shape.cols, True, multiprocessors(q))):
        if not torch.equal(transpose_fp8(q, config).view(torch.uint8), expected):
            console.print(f"[yellow]{shape.name} transpose-fp8 {config.as_dict()}: wrong bytes[/]")
            continue
        ms = timers.measure(lambda: transpose_fp8(q, config), timing).median_ms  # noqa: B023 - called here
        pct = 100 * 2 * q.numel() / (ms * 1e6) / copy
        records.append({"shape": shape.name, "recipe": "transpose-fp8", "default": rank == 0, **config.as_dict(),
                        "ms": ms, "pct_copy": pct, "pct_copy_moved": pct, "copy_gbps": copy})  # fmt: skip
    return records


@app.command()
def main(
    out: Path = typer.Option(..., help="folder for sweep.csv"),
    shape: Optional[list[str]] = typer.Option(None, help=f"RxC, repeatable (default {' '.join(DEFAULT_SHAPES)})"),
    recipe: Optional[list[str]] = typer.Option(None, help="fp8bench cast recipe names (default: all)"),
    transpose: bool = typer.Option(True, help="also sweep the fp8 transpose (fp8kernels.transpose_fp8)"),
) -> None:
    import torch

    from fp8bench.benchmarks import cast
    from fp8bench.config import TimingConfig
    from fp8bench.harness.timing import TimerChoice

    try:
        shapes = [cast.CastShape(*map(int, text.lower().split("x"))) for text in shape or DEFAULT_SHAPES]
    except (TypeError, ValueError):
        raise typer.BadParameter(f"shapes are RxC, e.g. 8192x8192; got {shape}") from None
    recipes = [r for name in recipe or ["all"] for r in cast.RECIPE_CHOICES[name]]
    timing = TimingConfig(repeats=2, settle_ms=20, warmup_ms=5, samples_ms=20)
    timers = TimerChoice("auto")
    console.print(f"quantize sweep on {torch.cuda.get_device_name()}")
    records = [r for s in shapes for r in sweep_shape(s, recipes, timing, timers)]
    if transpose:
        records += [r for s in shapes for r in sweep_transpose(s, timing, timers)]
    frame = pd.DataFrame.from_records(records)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "sweep.csv", index=False)
    table = Table(title="best config per recipe and shape (default = the heuristic's)", title_justify="left")
    for column in ("shape", "recipe", "copy GB/s", "default ms", "default % copy (moved)", "best ms", "best % copy (moved)", "best config"):
        table.add_column(column)
    config_columns = ["block_rows", "block_cols", "num_warps", "amax_block", "amax_programs"]
    for (shape_name, recipe_name), group in frame.groupby(["shape", "recipe"], sort=False):
        best, default = group.loc[group.ms.idxmin()], group[group["default"]].iloc[0]
        table.add_row(shape_name, recipe_name, f"{best.copy_gbps:.0f}", f"{default.ms:.4f}",
                      f"{default.pct_copy:.0f} ({default.pct_copy_moved:.0f})", f"{best.ms:.4f}",
                      f"{best.pct_copy:.0f} ({best.pct_copy_moved:.0f})", " ".join(f"{c}={int(best[c])}" for c in config_columns))  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    app()
