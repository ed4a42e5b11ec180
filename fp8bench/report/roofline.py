"""The roofline benchmark's charts: the LayerNorm -> Linear -> sigmoid step's speedup over BF16 (compiled)
as measured beside the roofline model's prediction, the share of the predicted gain that was measured,
where the measured kernel time goes (GEMM, cast, other), and how close each step's results are to the
BF16 layer's (SQNR).

Rows as fp8bench.model.roofline and fp8bench.benchmarks.layer write them: predictions (backend `model`; options name the
model, the implementation for the refined model, and the ceilings) and measured steps (backend
`<implementation>` or `<implementation>-compile`; options name the implementation and whether it was
compiled). A run without a GPU holds predictions only: its page opens with a table of what was
predicted (a row per shape, recipe and implementation, a column per set of ceilings: several GPU models
side by side), then the predicted speedups and the predicted step split into GEMM, cast and other
kernels (the prediction rows' gemm_ms, cast_ms, other_ms); the charts of measurements are left out. Only `ok` rows are plotted; the page's table lists the rest. Whiskers come
from the repeat medians in `repeat_ms` (fastest and slowest repeat), as the matmul charts do.
"""

from __future__ import annotations

import html
import json

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from fp8bench.config import Granularity
from fp8bench.model.hardware import GpuSpec
from fp8bench.harness.results import BREAKDOWN_STEPS, LAYER_REFERENCE_BACKEND as REFERENCE_BACKEND, MODEL_BACKEND
from fp8bench.report.e2e import Section
from fp8bench.report.html import (
    Chart, chart_id, colour_map, panels_height, plotted_rows, ratio_whisker_note, ratio_whiskers, run_order,
    rows_table, stacked_time_figure,
)

CASE_KEYS = ["case", "M", "K", "N"]
TABLE_COLUMNS = (
    "case", "M", "K", "N", "backend", "recipe", "status", "speedup_vs_bf16", "predicted_speedup",
    "measured_vs_predicted", "predicted_ms", "bound", "gemm_ms", "cast_ms", "other_ms", "sqnr_out_db",
    "sqnr_grad_input_db", "sqnr_grad_weight_db", "wall_ms", "sm_clock_mhz", "sm_clock_min_mhz", "throttled", "repeats", "dropped_repeats",
    "samples", "timer", "options",
)
# Measured kernel time by kind of kernel (fp8bench.benchmarks.layer.KERNEL_KINDS), as stacked in the bars.
KERNEL_TIME_COLUMNS = {"gemm_ms": "GEMM", "cast_ms": "cast", "other_ms": "other"}
SQNR_COLUMNS = {"sqnr_out_db": "output", "sqnr_grad_input_db": "grad_input", "sqnr_grad_weight_db": "grad_weight"}
# The bar tests/test_float8_linear.py holds a product with e4m3 operands to against BF16 (e4m3's noise on
# normal data is about 28 dB; an e5m2 operand's about 24.6).
SQNR_FLOOR_DB = 25.0
# Filled markers for measurements, open ones for predictions (one per set of ceilings).
SYMBOLS = {
    "measured (compiled)": "circle", "measured (eager)": "diamond",
    "predicted (spec ceilings)": "circle-open", "predicted (calibrated ceilings)": "square-open",
}
_HOVER = {
    "M": True, "K": True, "N": True, "median_ms": ":.4g", "spread_pct": ":.1f", "predicted_ms": ":.4g", "bound": True,
}
_LABELS = {
    "shape": "shape", "implementation_label": "implementation", "backend_label": "backend", "recipe_label": "recipe",
    "what": "measured or predicted", "speedup": "speedup over BF16 (compiled)",
    "measured_vs_predicted": "measured / predicted speedup", "step": "step: backend, recipe", "kernels": "kernels",
    "ms": "ms per step", "sqnr_db": "SQNR, dB", "tensor": "tensor",
}


def _implementation(options: dict) -> str:
    """Whose step a row is: its implementation (bf16, triton, torchao, te, unfused), or the model that
    predicts it where no implementation is named (torchao's public model)."""
    return options.get("implementation") or f"{options['model']} model"


