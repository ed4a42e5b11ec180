"""Times the amax pass of the SwiGLU's axiswise cast (fp8kernels.swiglu_cast.swiglu_amax) at each launch config of
AMAX_CANDIDATES, against a device copy of its input, to pick AMAX_CONFIG on the GPU at hand.

    python tools/swiglu_amax_probe.py [--rows 8192] [--ffn 14336] [--out DIR]

Rowwise training runs two passes over the gate+up product gu[R, 2F] for w2's input: this amax pass (each row's and
column's amax of h = silu(gate) * up, no output) and the cast pass. In a LLaMa-3 8B proxy step on an H100 the two
took 2.35 ms a step where the one-pass blockwise cast took 1.20 (reports/h100-sxm/e2e-llama3-8b-L4-cudnn-attention);
alone at 8192 x 28672, 0.604 ms against 0.354 (reports/h100-sxm/swiglu-cast-formulas). On seeded bf16 gu (3 x randn), every config's amaxes are checked equal to the
default config's first (amaxes are exact: any order of maxima gives the same floats); each is then timed by
fp8bench.harness.timing.measure with the CUPTI timer (kernel durations, an L2 flush before every call), beside
the whole axiswise cast (both passes) and the one-pass blockwise cast for scale. GB/s counts gu read once; `pct_copy`
is that against the copy's GB/s (read + write of gu). Prints a table; with --out writes DIR/amax.csv and
DIR/metadata.json. Needs a CUDA GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
console = Console(width=200)


def config_name(config) -> str:
    return f"{config.tile_rows}x{config.tile_cols} x{config.row_tiles} w{config.num_warps}"


def probe(rows: int, ffn: int) -> list[dict]:
    """One record per amax config, the two casts and the copy."""
    import torch

    from fp8bench.config import TimingConfig
    from fp8bench.harness.timing import CuptiTimer, GpuClock, measure
    from fp8kernels.quantize import QuantizeSpec
    from fp8kernels.swiglu_cast import AMAX_CANDIDATES, AMAX_CONFIG, swiglu_amax, swiglu_cast_axiswise, swiglu_cast_blockwise

    timer, timing = CuptiTimer(GpuClock()), TimingConfig()
    generator = torch.Generator(device="cuda").manual_seed(0)
    gu = 3 * torch.randn(rows, 2 * ffn, generator=generator, device="cuda", dtype=torch.bfloat16)
    target = torch.empty_like(gu)
    copy_gbps = 2 * gu.nbytes / (measure(lambda: target.copy_(gu), timing, timer).median_ms * 1e6)
    del target
    expected = swiglu_amax(gu, AMAX_CONFIG)
    both = QuantizeSpec(columnwise=True)
    runs = [(f"amax {config_name(c)}", c, lambda c=c: swiglu_amax(gu, c)) for c in AMAX_CANDIDATES]
    runs += [("axiswise cast, both passes", None, lambda: swiglu_cast_axiswise(gu, both)),
             ("blockwise cast, one pass", None, lambda: swiglu_cast_blockwise(gu, both))]
    records = []
    for name, config, run in runs:
        if config is not None and not all(torch.equal(got, want) for got, want in zip(run(), expected)):
            console.print(f"{name}: amaxes differ from the default config's; not timed")
            continue
        measurement = measure(run, timing, timer)
        gbps = gu.nbytes / (measurement.median_ms * 1e6)
        records.append({"variant": name, "default": config == AMAX_CONFIG, "rows": rows, "ffn": ffn,
                        "kernel_ms": measurement.median_ms, "spread_pct": measurement.spread_pct, "gu_read_gbps": gbps,
                        "pct_copy": 100 * gbps / copy_gbps, "sm_clock_mhz": measurement.sm_clock_median})
    return records


@app.command()
def main(
    rows: int = typer.Option(8192, min=1),
    ffn: int = typer.Option(14336, min=1, help="F: gu has 2F columns (LLaMa-3 8B: 14336)"),
    out: Optional[Path] = typer.Option(None, help="folder for amax.csv and metadata.json"),
) -> None:
    import pandas as pd
    import torch

    from fp8bench.harness.env import run_metadata, script_command_line

    if not torch.cuda.is_available():
        console.print("swiglu_amax_probe needs a CUDA GPU")
        raise typer.Exit(2)
    records = probe(rows, ffn)
    table = Table("variant", "ms", "spread %", "gu read GB/s", "% of copy")
    for r in records:
        table.add_row(r["variant"] + (" (default)" if r["default"] else ""), f"{r['kernel_ms']:.4f}", f"{r['spread_pct']:.1f}",
                      f"{r['gu_read_gbps']:.0f}", f"{r['pct_copy']:.0f}")
    console.print(table)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(records).to_csv(out / "amax.csv", index=False)
        (out / "metadata.json").write_text(json.dumps(run_metadata(script_command_line(), {"rows": rows, "ffn": ffn}), indent=1, default=str))


if __name__ == "__main__":
    app()
