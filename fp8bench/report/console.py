"""Console output of result rows: one line per finished case, then a table in torchao's shape; and a
DataFrame as a table, for the tools' probes."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from rich.console import Console
from rich.table import Table

from fp8bench.harness.results import Row


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def frame_table(frame: pd.DataFrame, title: str, columns: Sequence[str] | None = None) -> Table:
    """`columns` of `frame` (all by default) as a rich table: floats to 4 significant digits, missing values blank."""
    table = Table(title=title, title_justify="left")
    columns = list(frame.columns if columns is None else columns)
    for column in columns:
        table.add_column(column)
    for record in frame.to_dict("records"):
        table.add_row(*(_frame_cell(record[c]) for c in columns))
    return table


def _frame_cell(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_row(console: Console, row: Row) -> None:
    v = row.values
    label = f"{v['case']:>28} {v['backend']:>8} {v['granularity']:>10} fast_accum={v['fast_accum']:<4}"
    if v["status"] != "ok":
        console.print(f"{label} [yellow]{v['status']}[/]")
        return
    speedup = v.get("speedup_vs_bf16")
    console.print(
        f"{label} {v['median_ms']:9.4f} ms ±{v['spread_pct']:4.1f}%  {v['tflops']:7.1f} TFLOPS"
        + (f"  {speedup:5.2f}x" if speedup else "")
    )


def print_summary(console: Console, rows: list[Row] | None) -> None:
    """Per granularity: BF16 time, FP8 time and speedup per backend and fast-accum setting."""
    if not rows:
        return
    fp8 = [r.values for r in rows if r.values["granularity"] != "none"]
    for granularity in dict.fromkeys(v["granularity"] for v in fp8):
        table = Table(title=f"{granularity} scaling", title_justify="left")
        for column in ("fast_accum", "backend", "shape", "M", "K", "N", "bf16 ms", "fp8 ms", "speedup", "TFLOPS", "% peak", "spread %"):
            table.add_column(column, justify="left" if column in ("fast_accum", "backend", "shape") else "right")
        group = sorted(
            (v for v in fp8 if v["granularity"] == granularity),
            key=lambda v: (v["fast_accum"] != "on", v["backend"]),
        )
        for v in group:
            ok = v["status"] == "ok"
            speedup = v.get("speedup_vs_bf16")
            bf16_ms = v["median_ms"] * speedup if ok and speedup else None
            table.add_row(
                v["fast_accum"], v["backend"], v["case"], str(v["M"]), str(v["K"]), str(v["N"]),
                _fmt(bf16_ms, ".4f"),
                _fmt(v.get("median_ms"), ".4f") if ok else v["status"].split(":")[0],
                _fmt(speedup, ".2f"), _fmt(v.get("tflops"), ".0f"), _fmt(v.get("pct_peak"), ".0f"),
                _fmt(v.get("spread_pct"), ".1f"),
            )
        console.print(table)
        for reason in dict.fromkeys(v["status"] for v in group if v["status"] != "ok"):
            console.print(f"  [yellow]{reason}[/]")