def _what(backend: str, options: dict) -> str:
    """Measured (compiled or eager), or predicted under which ceilings."""
    if backend == MODEL_BACKEND:
        return f"predicted ({options['ceilings']} ceilings)"
    return "measured (compiled)" if options.get("compiled") else "measured (eager)"


def _plotted(rows: pd.DataFrame) -> pd.DataFrame:
    """The `ok` rows with their repeat bounds and labels escaped for plotly (report_html.plotted_rows)."""
    ok = plotted_rows(rows)
    options = ok["options"].map(json.loads)
    ok["implementation_label"] = options.map(_implementation).map(html.escape)
    ok["what"] = [html.escape(_what(backend, o)) for backend, o in zip(ok["backend"], options)]
    ok["backend_label"] = ok["backend"].map(html.escape)
    ok["recipe_label"] = ok["recipe"].map(html.escape)
    ok["bound"] = ok["bound"].map(html.escape)  # in the hover label, which plotly renders as HTML
    ok["measured"] = ok["backend"] != MODEL_BACKEND
    return ok


def _points_by_recipe(points: pd.DataFrame, y: str) -> go.Figure:
    """Markers of `y` per shape, a panel per recipe, a colour per implementation (the same on every page)
    and a symbol for what each is; an implementation's markers share one slot beside each shape, so that
    measured and predicted stand one above the other."""
    figure = px.scatter(
        points, x="shape", y=y, color="implementation_label", symbol="what", facet_row="recipe_label",
        error_y="whisker_up", error_y_minus="whisker_down", symbol_map=SYMBOLS,
        color_discrete_map=colour_map(points["implementation_label"]),
        category_orders=run_order(points, "shape", "recipe_label", "implementation_label", "what"),
        hover_data=_HOVER, labels=_LABELS,
    )
    implementation_of = {f"{i}, {w}": i for i, w in zip(points["implementation_label"], points["what"])}
    for trace in figure.data:
        trace.offsetgroup = implementation_of[trace.name]
    figure.update_traces(marker_size=9)
    figure.update_layout(height=panels_height(points["recipe_label"].nunique()), scattermode="group")
    return figure


def _prediction_only(rows: pd.DataFrame) -> bool:
    return bool(len(rows)) and bool((rows["backend"] == MODEL_BACKEND).all())


def _predicted_step(options: dict, recipe: str) -> str:
    """Whose step a prediction row is, in words: the BF16 layer (per model) or an implementation."""
    if recipe == "bf16":
        return f"bf16 ({options['model']} model)"
    return _implementation(options)


def _prediction_cell(row: pd.Series) -> str:
    if not str(row["status"]).startswith("ok"):
        return str(row["status"])
    speedup = f"{row['predicted_speedup']:.2f}x, " if pd.notna(row["predicted_speedup"]) else ""
    return f"{speedup}{row['predicted_ms']:.4g} ms, {row['bound']}-bound"


def prediction_table(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Section]:
    """For a run of predictions only: what was predicted, a row per shape, recipe and step, a column per
    set of ceilings (each GPU model's datasheet or calibration side by side)."""
    if not _prediction_only(rows):
        return []
    options = rows["options"].map(json.loads)
    table = pd.DataFrame(
        {
            "shape": rows["case"], "recipe": rows["recipe"],
            "implementation": [_predicted_step(o, r) for o, r in zip(options, rows["recipe"])],
            "ceilings": options.map(lambda o: o["ceilings"]),
            "cell": [_prediction_cell(row) for _, row in rows.iterrows()],
        }
    )  # fmt: skip
    order = run_order(table, "shape", "recipe", "implementation", "ceilings")
    wide = table.pivot_table(index=["shape", "recipe", "implementation"], columns="ceilings", values="cell", aggfunc="first", sort=False)
    wide = wide.reindex(columns=order["ceilings"]).reset_index().fillna("")
    wide.columns = [*wide.columns[:3], *(f"{c} ceilings" for c in wide.columns[3:])]
    note = (
        "Predicted by the roofline model, nothing measured: per step the FP8 speedup over the BF16 step of "
        "the same model, the predicted fwd + bwd time and what bounds it, under each set of ceilings "
        "(the run's metadata names each); an empty step says why (unsupported: the shape; no such recipe: "
        "the implementation or model defines none)."
    )
    body = rows_table(wide, ("shape", "recipe", "implementation", *wide.columns[3:]))
    return [Section("roofline-predictions", "What was predicted", body, note)]


