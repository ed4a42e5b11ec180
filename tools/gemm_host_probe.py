"""Host time of one FP8 GEMM call, ours against cuBLAS, and where ours spends it: what a training step waits for
wherever the GPU runs ahead of the CPU (products of a few tens of microseconds: MoE experts, small batches).

    python tools/gemm_host_probe.py [--shape 512x4096x14336 ...] [--calls 300] [--out DIR]

Each shape (M x K x N; default: MoE expert products and a LLaMa-3 8B linear) in each regime is called `--calls`
times with the operands `fp8bench matmul` prepares, `perf_counter` around each call and no synchronisation between
calls (the GPU is faster than these launches, so the launch queue never fills). Per row, median microseconds of:
- `cublas`: `torch._scaled_mm` as the matmul benchmark calls it;
- `ours`: `fp8kernels.gemm.fp8_gemm` given no config, as `fp8bench.nn` calls it, and its parts:
  `ours_checks` (from the call to `launch_kernel`: operand and scale checks, the config), `ours_prepare` (from
  there to the kernel's launch: descriptors, grid, scratch) and `ours_launch` (the launch of the compiled kernel:
  through Triton's JIT (argument binding, specialisation) the first time a kernel is needed, directly after that).
Writes DIR/host.csv and DIR/metadata.json with --out; prints the table. Needs a CUDA GPU.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
console = Console(width=200)
DEFAULT_SHAPES = ("256x7168x4096", "512x4096x14336", "2048x2048x7168", "8192x4096x4096")
REGIMES = (("tensorwise", True), ("tensorwise", False), ("axiswise", True), ("blockwise", False))
PARTS = ("ours_checks", "ours_prepare", "ours_launch")


class PartClock:
    """Marks taken inside one call of ours (`mark(name)`), turned into each part's microseconds."""

    def __init__(self):
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter()

    def start(self) -> float:
        self.marks.clear()
        return time.perf_counter()

    def parts(self, start: float) -> dict[str, float]:
        """Microseconds of each part of PARTS from the marks `launch_kernel`, `kernel` and `launched` since `start`
        (empty where the call did not reach the Gluon kernel: another kernel, another Triton)."""
        m = self.marks
        if not {"launch_kernel", "kernel", "launched"} <= m.keys():
            return {}
        return {"ours_checks": 1e6 * (m["launch_kernel"] - start), "ours_prepare": 1e6 * (m["kernel"] - m["launch_kernel"]),
                "ours_launch": 1e6 * (m["launched"] - m["kernel"])}


def instrument(clock: PartClock) -> None:
    """Wrap fp8kernels.gemm.launch_kernel and the Gluon kernel's launch (_gemm_ws._launch) so that each call of ours
    marks `clock`."""
    from fp8kernels import _gemm_ws, gemm

    launch_kernel, launch = gemm.launch_kernel, _gemm_ws._launch

    def marked_launch_kernel(*args, **kwargs):
        clock.mark("launch_kernel")
        return launch_kernel(*args, **kwargs)

    def marked_launch(*args, **kwargs):
        clock.mark("kernel")
        try:
            return launch(*args, **kwargs)
        finally:
            clock.mark("launched")

    gemm.launch_kernel = marked_launch_kernel
    _gemm_ws._launch = marked_launch


def medians(samples: dict[str, list[float]]) -> dict[str, float | None]:
    return {name: statistics.median(values) if values else None for name, values in samples.items()}


def probe_shape(product, granularity: str, fast_accum: bool, calls: int, clock: PartClock) -> dict:
    """One row of host.csv: `product` (a GemmShape) in one regime, each library called `calls` times."""
    import torch

    from fp8bench.backends import Operands, get_backend
    from fp8bench.backends.triton import kernel_operands
    from fp8bench.config import FastAccum, Granularity
    from fp8kernels.gemm import fp8_gemm

    generator = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(rows, product.K, generator=generator, device="cuda").to(torch.bfloat16) for rows in (product.M, product.N))
    g = Granularity(granularity)
    cublas = get_backend("cublas").prepare_gemm(Operands(a, b), g, FastAccum.ON if fast_accum else FastAccum.OFF).run
    qa, qb_t, sa, sb = kernel_operands(Operands(a, b), g)
    samples: dict[str, list[float]] = {"cublas": [], "ours": [], **{part: [] for part in PARTS}}
    for _ in range(3):  # compile and warm both
        cublas(), fp8_gemm(qa, qb_t, sa, sb, granularity=g.value, fast_accum=fast_accum)
    torch.cuda.synchronize()
    for _ in range(calls):
        start = time.perf_counter()
        cublas()
        samples["cublas"].append(1e6 * (time.perf_counter() - start))
    torch.cuda.synchronize()
    for _ in range(calls):
        start = clock.start()
        fp8_gemm(qa, qb_t, sa, sb, granularity=g.value, fast_accum=fast_accum)
        samples["ours"].append(1e6 * (time.perf_counter() - start))
        for part, value in clock.parts(start).items():
            samples[part].append(value)
    torch.cuda.synchronize()
    return {"shape": product.name, "granularity": granularity, "fast_accum": fast_accum, **medians(samples)}


@app.command()
def main(
    shape: Optional[list[str]] = typer.Option(None, help="MxKxN, repeatable"),
    calls: int = typer.Option(300, min=10),
    out: Optional[Path] = typer.Option(None, help="folder for host.csv and metadata.json"),
) -> None:
    import json

    import pandas as pd
    import torch

    from fp8bench.benchmarks.shapes import parse_product
    from fp8bench.harness.env import run_metadata, script_command_line

    try:
        products = [parse_product(text) for text in shape or DEFAULT_SHAPES]
    except ValueError as err:
        console.print(str(err))
        raise typer.Exit(2) from None
    if not torch.cuda.is_available():
        console.print("gemm_host_probe needs a CUDA GPU")
        raise typer.Exit(2)
    clock = PartClock()
    instrument(clock)
    rows = [probe_shape(p, granularity, fast_accum, calls, clock) for p in products for granularity, fast_accum in REGIMES]
    table = Table("shape", "regime", "cublas us", "ours us", *(f"{part} us" for part in PARTS))
    for row in rows:
        table.add_row(row["shape"], f"{row['granularity']} fa={'on' if row['fast_accum'] else 'off'}",
                      *("-" if row[name] is None else f"{row[name]:.1f}" for name in ("cublas", "ours", *PARTS)))
    console.print(table)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(out / "host.csv", index=False)
        (out / "metadata.json").write_text(json.dumps(run_metadata(script_command_line(), {"calls": calls}), indent=1, default=str))


if __name__ == "__main__":
    app()
