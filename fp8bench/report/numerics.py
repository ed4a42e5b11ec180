"""The numerics benchmark's page: what FP8 training costs in quality, from a run folder's files only.

A numerics run folder holds summary rows in results.csv (one per curve; `rel_err` is the relative loss
gap over the last 10% of steps, `options` names the curve), the step-wise values in `curves.csv` (one
value per row: curve, step, metric, layer, role) and the per-layer tensor statistics in
`tensor_stats.csv.gz` (the same columns, gzip-compressed, on a thinning schedule of steps). Its loss
curves span granularities (BF16 and every recipe of every implementation on one chart), so the run gets
one page of its own rather than charts on the granularity pages. Each experiment opens with a paragraph of
conclusions written from the numbers of the files. The page shows what the folder holds, in this order:

- headline: per curve of the `loss` case its final relative gap to BF16 (seed 0) over the last 10% of
  steps, beside the BF16 seed-to-seed gap (the run-to-run noise the FP8 gaps compare with); the
  conclusion: how many curves are within 1%, the largest gap, from which step each gap stays within 1%;
- loss curves overlaid, the gap against steps with the noise band, validation loss, gradient norm;
- tensor statistics (runs with them): the conclusion (the most underflowing role per recipe, saturation,
  SQNR), underflow %, saturation %, amax and scale per role over steps (the mean over layers and the
  largest layer's), the lowest SQNR of the GEMM outputs against BF16 over steps and each GEMM's mean;
- delayed-scaling start-up and master-weight init (`startup.*` cases; ours, and TransformerEngine's FP8
  primary weights): per pair of arms its conclusion, loss and underflow of both arms over the steps;
- FP8 optimizer states (`optimizer.*` cases): the conclusion, memory, update error, loss gap, GB/s per
  optimizer.

Every gap is computed here from curves.csv as the benchmark defines it: the mean loss over the last 10%
of the steps up to a step, relative to the reference curve's over the same steps. Labels that come from
the files are escaped before they reach plotly, which renders HTML in labels.
"""

from __future__ import annotations

import html
import json
import math
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from fp8bench.config import Status
from fp8bench.harness.curves import CURVE_COLUMNS, CURVES_CSV, LAST_FRACTION, STAT_METRICS, TENSOR_STATS_CSV
from fp8bench.report.html import Chart, chart_id, colour_map, rows_table

BENCHMARK = "numerics"
DATA_FILES = (CURVES_CSV, TENSOR_STATS_CSV)  # what the page reads beside results.csv
REFERENCE_CURVE = "bf16-seed0"  # every loss curve's gap is to it; bf16 with another seed is the noise
GAP_TARGET = 0.01  # an FP8 recipe should stay within 1% of BF16's loss
# (curve-name prefix of the implementation, reference arm, compared arm): fp8bench.benchmarks.numerics.STARTUP_ARMS
STARTUP_PAIRS = (("", "calibrated", "scale-1"), ("", "master-from-hp", "master-from-fp8"), ("te-", "master-from-hp", "master-from-fp8"))
STARTUP_TITLES = {"": "", "te-": "TransformerEngine's FP8 primary weights (fp8_model_init, preserve_high_precision_init_val): "}
# The statistics drawn one chart each, with their axis labels (the history amax joins amax's chart; SQNR has its own).
STAT_LABELS = {"underflow_pct": "underflow, % of nonzero values", "saturate_pct": "saturated, % of values", "amax": "amax", "scale": "scale"}
TABLE_TEXT = ("curve", "recipe", "backend", "optimizer", "status", "verdict", "layer")


def read_curves(run_dir: Path) -> pd.DataFrame:
    """curves.csv of the run and its tensor statistics (TENSOR_STATS_CSV, where the run took them) in one
    typed frame; an empty frame where the run has neither. Raises ValueError naming the file when one is
    not a curves file (or not gzip where it should be)."""
    frames = [_read_values(path) for path in (Path(run_dir) / CURVES_CSV, Path(run_dir) / TENSOR_STATS_CSV) if path.exists()]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=float if c in ("step", "value") else str) for c in CURVE_COLUMNS})
    return pd.concat(frames, ignore_index=True)


