"""The matmul benchmark's charts: speedup over BF16, TFLOPS against the GPU's dense peak, and speedup
heatmaps when the run sweeps a grid of shapes.

Each builder takes one page's rows (one granularity's FP8 rows plus the BF16 reference rows) and
plots only rows whose status is `ok`; the page's table lists the rest. Whiskers come from the repeat
medians in `repeat_ms` (fastest and slowest repeat), the unit the harness measures.
"""

from __future__ import annotations

import html
import math

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fp8bench.config import Granularity
from fp8bench.model.hardware import GpuSpec
from fp8bench.report.html import (
    WHISKER_NOTE, Chart, chart_id, colour_map, plotted_rows, ratio_whiskers, run_order, throughput_whiskers,
)

SHAPE_KEYS = ["case", "M", "K", "N"]
TABLE_COLUMNS = (
    "case", "M", "K", "N", "backend", "fast_accum", "recipe", "status", "tflops", "pct_peak",
    "speedup_vs_bf16", "rel_err", "wall_ms", "sm_clock_mhz", "sm_clock_min_mhz", "throttled", "repeats", "dropped_repeats", "samples",
    "timer", "options",
)
CHART_HEIGHT_PX = 560  # room for long shape names under the axis
_HOVER = {"M": True, "K": True, "N": True, "median_ms": ":.4g", "spread_pct": ":.1f"}
_LABELS = {"backend_label": "backend", "accum_label": "fast-accum", "shape": "shape"}


def _plotted(rows: pd.DataFrame) -> pd.DataFrame:
    """The `ok` rows with their repeat bounds and labels escaped for plotly (report_html.plotted_rows)."""
    ok = plotted_rows(rows)
    ok["backend_label"] = ok["backend"].map(html.escape)
    ok["accum_label"] = ok["fast_accum"].map(html.escape)
    return ok


def speedup_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """Grouped bars of FP8 speedup per shape; colour is the backend, hatching the fast-accum setting."""
    ok = _plotted(rows)
    fp8 = ok[(ok["granularity"] != Granularity.NONE.value) & ok["speedup_vs_bf16"].notna()]
    if fp8.empty:
        return []
    bf16 = ok[ok["granularity"] == Granularity.NONE.value]
    fp8 = ratio_whiskers(fp8, bf16, SHAPE_KEYS, "speedup_vs_bf16")
    figure = px.bar(
        fp8, x="shape", y="speedup_vs_bf16", color="backend_label", pattern_shape="accum_label", barmode="group",
        color_discrete_map=colour_map(fp8["backend_label"]),
        error_y="whisker_up", error_y_minus="whisker_down", category_orders=run_order(fp8, "shape"),
        hover_data=_HOVER, labels={**_LABELS, "speedup_vs_bf16": "speedup over BF16"},
    )
    figure.update_layout(height=CHART_HEIGHT_PX)
    figure.add_hline(y=1.0, line_dash="dot", annotation_text="BF16", annotation_position="top left")
    return [Chart("matmul-speedup", "Speedup over BF16 (same shape, same run)", figure, WHISKER_NOTE)]


def tflops_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """TFLOPS per shape for every backend, BF16 included, with the GPU's dense peaks as lines."""
    ok = _plotted(rows)
    ok = ok[ok["tflops"].notna()]
    if ok.empty:
        return []
    ok = throughput_whiskers(ok, "tflops")
    figure = px.scatter(
        ok, x="shape", y="tflops", color="backend_label", symbol="accum_label", error_y="whisker_up",
        color_discrete_map=colour_map(ok["backend_label"]),
        error_y_minus="whisker_down", category_orders=run_order(ok, "shape"),
        hover_data={**_HOVER, "pct_peak": ":.1f"}, labels={**_LABELS, "tflops": "TFLOPS"},
    )
    figure.update_traces(marker_size=9)
    figure.update_layout(height=CHART_HEIGHT_PX)
    note = WHISKER_NOTE
    if gpu is None:
        note += " The run names no GPU model from the hardware table, so no peak is drawn."
    else:
        for dtype, peak in (("FP8", gpu.fp8_tflops), ("BF16", gpu.bf16_tflops)):
            figure.add_hline(
                y=peak, line_dash="dash", annotation_text=f"{dtype} dense peak, {gpu.name}: {peak:.0f}",
                annotation_position="top left",
            )
    return [Chart("matmul-tflops", "TFLOPS per shape against the dense peak", figure, note)]


def is_grid(rows: pd.DataFrame) -> bool:
    """Whether the shapes fill most of a grid of M x K x N values (a `sweep`), as opposed to a list."""
    shapes = rows[["M", "K", "N"]].drop_duplicates()
    sizes = [shapes[dim].nunique() for dim in ("M", "K", "N")]
    return sizes[1] >= 2 and sizes[2] >= 2 and math.prod(sizes) <= 2 * len(shapes)


def heatmap_id(backend: str, fast_accum: str) -> str:
    """The div id of a series' heatmap: only [a-z0-9-], whatever the backend is called."""
    return chart_id("matmul-heatmap", backend, fast_accum)


def speedup_heatmaps(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """For grid runs, one heatmap per backend and fast-accum setting: K down, N across, a panel per M."""
    if not is_grid(rows):
        return []
    ok = _plotted(rows)
    fp8 = ok[(ok["granularity"] != Granularity.NONE.value) & ok["speedup_vs_bf16"].notna()]
    charts = []
    for (backend, fast_accum), series in fp8.groupby(["backend", "fast_accum"], sort=False):
        ms = sorted(series["M"].unique())
        figure = make_subplots(rows=1, cols=len(ms), subplot_titles=[f"M = {m}" for m in ms], shared_yaxes=True)
        for column, m in enumerate(ms, start=1):
            grid = series[series["M"] == m].pivot_table(index="K", columns="N", values="speedup_vs_bf16", aggfunc="median")
            figure.add_trace(
                go.Heatmap(
                    z=grid.to_numpy(), x=[str(n) for n in grid.columns], y=[str(k) for k in grid.index],
                    coloraxis="coloraxis", texttemplate="%{z:.2f}",
                    hovertemplate=f"M={m}<br>K=%{{y}}<br>N=%{{x}}<br>speedup %{{z:.3f}}x<extra></extra>",
                ),
                row=1, col=column,
            )
            figure.update_xaxes(title_text="N", type="category", row=1, col=column)
        figure.update_yaxes(title_text="K", type="category", row=1, col=1)
        figure.update_layout(coloraxis={"colorscale": "RdBu", "cmid": 1.0, "colorbar": {"title": {"text": "speedup"}}})
        title = f"Speedup over BF16: {backend}, fast-accum {fast_accum}"
        charts.append(Chart(heatmap_id(backend, fast_accum), title, figure))
    return charts