def predicted_breakdown_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """For a run of predictions only: per shape, each predicted step's time stacked by kind of kernel
    (GEMM, cast, other), a panel per set of ceilings."""
    if not _prediction_only(rows):
        return []
    ok = _plotted(rows).dropna(subset=list(KERNEL_TIME_COLUMNS))
    if ok.empty:
        return []
    options = ok["options"].map(json.loads)
    ok["step"] = [
        html.escape(f"{_predicted_step(o, r)}<br>{r}" if r != "bf16" else _predicted_step(o, r))
        for o, r in zip(options, ok["recipe"])
    ]
    ok["ceilings_label"] = options.map(lambda o: html.escape(o["ceilings"]))
    charts = []
    for case, of_shape in ok.groupby("case", sort=False):
        parts = of_shape.melt(id_vars=["step", "ceilings_label"], value_vars=list(KERNEL_TIME_COLUMNS), var_name="kernels", value_name="ms")
        parts = parts[parts["ms"] > 0]  # a kind of kernel the step does not have draws no bar
        parts["kernels"] = parts["kernels"].map(KERNEL_TIME_COLUMNS)
        figure = px.bar(
            parts, x="step", y="ms", color="kernels", facet_col="ceilings_label", barmode="stack",
            category_orders={**run_order(parts, "step", "ceilings_label"), "kernels": list(KERNEL_TIME_COLUMNS.values())},
            hover_data={"ms": ":.4g"}, labels={**_LABELS, "step": "step", "ms": "predicted ms per step", "ceilings_label": "ceilings"},
        )  # fmt: skip
        note = (
            "The roofline model's fwd + bwd step split by kind of kernel (predicted_kernels.csv lists each "
            "kernel): GEMMs, FP8 casts with their amax and scale kernels, and the rest (LayerNorm, sigmoid, "
            "copies); a panel per set of ceilings. Predictions, not measurements."
        )
        charts.append(Chart(chart_id("roofline-predicted-time", case), f"Predicted time per step: {case}", figure, note))
    return charts


def speedup_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """Measured speedup over the compiled BF16 step beside the model's predictions, per shape and recipe."""
    ok = _plotted(rows)
    fp8 = ok[ok["granularity"] != Granularity.NONE.value]
    measured = fp8[fp8["measured"] & fp8["speedup_vs_bf16"].notna()]
    predicted = fp8[~fp8["measured"] & fp8["predicted_speedup"].notna()]
    if measured.empty and predicted.empty:
        return []
    reference = ok[ok["backend"] == REFERENCE_BACKEND]
    measured = ratio_whiskers(measured, reference, CASE_KEYS, "speedup_vs_bf16")
    points = pd.concat(
        [measured.assign(speedup=measured["speedup_vs_bf16"]), predicted.assign(speedup=predicted["predicted_speedup"])],
        ignore_index=True,
    )
    figure = _points_by_recipe(points, "speedup")
    if measured.empty:
        figure.add_hline(y=1.0, line_dash="dot", annotation_text="BF16", annotation_position="top left")
        note = (
            "The roofline model's predicted FP8 speedup over the BF16 step of the same model: the refined "
            "model per implementation and torchao's public model, a symbol per set of ceilings. Nothing was "
            "measured in this run."
        )
        return [Chart("roofline-speedup", "Predicted speedup over BF16", figure, note)]
    figure.add_hline(y=1.0, line_dash="dot", annotation_text="BF16 (compiled)", annotation_position="top left")
    note = (
        f"Filled markers: measured, {REFERENCE_BACKEND}'s kernel time over the step's (same shape, same run). "
        "Open markers: the roofline model's predicted speedup, the refined model per implementation and "
        "torchao's public model, under each set of ceilings in the run; a prediction has no whiskers. "
        + ratio_whisker_note(REFERENCE_BACKEND)
    )
    return [Chart("roofline-speedup", "Speedup over BF16 (compiled): measured and predicted", figure, note)]


