"""The cast benchmark's charts: each quantize kernel's bandwidth per tensor, as GB/s and as a share of the
copy bandwidth measured on the same tensor in the same run.

Rows as fp8bench.benchmarks.cast writes them: per tensor x[M, K] (`case`) the device copy of x (recipe `copy`,
backend `torch`, granularity none) first, then each recipe -- which quantize kernel -- by each
implementation (`backend`). A chart has a panel per tensor, the recipes along x and a colour per
implementation; it plots only `ok` rows (the page's table lists the rest), with whiskers from the
repeat medians in `repeat_ms` (fastest and slowest repeat), as the matmul charts do.
"""

from __future__ import annotations

import html

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from fp8bench.harness.results import COPY_RECIPE
from fp8bench.model.hardware import GpuSpec
from fp8bench.report.html import (
    WHISKER_NOTE, Chart, colour_map, panels_height, plotted_rows, ratio_whisker_note, ratio_whiskers, run_order,
    throughput_whiskers,
)

CASE_KEYS = ["case", "M", "K"]
TABLE_COLUMNS = (
    "case", "M", "K", "backend", "recipe", "status", "gbps", "pct_peak", "rel_err", "wall_ms", "sm_clock_mhz",
    "sm_clock_min_mhz", "throttled", "repeats", "dropped_repeats", "samples", "timer", "options",
)
# The bar a quantize kernel is held to (kernels/README.md): 85 % of the copy bandwidth on the least
# bytes, for tensors of 64 MiB and more.
TARGET_PCT_OF_COPY = 85.0
_HOVER = {"M": True, "K": True, "median_ms": ":.4g", "spread_pct": ":.1f", "gbps": ":.0f", "pct_peak": ":.1f"}
_LABELS = {
    "backend_label": "implementation", "recipe_label": "recipe", "shape": "tensor",
    "gbps": "GB/s", "pct_peak": "% of copy bandwidth",
}
_BYTES_NOTE = (
    "GB/s counts the least a recipe must move: x read once, each fp8 copy and each scale written once; "
    "the copy counts x read and written."
)


def _plotted(rows: pd.DataFrame) -> pd.DataFrame:
    """The `ok` rows with their repeat bounds and labels escaped for plotly (report_html.plotted_rows)."""
    ok = plotted_rows(rows)
    ok["backend_label"] = ok["backend"].map(html.escape)
    ok["recipe_label"] = ok["recipe"].map(html.escape)
    return ok


def _bars(frame: pd.DataFrame, column: str) -> go.Figure:
    """Grouped bars of `column` with their whiskers: a panel per tensor, recipes along x, a colour per
    implementation (the same on every page), everything in run order."""
    figure = px.bar(
        frame, x="recipe_label", y=column, color="backend_label", facet_row="shape", barmode="group",
        error_y="whisker_up", error_y_minus="whisker_down",
        color_discrete_map=colour_map(frame["backend_label"]),
        category_orders=run_order(frame, "shape", "recipe_label", "backend_label"), hover_data=_HOVER, labels=_LABELS,
    )
    figure.update_layout(height=panels_height(frame["shape"].nunique()))
    return figure


def gbps_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """GB/s of every recipe and implementation per tensor, the copy's among them, with the GPU's
    datasheet bandwidth as a line."""
    ok = _plotted(rows)
    ok = ok[ok["gbps"].notna()]
    if ok.empty:
        return []
    figure = _bars(throughput_whiskers(ok, "gbps"), "gbps")
    note = f"{WHISKER_NOTE} {_BYTES_NOTE}"
    if gpu is None:
        note += " The run names no GPU model from the hardware table, so no datasheet bandwidth is drawn."
    else:
        peak = gpu.mem_bw_tbps * 1e3
        figure.add_hline(
            y=peak, line_dash="dash", annotation_text=f"datasheet bandwidth, {gpu.name}: {peak:.0f} GB/s",
            annotation_position="top left",
        )
    return [Chart("cast-gbps", "Achieved GB/s per tensor (the copy of the same tensor included)", figure, note)]


def pct_of_copy_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """Each recipe's GB/s as % of the copy's on the same tensor in the same run, with lines at 100 %
    (the copy) and at the 85 % target."""
    ok = _plotted(rows)
    casts = ok[(ok["recipe"] != COPY_RECIPE) & ok["pct_peak"].notna()]
    if casts.empty:
        return []
    copies = ok[ok["recipe"] == COPY_RECIPE]
    figure = _bars(ratio_whiskers(casts, copies, CASE_KEYS, "pct_peak"), "pct_peak")
    figure.add_hline(y=100.0, annotation_text="copy, same tensor, same run", annotation_position="top left")
    figure.add_hline(
        y=TARGET_PCT_OF_COPY, line_dash="dot", annotation_text=f"{TARGET_PCT_OF_COPY:.0f} % target",
        annotation_position="bottom left",
    )
    note = (
        f"{ratio_whisker_note('the copy')} {_BYTES_NOTE} The target holds for tensors of 64 MiB and more. "
        "Kernels that read x twice by design (a tensor-wide or column amax first: tensorwise, axiswise+t) "
        "cannot reach 100 % on that count; options.bytes_moved says what ours move."
    )
    return [Chart("cast-pct-of-copy", "GB/s as % of the copy bandwidth of the same tensor", figure, note)]


CHARTS = (gbps_chart, pct_of_copy_chart)