def _read_values(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, compression="infer")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, pd.errors.ParserError) as err:
        raise ValueError(f"{path} cannot be read as a curves file: {err}") from None
    if tuple(frame.columns) != CURVE_COLUMNS:
        raise ValueError(f"{path} is not a curves file: its columns are {list(frame.columns)}, not {list(CURVE_COLUMNS)}")
    for column in ("step", "value"):
        numbers = pd.to_numeric(frame[column].replace("", None), errors="coerce")
        if (numbers.isna() & (frame[column] != "")).any():
            raise ValueError(f"{path} holds a {column} that is not a number")
        frame[column] = numbers
    return frame


def curve_options(rows: pd.DataFrame) -> pd.DataFrame:
    """The run's rows with their curve's name (`curve`) and `optimizer` from the options column."""
    options = rows["options"].map(lambda text: json.loads(text) if text else {})
    return rows.assign(curve=options.map(lambda o: str(o.get("curve", ""))), optimizer=options.map(lambda o: str(o.get("optimizer", ""))))


def values_by_curve(curves: pd.DataFrame, metric: str = "loss") -> dict[str, pd.Series]:
    """Per curve its values of `metric` indexed by step, in the order the run wrote the curves."""
    values = curves[curves["metric"] == metric]
    return {name: group.set_index("step")["value"].sort_index() for name, group in values.groupby("curve", sort=False)}


def trailing_means(loss: pd.Series) -> pd.Series:
    """At each step s, the mean loss over the last 10% of the steps up to s (at least one)."""
    values = loss.to_numpy(dtype=float)
    sums = np.concatenate(([0.0], np.cumsum(values)))
    ends = np.arange(1, len(values) + 1)
    windows = np.maximum(1, np.ceil(LAST_FRACTION * ends).astype(int))
    return pd.Series((sums[ends] - sums[ends - windows]) / windows, index=loss.index)


def gap_over_steps(loss: pd.Series, reference: pd.Series) -> pd.Series:
    """The relative gap of the trailing means at every step both curves have: positive where worse."""
    steps = loss.index.intersection(reference.index)
    ours, theirs = trailing_means(loss.loc[steps]), trailing_means(reference.loc[steps])
    return (ours - theirs) / theirs


def final_gap(loss: pd.Series, reference: pd.Series) -> float:
    gaps = gap_over_steps(loss, reference)
    return float(gaps.iloc[-1]) if len(gaps) else math.nan


def settles_at(loss: pd.Series, reference: pd.Series, tolerance: float = GAP_TARGET) -> int | None:
    """The first step from which the per-step loss stays within `tolerance` (relative) of the
    reference's at every later step; None when the last step is still outside it."""
    steps = loss.index.intersection(reference.index)
    outside = ~((loss.loc[steps] / reference.loc[steps] - 1).abs() <= tolerance).to_numpy()  # a NaN loss is outside
    if not len(steps) or outside[-1]:
        return None
    last_outside = np.flatnonzero(outside)
    return int(steps[last_outside[-1] + 1]) if len(last_outside) else int(steps[0])


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:+.2f}%"


def _band(value: float, seeds: int) -> str:
    if math.isnan(value):
        return "n/a (one BF16 seed)" if seeds < 2 else "n/a"
    return f"±{100 * value:.2f}%"


# ---- headline --------------------------------------------------------------------------------------


