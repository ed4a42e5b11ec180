"""Grades the GEMM heuristic (fp8kernels.gemm_configs.choose_config) against the autotuner's timed candidates,
offline: for each problem of one or more tuner caches (a run's `gemm-tune-cache.json`, or the GPU model's cache
file), the time of the candidate the heuristic picks over the fastest candidate's. No GPU needed: the times are
the ones the tuner measured, so a change to the heuristic's constants can be weighed on committed data before a
GPU run.

    python tools/gemm_heuristic_grade.py reports/h100-sxm/matmul-moe-tuned/gemm-tune-cache.json [--sms 132]
        [--shared-memory 232448] [--worst 10]

Prints the geomean and the worst of pick / fastest, and the problems whose pick is slowest against their
fastest. A problem whose pick the tuner did not time (the heuristic changed since) is counted apart.
"""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
console = Console(width=200)


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


@app.command()
def main(
    caches: list[Path] = typer.Argument(..., help="tuner cache files (JSON)"),
    sms: int = typer.Option(132, help="the GPU's SM count (an H100's and an H200's: 132)"),
    shared_memory: int = typer.Option(232448, help="shared memory a program may use, bytes (H100 / H200: 227 KiB)"),
    worst: int = typer.Option(10, help="problems to list, slowest pick first"),
) -> None:
    from fp8kernels.gemm_autotune import TuneCache

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
    ratios = [ratio for _, _, ratio in graded]
    console.print(f"{len(graded)} problems: the heuristic's pick takes {math.exp(sum(map(math.log, ratios)) / len(ratios)):.4f}x "
                  f"the fastest candidate's time (geomean), {max(ratios):.3f}x at worst; {sum(r <= 1.0 for r in ratios)} "
                  f"picks are the fastest; {len(untimed)} problems' picks were not timed")
    table = Table("problem", "the heuristic's pick", "pick / fastest")
    for key, label, ratio in sorted(graded, key=lambda row: -row[2])[:worst]:
        table.add_row(key, label, f"{ratio:.3f}")
    console.print(table)


if __name__ == "__main__":
    app()