def measured_vs_predicted_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """Measured speedup over predicted speedup per measured FP8 step, with a line at 1 (as predicted)."""
    ok = _plotted(rows)
    measured = ok[ok["measured"] & ok["measured_vs_predicted"].notna()]
    if measured.empty:
        return []
    reference = ok[ok["backend"] == REFERENCE_BACKEND]
    measured = ratio_whiskers(measured, reference, CASE_KEYS, "measured_vs_predicted")
    figure = _points_by_recipe(measured, "measured_vs_predicted")
    figure.add_hline(y=1.0, line_dash="dot", annotation_text="as predicted", annotation_position="top left")
    note = (
        "The measured speedup over the refined model's predicted speedup for the step's implementation and "
        "recipe, under the ceilings its options name (calibrated where the run had a profile). "
        + ratio_whisker_note(REFERENCE_BACKEND)
    )
    return [Chart("roofline-measured-vs-predicted", "Measured speedup / predicted speedup", figure, note)]


def kernel_time_charts(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """For each shape, the measured steps' kernel time stacked by kind (GEMM, cast, other), with the
    step's median kernel time and its repeats beside each stack."""
    ok = _plotted(rows)
    steps = ok[ok["measured"] & ok[list(KERNEL_TIME_COLUMNS)].notna().all(axis=1)]
    steps = steps.assign(step=steps["backend_label"] + "<br>" + steps["recipe_label"])
    charts = []
    for case, of_shape in steps.groupby("case", sort=False):
        figure = stacked_time_figure(of_shape, KERNEL_TIME_COLUMNS, "median kernel time", _LABELS)
        note = (
            "Bars: GPU time per step of the kernels of each kind, by kernel name (fp8bench.benchmarks.layer.KERNEL_KINDS; "
            f"a cast fused into LayerNorm or the sigmoid counts as other), the mean over {BREAKDOWN_STEPS} "
            "flushed steps; every kernel is in the run's measured_kernels.csv. Black dashes: the step's "
            "median kernel time over repeats, whiskers from the fastest to the slowest repeat."
        )
        title = f"Measured kernel time per step: {case}"
        charts.append(Chart(chart_id("roofline-kernel-time", case), title, figure, note))
    return charts


def sqnr_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """SQNR of the output and of both gradients against the BF16 eager layer per shape, a colour per
    backend and a symbol per recipe, with the 25 dB bar."""
    ok = _plotted(rows)
    measured = ok[ok["measured"]]
    points = measured.melt(
        id_vars=["shape", "backend_label", "recipe_label", "M", "K", "N"], value_vars=list(SQNR_COLUMNS),
        var_name="tensor", value_name="sqnr_db",
    ).dropna(subset=["sqnr_db"])
    if points.empty:
        return []
    points["tensor"] = points["tensor"].map(SQNR_COLUMNS)
    figure = px.scatter(
        points, x="shape", y="sqnr_db", color="backend_label", symbol="recipe_label", facet_row="tensor",
        color_discrete_map=colour_map(points["backend_label"]),
        category_orders={
            **run_order(points, "shape", "backend_label", "recipe_label"), "tensor": list(SQNR_COLUMNS.values()),
        },
        hover_data={"M": True, "K": True, "N": True, "sqnr_db": ":.1f"}, labels=_LABELS,
    )
    figure.update_traces(marker_size=9)
    figure.update_layout(height=panels_height(len(SQNR_COLUMNS)), scattermode="group")
    figure.add_hline(
        y=SQNR_FLOOR_DB, line_dash="dot", annotation_text=f"{SQNR_FLOOR_DB:.0f} dB", annotation_position="bottom left",
    )
    note = (
        "20 log10(|ref| / |ref - step|) of the step's output and of the gradients of x and of the weight, "
        "against the BF16 eager layer on the same inputs; higher is closer. The dotted line is the bar the "
        "tests hold an e4m3 product to (e4m3's noise on normal data is about 28 dB; an e5m2 operand's about "
        "24.6). A step identical to the reference has no finite SQNR and is not drawn."
    )
    return [Chart("roofline-sqnr", "SQNR against the BF16 eager layer", figure, note)]


CHARTS = (prediction_table, speedup_chart, predicted_breakdown_chart, measured_vs_predicted_chart, kernel_time_charts, sqnr_chart)