def headline(rows: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per curve of the `loss` case: recipe, backend, status, the final gap to BF16 seed 0 computed from
    curves.csv, and whether it is within the BF16 noise and within 1%."""
    loss_rows = curve_options(rows[rows["case"] == "loss"])
    loss = values_by_curve(curves)
    reference = loss.get(REFERENCE_CURVE)
    gaps = {name: final_gap(series, reference) for name, series in loss.items()} if reference is not None else {}
    noise = max((abs(g) for name, g in gaps.items() if name.startswith("bf16-") and name != REFERENCE_CURVE), default=math.nan)
    seeds = int((loss_rows["recipe"] == "bf16").sum())
    table = []
    for row in loss_rows.itertuples():
        if row.curve == REFERENCE_CURVE:
            continue
        gap = gaps.get(row.curve, math.nan)
        if row.recipe == "bf16":
            verdict = "the BF16 noise"
        elif math.isnan(gap):
            verdict = "not measured"
        else:
            within_target = f"{'within' if abs(gap) <= GAP_TARGET else 'OUTSIDE'} {GAP_TARGET:.0%}"
            within_noise = "" if math.isnan(noise) else f"{'within' if abs(gap) <= noise else 'outside'} the BF16 noise; "
            verdict = within_noise + within_target
        table.append({"curve": row.curve, "recipe": row.recipe, "backend": row.backend, "status": row.status,
                      "gap vs BF16, last 10%": _pct(gap), "BF16 noise": _band(noise, seeds), "verdict": verdict})  # fmt: skip
    return pd.DataFrame(table, columns=["curve", "recipe", "backend", "status", "gap vs BF16, last 10%", "BF16 noise", "verdict"])


def loss_conclusion(table: pd.DataFrame, curves: pd.DataFrame) -> str:
    """One paragraph from the headline table and the curves: how many FP8 curves are within 1% (and within
    the BF16 noise), the largest gap, from which step each gap stays within 1%, and what did not run."""
    loss = values_by_curve(curves)
    reference = loss.get(REFERENCE_CURVE)
    fp8 = table[table["recipe"] != "bf16"]
    measured = fp8[fp8["gap vs BF16, last 10%"] != "n/a"]
    text = []
    if len(measured) and reference is not None:
        gaps = {name: final_gap(loss[name], reference) for name in measured["curve"]}
        within = [name for name, gap in gaps.items() if abs(gap) <= GAP_TARGET]
        worst = max(gaps, key=lambda name: abs(gaps[name]))
        noise = table.loc[table["recipe"] == "bf16", "BF16 noise"]
        text.append(f"{len(within)} of the {len(gaps)} FP8 curves that ran end within {GAP_TARGET:.0%} of {REFERENCE_CURVE}'s loss over "
                    f"the last 10% of steps (BF16 noise {noise.iloc[0] if len(noise) else 'n/a (one BF16 seed)'}); the largest gap is "
                    f"{worst}'s, {_pct(gaps[worst])}.")  # fmt: skip
        settled = {name: settles_at(trailing_means(loss[name]), trailing_means(reference)) for name in gaps}
        late = [f"{name} from step {step}" for name, step in settled.items() if step is not None and step > 1]
        never = [name for name, step in settled.items() if step is None]
        if late:
            text.append(f"The trailing-mean gap stays within {GAP_TARGET:.0%} for good: {', '.join(late)}.")
        if never:
            text.append(f"Still outside {GAP_TARGET:.0%} at the last step: {', '.join(never)}.")
    not_run = fp8[fp8["status"] != Status.OK.value]
    if len(not_run):
        text.append("Not run: " + "; ".join(f"{row.curve} ({row.status})" for row in not_run.itertuples()) + ".")
    return " ".join(text)


# ---- charts ----------------------------------------------------------------------------------------


def _line_chart(series: dict[str, pd.Series], div_id: str, title: str, y: str, colours: dict[str, str], note: str = "") -> Chart:
    figure = go.Figure()
    for name, values in series.items():
        label = html.escape(name)
        figure.add_trace(go.Scatter(x=values.index, y=values.to_numpy(), mode="lines", name=label, line={"color": colours.get(name)}))
    figure.update_layout(xaxis_title="step", yaxis_title=y, height=450, legend_title_text="curve")
    return Chart(div_id, title, figure, note)


def loss_charts(curves: pd.DataFrame, names: list[str], prefix: str) -> list[Chart]:
    """Loss, validation loss and gradient norm of `names` overlaid, and the gap of each to the first
    against steps with the second BF16 seed's gap as the noise band (when the run has one)."""
    colours = colour_map(names)
    charts = []
    loss = {n: s for n, s in values_by_curve(curves).items() if n in names}
    if not loss:
        return charts
    charts.append(_line_chart(loss, chart_id(prefix, "loss"), "Training loss per step", "loss", colours))
    reference = loss.get(names[0])
    if reference is not None and len(loss) > 1:
        figure = go.Figure()
        noise = {n: gap_over_steps(s, reference) for n, s in loss.items() if n.startswith("bf16-") and n != names[0]}
        for name, band in noise.items():
            bound = band.abs()
            figure.add_trace(go.Scatter(x=bound.index, y=bound.to_numpy(), mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"))
            figure.add_trace(go.Scatter(x=bound.index, y=-bound.to_numpy(), mode="lines", line={"width": 0}, fill="tonexty",
                                        fillcolor="rgba(128,128,128,0.25)", name=html.escape(f"BF16 noise (|{name} gap|)")))  # fmt: skip
        for name, values in loss.items():
            if name == names[0] or name in noise:
                continue
            gap = gap_over_steps(values, reference)
            figure.add_trace(go.Scatter(x=gap.index, y=gap.to_numpy(), mode="lines", name=html.escape(name), line={"color": colours.get(name)}))
        figure.update_layout(xaxis_title="step", yaxis_title=f"relative loss gap to {html.escape(names[0])}", yaxis_tickformat=".1%", height=450)
        note = f"At each step: the mean loss over the last 10% of the steps so far, relative to {names[0]}'s over the same steps."
        if noise:
            note += " The grey band is the gap between BF16 with two seeds: run-to-run noise."
        charts.append(Chart(chart_id(prefix, "gap"), f"Relative loss gap to {names[0]} against steps", figure, note))
    for metric, title, y in (
        ("val_loss", "Validation loss (held-out text)", "validation loss"),
        ("grad_norm", "Gradient norm (before clipping)", "gradient norm"),
    ):
        values = {n: s for n, s in values_by_curve(curves, metric).items() if n in names}
        if values:
            charts.append(_line_chart(values, chart_id(prefix, metric), title, y, colours))
    return charts


def _stat_frame(curves: pd.DataFrame, recipes: dict[str, str]) -> pd.DataFrame:
    stats = curves[curves["metric"].isin(STAT_METRICS)].copy()
    stats["recipe"] = stats["curve"].map(lambda c: html.escape(recipes.get(c, c)))
    for column in ("curve", "layer", "role"):
        stats[column] = stats[column].map(html.escape)
    return stats


def stats_charts(curves: pd.DataFrame, recipes: dict[str, str]) -> list[Chart]:
    """Underflow, saturation, amax (with delayed scaling's history amax) and scale per role over steps, per
    recipe the mean over layers and the largest layer's; the lowest SQNR of the GEMM outputs over steps,
    and each GEMM's mean SQNR."""
    stats = _stat_frame(curves, recipes)
    if stats.empty:
        return []
    charts = []
    for metric, label in STAT_LABELS.items():
        shown = stats[stats["metric"].isin([metric, "history_amax"] if metric == "amax" else [metric])].dropna(subset=["value"])
        if shown.empty:
            continue
        # Over the layers, per recipe, role and step: the mean and the worst layer (a line per layer made pages
        # of megabytes; the table and the conclusion name the layers).
        keys = ["recipe", "curve", "role", "metric", "step"]
        spread = shown.groupby(keys, sort=False)["value"].agg(mean="mean", largest="max").reset_index()
        spread = spread.melt(id_vars=keys, value_vars=["mean", "largest"], var_name="over layers", value_name="value")
        figure = px.line(spread, x="step", y="value", color="recipe", line_dash="over layers", symbol="metric" if metric == "amax" else None,
                         line_group="metric", color_discrete_map=colour_map(spread["recipe"]), facet_col="role",
                         hover_data={"curve": True}, log_y=metric in ("amax", "scale"), labels={"value": label}, height=450)  # fmt: skip
        figure.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
        note = "Solid: the mean over layers; dashed: the largest layer's value."
        if metric == "amax":
            note += " Marker: the history amax delayed scaling scales by, or the current amax."
        charts.append(Chart(chart_id("stats", metric), f"{label} per role over steps, over the layers", figure, note))
    sqnr = stats[(stats["metric"] == "sqnr_db")].dropna(subset=["value"])
    if not sqnr.empty:
        lowest = sqnr.groupby(["recipe", "curve", "step"], sort=False)["value"].min().reset_index()
        figure = px.line(lowest, x="step", y="value", color="recipe", hover_data={"curve": True}, labels={"value": "lowest SQNR over the GEMMs, dB"},
                         height=450, color_discrete_map=colour_map(lowest["recipe"]))  # fmt: skip
        charts.append(Chart(chart_id("stats", "sqnr-steps"), "The lowest SQNR of the GEMM outputs against BF16 over steps", figure))
        mean = sqnr.groupby(["recipe", "layer"], sort=False)["value"].mean().reset_index()
        figure = px.bar(mean, x="layer", y="value", color="recipe", barmode="group", labels={"value": "mean SQNR, dB"}, height=450,
                        color_discrete_map=colour_map(mean["recipe"]))
        charts.append(Chart(chart_id("stats", "sqnr-per-gemm"), "Mean SQNR per GEMM (layer output against BF16)", figure))
    return charts


def stats_conclusion(curves: pd.DataFrame, recipes: dict[str, str]) -> str:
    """One paragraph from the statistics: per recipe the most underflowing role (mean over layers and
    steps) and its worst layer and step, the largest saturation, and the mean SQNR of the GEMM outputs."""
    stats = curves[curves["curve"].isin(recipes)].dropna(subset=["value"])
    text = []
    for curve, recipe in recipes.items():
        own = stats[stats["curve"] == curve]
        underflow = own[own["metric"] == "underflow_pct"]
        if underflow.empty:
            continue
        role = underflow.groupby("role")["value"].mean().idxmax()
        worst = underflow.loc[underflow["value"].idxmax()]
        sentence = (f"{recipe}: the {role} casts underflow most, {underflow[underflow['role'] == role]['value'].mean():.2f}% of nonzero "
                    f"values on average; at worst {worst['value']:.2f}% ({worst['role']} of {worst['layer']}, step {int(worst['step'])})")  # fmt: skip
        saturated = own[own["metric"] == "saturate_pct"]
        if len(saturated) and saturated["value"].max() > 0:
            peak = saturated.loc[saturated["value"].idxmax()]
            sentence += f"; {peak['value']:.3f}% saturate at step {int(peak['step'])} ({peak['role']} of {peak['layer']})"
        sqnr = own[own["metric"] == "sqnr_db"]["value"]
        if len(sqnr):
            sentence += f"; GEMM outputs {sqnr.mean():.1f} dB SQNR against BF16 on average (lowest {sqnr.min():.1f} dB)"
        text.append(sentence + ".")
    return " ".join(text)


# ---- start-up --------------------------------------------------------------------------------------


def startup_section(curves: pd.DataFrame) -> list[str]:
    """For each pair of start-up arms the run holds: loss and mean underflow per role over the steps,
    both arms overlaid, and the conclusion the numbers give."""
    loss = values_by_curve(curves)
    parts = []
    for prefix, first, second in STARTUP_PAIRS:
        names = [next((n for n in loss if n.startswith(f"{prefix}{start}-seed")), None) for start in (first, second)]
        if None in names:
            continue
        a, b = names
        conclusion = startup_conclusion(loss[a], loss[b], curves, a, b)
        parts.append(f"<h3>{html.escape(STARTUP_TITLES[prefix])}{html.escape(first)} against {html.escape(second)}</h3>"
                     f'<p class="conclusion">{html.escape(conclusion)}</p>')  # fmt: skip
        colours = colour_map(names)
        title = f"Loss over the first steps: {a} and {b}"
        parts.append(_line_chart({a: loss[a], b: loss[b]}, chart_id("startup", f"{prefix}{second}", "loss"), title, "loss", colours).to_html())
        underflow = mean_underflow(curves, names)
        if not underflow.empty:
            shown = underflow.assign(curve=underflow["curve"].map(html.escape), role=underflow["role"].map(html.escape))
            figure = px.line(shown, x="step", y="value", color="curve", facet_col="role", height=400,
                             color_discrete_map={html.escape(n): c for n, c in colours.items()},
                             labels={"value": "underflow, % of nonzero values (mean over layers)"})  # fmt: skip
            figure.for_each_annotation(lambda ann: ann.update(text=ann.text.split("=")[-1]))
            parts.append(Chart(chart_id("startup", f"{prefix}{second}", "underflow"), f"Underflow over the first steps: {a} and {b}", figure).to_html())
    return parts


def mean_underflow(curves: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Per curve, step and role the underflow % averaged over the layers."""
    values = curves[(curves["metric"] == "underflow_pct") & curves["curve"].isin(names)].dropna(subset=["value"])
    return values.groupby(["curve", "step", "role"], sort=False)["value"].mean().reset_index()


def startup_conclusion(loss_a: pd.Series, loss_b: pd.Series, curves: pd.DataFrame, a: str, b: str) -> str:
    """One paragraph: the early loss difference of `b` against `a`, where it falls within 1% for good,
    the gap over the last 10% of steps, and the first step's underflow of both arms."""
    steps = loss_a.index.intersection(loss_b.index)
    difference = loss_b.loc[steps] / loss_a.loc[steps] - 1
    worst = difference.abs().idxmax()
    settled = settles_at(loss_b, loss_a)
    text = [f"{b} starts at loss {loss_b.loc[steps[0]]:.4f} against {a}'s {loss_a.loc[steps[0]]:.4f} at step {int(steps[0])} "
            f"({_pct(difference.loc[steps[0]])}); the largest difference is {_pct(difference.loc[worst])} at step {int(worst)}."]  # fmt: skip
    if settled is None:
        text.append(f"The per-step losses are still more than {GAP_TARGET:.0%} apart at the last step, {int(steps[-1])}.")
    else:
        text.append(f"From step {settled} on, {b}'s loss stays within {GAP_TARGET:.0%} of {a}'s (it reaches {a}'s loss at step {settled}).")
    text.append(f"Over the last 10% of the {len(steps)} steps {b} is {_pct(final_gap(loss_b, loss_a))} from {a}.")
    first = mean_underflow(curves, [a, b])
    first = first[first["step"] == steps[0]].pivot(index="role", columns="curve", values="value")
    if {a, b} <= set(first.columns):
        role = first[b].idxmax()
        text.append(f"At step {int(steps[0])} the {role} casts lose {first.loc[role, b]:.2f}% of their nonzero values to underflow in {b} "
                    f"against {first.loc[role, a]:.2f}% in {a} (mean over layers; the role that underflows most in {b}).")  # fmt: skip
    return " ".join(text)


# ---- optimizer -------------------------------------------------------------------------------------


def optimizer_table(rows: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per optimizer: state bytes per parameter and their share of FP32 AdamW's, the update error after
    the last compared step, the loss gap to FP32 states, and the fused update's GB/s where timed."""
    state = curves[curves["metric"] == "state_bytes_per_param"].groupby("curve", sort=False)["value"].last()
    errors = curves[curves["metric"] == "update_rel_err"].sort_values("step").groupby("curve", sort=False)["value"].last()
    loss = values_by_curve(curves)
    optimizer_rows = curve_options(rows[rows["case"].str.startswith("optimizer.")])
    names = list(dict.fromkeys([*state.index, *optimizer_rows["optimizer"]]))
    reference = next((series for name, series in loss.items() if name.startswith("adamw-fp32")), None)
    table = []
    for name in names:
        timed = optimizer_rows[(optimizer_rows["case"] == "optimizer.update") & (optimizer_rows["optimizer"] == name)]
        trained = optimizer_rows[(optimizer_rows["case"] == "optimizer.loss") & (optimizer_rows["optimizer"] == name)]
        curve = trained["curve"].iloc[0] if len(trained) else ""
        gap = final_gap(loss[curve], reference) if curve in loss and reference is not None else math.nan
        status = "; ".join(dict.fromkeys(optimizer_rows.loc[optimizer_rows["optimizer"] == name, "status"])) or Status.OK.value
        table.append({
            "optimizer": name, "status": status, "state bytes / param": state.get(name, math.nan),
            "state memory vs FP32": _pct_of(state.get(name, math.nan), state.get("adamw-fp32", math.nan)),
            "update rel. error": errors.get(name, math.nan), "loss gap vs FP32, last 10%": _pct(gap),
            "GB/s": _first(timed, "gbps"), "% of copy bandwidth": _first(timed, "pct_peak"),
            "speedup vs torch fused": _first(timed, "speedup_vs_bf16"),
        })  # fmt: skip
    return pd.DataFrame(table)


def _pct_of(value: float, whole: float) -> str:
    return "n/a" if math.isnan(value) or math.isnan(whole) else f"{100 * value / whole:.1f}%"


def _first(rows: pd.DataFrame, column: str) -> float:
    return float(rows[column].iloc[0]) if len(rows) and pd.notna(rows[column].iloc[0]) else math.nan


def optimizer_conclusion(table: pd.DataFrame) -> str:
    """One paragraph from the optimizer table: per FP8 state format its memory, loss gap and update speed."""
    text = []
    for row in table[table["optimizer"] != "adamw-fp32"].to_dict("records"):
        sentence = f"{row['optimizer']}: states {row['state memory vs FP32']} of FP32's, loss gap {row['loss gap vs FP32, last 10%']}"
        if not math.isnan(row["GB/s"]):
            sentence += (f", the fused update at {row['% of copy bandwidth']:.1f}% of copy bandwidth and "
                         f"{row['speedup vs torch fused']:.2f}x torch's fused AdamW")  # fmt: skip
        text.append(sentence + ".")
    return " ".join(text)


def optimizer_section(rows: pd.DataFrame, curves: pd.DataFrame) -> list[str]:
    table = optimizer_table(rows, curves)
    if table.empty:
        return []
    parts = ["<h3>Optimizer states</h3>", f'<p class="conclusion">{html.escape(optimizer_conclusion(table))}</p>', rows_table(table, TABLE_TEXT),
             '<p class="note">Update error: ||p - p_FP32|| / ||p_FP32 - p_0|| after the last compared step, on the same '
             "seeded gradients. GB/s on the bytes the update must move; the speedup is against torch's fused AdamW (FP32 states).</p>"]  # fmt: skip
    names = list(table["optimizer"])
    colours = colour_map(names)
    errors = values_by_curve(curves, "update_rel_err")
    if errors:
        chart = _line_chart(errors, chart_id("optimizer", "update-error"), "Update error against FP32-state AdamW", "relative update error", colours)
        parts.append(chart.to_html())
    trained = curve_options(rows[rows["case"] == "optimizer.loss"])
    parts.extend(chart.to_html() for chart in loss_charts(curves, list(trained["curve"]), "optimizer"))
    return parts


# ---- the page --------------------------------------------------------------------------------------


def sections(run_dir: Path, rows: pd.DataFrame) -> list[str]:
    """The page's HTML sections for the run's numerics rows and its curves.csv, headline first."""
    curves = read_curves(run_dir)
    parts = []
    if curves.empty:
        parts.append(f'<p class="banner">The run folder holds no {CURVES_CSV} values: no gap, curve or statistic can be computed; '
                     "the rows below are all there is.</p>")  # fmt: skip
    loss_rows = curve_options(rows[rows["case"] == "loss"])
    if not loss_rows.empty:
        table = headline(rows, curves)
        parts.append(f"<h3>Loss gap to BF16 over the last 10% of steps</h3>{rows_table(table, TABLE_TEXT)}")
        parts.append(f'<p class="conclusion">{html.escape(loss_conclusion(table, curves))}</p>')
        parts.append(f'<p class="note">Gaps are relative to {REFERENCE_CURVE}: positive where worse. The BF16 noise is the gap '
                     "between BF16 with two seeds; an FP8 gap within it cannot be told from run-to-run noise.</p>")  # fmt: skip
        parts.extend(chart.to_html() for chart in loss_charts(curves, list(loss_rows["curve"]), "loss"))
    recipes = dict(zip(loss_rows["curve"], loss_rows["recipe"]))
    stats = stats_charts(curves[curves["curve"].isin(recipes)], recipes)
    if stats:
        parts.append(f'<h3>Tensor statistics</h3><p class="conclusion">{html.escape(stats_conclusion(curves, recipes))}</p>')
        parts.extend(chart.to_html() for chart in stats)
    startup = startup_section(curves)
    if startup:
        parts.append("<h3>Delayed-scaling start-up and master-weight init</h3>")
        parts.extend(startup)
    parts.extend(optimizer_section(rows, curves))
    return parts
