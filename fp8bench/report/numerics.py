"""The numerics benchmark's page: what FP8 training costs in quality, from a run folder's files only.

A numerics run folder holds summary rows in results.csv (one per curve; `rel_err` is the relative loss
gap over the last 10% of steps, `options` names the curve), the step-wise values in `curves.csv.gz` (one
value per row: curve, step, metric, layer, role; a plain `curves.csv` in a folder an older fp8bench wrote)
and the per-layer tensor statistics in `tensor_stats.csv.gz` (the same columns, on a thinning schedule of
steps); both are gzip-compressed CSV read as fp8bench.harness.curves.read_values_text reads them. Its loss
curves span granularities (BF16 and every recipe of every implementation on one chart), so the run gets
one page of its own rather than charts on the granularity pages. Each experiment opens with a paragraph of
conclusions written from the numbers of the files. The page shows what the folder holds, in this order:

- headline: BF16's seeds and their run-to-run noise (the standard deviation of the loss over the last
  10% of steps), then per implementation and FP8 recipe of the `loss` case the mean over its seeds of
  each seed's gap to BF16 with the same seed, the seeds' range, the noise band and whether the gap is
  within it and within 1%; the conclusion names the recipes outside either;
- loss curves overlaid, each curve's gap to its reference against steps with the BF16 seeds' gaps as
  the noise band, validation loss, gradient norm;
- tensor statistics (runs with them): the conclusion (the most underflowing role per recipe, saturation,
  SQNR), underflow %, saturation %, amax and scale per role over steps (the mean over layers and the
  largest layer's), the lowest SQNR of the GEMM outputs against BF16 over steps and each GEMM's mean;
- delayed-scaling start-up and master-weight init (`startup.*` cases; ours, and TransformerEngine's FP8
  primary weights): per pair of arms its conclusion, loss and underflow of both arms over the steps;
- FP8 optimizer states (`optimizer.*` cases): the conclusion, memory, update error, loss gap, GB/s per
  optimizer.

Every gap is computed here from the curves file as the benchmark defines it: the mean loss over the last 10%
of the steps up to a step, relative to the reference curve's over the same steps. Labels that come from
the files are escaped before they reach plotly, which renders HTML in labels.
"""

from __future__ import annotations

import html
import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from fp8bench.config import Granularity, Status
from fp8bench.harness.curves import (
    CURVE_COLUMNS, CURVES_CSV, GAP_TARGET, LAST_FRACTION, LEGACY_CURVES_CSV, STAT_METRICS, TENSOR_STATS_CSV, SeedGaps, bf16_noise,
    curves_file, read_values_text,
)
from fp8bench.report.e2e import OURS
from fp8bench.report.html import Chart, chart_id, colour_map, rows_table

BENCHMARK = "numerics"
DATA_FILES = (CURVES_CSV, LEGACY_CURVES_CSV, TENSOR_STATS_CSV)  # what the page reads beside results.csv
# (curve-name prefix of the implementation, reference arm, compared arm): fp8bench.benchmarks.numerics.STARTUP_ARMS
STARTUP_PAIRS = (("", "calibrated", "scale-1"), ("", "master-from-hp", "master-from-fp8"), ("te-", "master-from-hp", "master-from-fp8"))
STARTUP_TITLES = {"": "", "te-": "TransformerEngine's FP8 primary weights (fp8_model_init, preserve_high_precision_init_val): "}
# The statistics drawn one chart each, with their axis labels (the history amax joins amax's chart; SQNR has its own).
STAT_LABELS = {"underflow_pct": "underflow, % of nonzero values", "saturate_pct": "saturated, % of values", "amax": "amax", "scale": "scale"}
TABLE_TEXT = ("curve", "recipe", "backend", "optimizer", "status", "verdict", "layer")


def read_curves(run_dir: Path) -> pd.DataFrame:
    """The run's curves file (curves_file) and its tensor statistics (TENSOR_STATS_CSV, where the run took
    them) in one typed frame; an empty frame where the run has neither. Raises ValueError naming the file
    when one is not a curves file (MalformedFile: not gzip where it should be, a torn plain last line), and
    UsageError where the folder holds both curves files."""
    paths = (curves_file(run_dir), Path(run_dir) / TENSOR_STATS_CSV)
    frames = [_read_values(path) for path in paths if path is not None and path.exists()]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=float if c in ("step", "value") else str) for c in CURVE_COLUMNS})
    return pd.concat(frames, ignore_index=True)


def _read_values(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(io.StringIO(read_values_text(path), newline=""), dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
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


# ---- headline --------------------------------------------------------------------------------------

HEADLINE_COLUMNS = ["implementation", "recipe", "seeds", "status", "gap vs BF16, last 10%", "over the seeds", "noise band", "verdict"]


def _seed(options: str) -> int:
    return int(json.loads(options or "{}").get("seed", 0))


def headline(rows: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per implementation and FP8 recipe of the `loss` case: its gap to BF16 over the last 10% of steps, the
    mean over its seeds of each seed's gap to BF16 with the same seed (computed from the curves file), the
    seeds' range, the band the run-to-run noise alone would give the mean (fp8bench.harness.curves.SeedGaps:
    from the BF16 curves' spread) and whether the gap is within it and within 1%. The first line is BF16:
    its seeds and their noise."""
    loss_rows = curve_options(rows[rows["case"] == "loss"])
    loss_rows = loss_rows.assign(seed=loss_rows["options"].map(_seed))
    loss = values_by_curve(curves)
    bf16 = loss_rows[loss_rows["recipe"] == "bf16"]
    bf16_losses = [loss[name].to_list() for name in bf16["curve"] if name in loss]
    noise = bf16_noise(bf16_losses)
    first = bf16["curve"].iloc[0] if len(bf16) else None
    spread = [final_gap(loss[name], loss[first]) for name in bf16["curve"] if first in loss and name in loss and name != first]
    table = [{
        "implementation": "bf16", "recipe": "bf16", "seeds": len(bf16_losses), "status": _statuses(bf16),
        "gap vs BF16, last 10%": "", "over the seeds": _range(spread, f"to {first}") if spread else "one seed",
        "noise band": "n/a (one seed)" if math.isnan(noise) else f"σ {100 * noise:.2f}%",
        "verdict": "the run-to-run noise: the standard deviation of the BF16 seeds' loss",
    }]  # fmt: skip
    fp8 = loss_rows[loss_rows["recipe"] != "bf16"]
    granularities = [g.value for g in Granularity]
    order = fp8.assign(_key=[(b != OURS, b, granularities.index(g) if g in granularities else len(granularities), r)
                             for b, g, r in zip(fp8["backend"], fp8["granularity"], fp8["recipe"])])  # fmt: skip
    fp8 = order.sort_values("_key", kind="stable").drop(columns="_key")  # ours first, then by granularity as the curves finished in any order
    for (backend, recipe), group in fp8.groupby(["backend", "recipe"], sort=False):
        pairs = [(loss[row.curve], loss[f"bf16-seed{row.seed}"]) for row in group.itertuples() if row.curve in loss and f"bf16-seed{row.seed}" in loss]
        gaps = _seed_gaps(pairs, noise)
        mean, over, band = _gap_cells(gaps)
        table.append({"implementation": backend, "recipe": recipe, "seeds": len(pairs), "status": _statuses(group), "gap vs BF16, last 10%": mean,
                      "over the seeds": over, "noise band": band, "verdict": _verdict(gaps)})  # fmt: skip
    return pd.DataFrame(table, columns=HEADLINE_COLUMNS)


def loss_references(loss_rows: pd.DataFrame) -> dict[str, str]:
    """Each curve of the `loss` rows (BF16 first, by seed) with the curve its gap is to: an FP8 curve's is BF16
    with its seed, a BF16 curve's the first BF16 curve."""
    seeds = loss_rows["options"].map(_seed)
    bf16 = loss_rows[loss_rows["recipe"] == "bf16"].assign(seed=seeds).sort_values("seed")
    first = bf16["curve"].iloc[0] if len(bf16) else ""
    references = {name: first for name in bf16["curve"]}
    references.update({row.curve: f"bf16-seed{seed}" for row, seed in zip(loss_rows.itertuples(), seeds) if row.recipe != "bf16"})
    return references


def _seed_gaps(pairs: list[tuple[pd.Series, pd.Series]], noise: float) -> SeedGaps | None:
    """The final gaps of (curve, reference of its seed) pairs with the run's noise; None without a pair."""
    return SeedGaps(tuple(final_gap(curve, reference) for curve, reference in pairs), noise) if pairs else None


def _gap_cells(gaps: SeedGaps | None) -> tuple[str, str, str]:
    """A table's mean gap, its range over the seeds and its noise band, as text."""
    if gaps is None:
        return "n/a", "", "n/a"
    over = _range(gaps.gaps) if len(gaps.gaps) > 1 else "one seed"
    return _pct(gaps.mean), over, "n/a" if math.isnan(gaps.band) else f"±{100 * gaps.band:.2f}%"


def _statuses(group: pd.DataFrame) -> str:
    return "; ".join(dict.fromkeys(group["status"]))


def _range(gaps, suffix: str = "") -> str:
    return f"{_pct(min(gaps))} .. {_pct(max(gaps))}" + (f" {suffix}" if suffix else "")


def _verdict(gaps: SeedGaps | None) -> str:
    if gaps is None:
        return "not measured"
    noise = "" if gaps.within_noise is None else f"{'within' if gaps.within_noise else 'outside'} the noise; "
    return f"{noise}{'within' if gaps.within_target else 'OUTSIDE'} {GAP_TARGET:.0%}"


def loss_conclusion(table: pd.DataFrame) -> str:
    """One paragraph from the headline table: the BF16 noise, how many FP8 recipes are within 1% and within
    the noise, which are outside either (with their gaps), and what did not run."""
    bf16, fp8 = table.iloc[0], table.iloc[1:]
    measured = fp8[fp8["seeds"] > 0]
    text = [f"BF16 with {bf16['seeds']} seeds: run-to-run noise {bf16['noise band'].removeprefix('σ ')} (standard deviation of the loss over "
            "the last 10% of steps)."]  # fmt: skip
    if len(measured):
        def named(frame: pd.DataFrame) -> str:
            return ", ".join(f"{row['implementation']} {row['recipe']} {row['gap vs BF16, last 10%']}" for _, row in frame.iterrows())

        within = measured[measured["verdict"].str.endswith(f"within {GAP_TARGET:.0%}")]
        outside = measured.drop(within.index)
        text.append(f"{len(within)} of the {len(measured)} FP8 recipes that ran are within {GAP_TARGET:.0%} of BF16 with the same seed"
                    + (f"; outside: {named(outside)}." if len(outside) else "."))  # fmt: skip
        beyond_noise = measured[measured["verdict"].str.startswith("outside the noise")]
        if measured["verdict"].str.contains("the noise").any():
            text.append(f"Outside the noise band (a gap the BF16 seeds' spread would give less than 1 time in 20): {named(beyond_noise)}."
                        if len(beyond_noise) else "Every gap is within the noise band.")  # fmt: skip
        seeds = sorted(set(measured["seeds"]))
        text.append(f"Seeds per recipe: {', '.join(map(str, seeds))}.")
    not_run = fp8[fp8["seeds"] == 0]
    if len(not_run):
        text.append("Not run: " + "; ".join(f"{row['implementation']} {row['recipe']} ({row['status']})" for _, row in not_run.iterrows()) + ".")
    return " ".join(text)


# ---- charts ----------------------------------------------------------------------------------------


def _line_chart(series: dict[str, pd.Series], div_id: str, title: str, y: str, colours: dict[str, str], note: str = "") -> Chart:
    figure = go.Figure()
    for name, values in series.items():
        label = html.escape(name)
        figure.add_trace(go.Scatter(x=values.index, y=values.to_numpy(), mode="lines", name=label, line={"color": colours.get(name)}))
    figure.update_layout(xaxis_title="step", yaxis_title=y, height=450, legend_title_text="curve")
    return Chart(div_id, title, figure, note)


def loss_charts(curves: pd.DataFrame, names: list[str], prefix: str, references: dict[str, str] | None = None) -> list[Chart]:
    """Loss, validation loss and gradient norm of `names` overlaid, and the gap of each to its reference
    (`references`, by default the first curve) against steps, with the largest gap of the other BF16
    seeds to the first curve as the noise band (when the run has them)."""
    colours = colour_map(names)
    charts = []
    loss = {n: s for n, s in values_by_curve(curves).items() if n in names}
    if not loss:
        return charts
    charts.append(_line_chart(loss, chart_id(prefix, "loss"), "Training loss per step", "loss", colours))
    references = references or {name: names[0] for name in names}
    compared = {n: references[n] for n in loss if references.get(n, n) != n and references[n] in loss}
    if compared:
        figure = go.Figure()
        noise = [gap_over_steps(s, loss[names[0]]).abs() for n, s in loss.items() if n.startswith("bf16-") and n != names[0] and names[0] in loss]
        if noise:
            bound = pd.concat(noise, axis=1).max(axis=1)
            figure.add_trace(go.Scatter(x=bound.index, y=bound.to_numpy(), mode="lines", line={"width": 0}, showlegend=False, hoverinfo="skip"))
            figure.add_trace(go.Scatter(x=bound.index, y=-bound.to_numpy(), mode="lines", line={"width": 0}, fill="tonexty",
                                        fillcolor="rgba(128,128,128,0.25)", name="BF16 seeds' largest gap"))  # fmt: skip
        for name, reference in compared.items():
            if name.startswith("bf16-") and noise:
                continue
            gap = gap_over_steps(loss[name], loss[reference])
            figure.add_trace(go.Scatter(x=gap.index, y=gap.to_numpy(), mode="lines", name=html.escape(name), line={"color": colours.get(name)}))
        shown = sorted(set(compared.values()))
        figure.update_layout(xaxis_title="step", yaxis_title=f"relative loss gap to {html.escape(' | '.join(shown) if len(shown) < 3 else 'BF16')}",
                             yaxis_tickformat=".1%", height=450)  # fmt: skip
        note = ("At each step: the mean loss over the last 10% of the steps so far, relative to the reference's over the same steps "
                f"({'each curve to the one of its seed among ' + ', '.join(shown) if len(shown) > 1 else shown[0]}).")  # fmt: skip
        if noise:
            note += f" The grey band is the largest gap of the other BF16 seeds to {names[0]}: run-to-run noise."
        charts.append(Chart(chart_id(prefix, "gap"), "Relative loss gap against steps", figure, note))
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
    the last compared step, the loss gap to FP32 states (the mean over the seeds of each seed's gap to FP32
    AdamW with the same seed, with the band the FP32 seeds' spread gives it: SeedGaps), and the fused update's
    GB/s where timed."""
    state = curves[curves["metric"] == "state_bytes_per_param"].groupby("curve", sort=False)["value"].last()
    errors = curves[curves["metric"] == "update_rel_err"].sort_values("step").groupby("curve", sort=False)["value"].last()
    loss = values_by_curve(curves)
    optimizer_rows = curve_options(rows[rows["case"].str.startswith("optimizer.")])
    optimizer_rows = optimizer_rows.assign(seed=optimizer_rows["options"].map(_seed))
    names = list(dict.fromkeys([*state.index, *optimizer_rows["optimizer"]]))
    trained = optimizer_rows[optimizer_rows["case"] == "optimizer.loss"]
    fp32 = {row.seed: loss[row.curve] for row in trained[trained["optimizer"] == "adamw-fp32"].itertuples() if row.curve in loss}
    noise = bf16_noise([series.to_list() for series in fp32.values()])
    table = []
    for name in names:
        timed = optimizer_rows[(optimizer_rows["case"] == "optimizer.update") & (optimizer_rows["optimizer"] == name)]
        pairs = [(loss[row.curve], fp32[row.seed]) for row in trained[trained["optimizer"] == name].itertuples() if row.curve in loss and row.seed in fp32]
        mean, over, band = _gap_cells(_seed_gaps(pairs, noise))
        table.append({
            "optimizer": name, "status": _statuses(optimizer_rows[optimizer_rows["optimizer"] == name]) or Status.OK.value,
            "state bytes / param": state.get(name, math.nan),
            "state memory vs FP32": _pct_of(state.get(name, math.nan), state.get("adamw-fp32", math.nan)),
            "update rel. error": errors.get(name, math.nan), "seeds": len(pairs),
            "loss gap vs FP32, last 10%": mean, "over the seeds": over, "noise band": band,
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
        if row.get("seeds", 1) > 1:
            sentence += f" (mean of {int(row['seeds'])} seeds, {row['over the seeds']}; noise band {row['noise band']})"
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
    references = {row.curve: f"adamw-fp32-seed{_seed(row.options)}" for row in trained.itertuples()}  # each seed's own FP32 curve
    parts.extend(chart.to_html() for chart in loss_charts(curves, list(trained["curve"]), "optimizer", references))
    return parts


# ---- the page --------------------------------------------------------------------------------------


def sections(run_dir: Path, rows: pd.DataFrame) -> list[str]:
    """The page's HTML sections for the run's numerics rows and its curves file, headline first."""
    curves = read_curves(run_dir)
    parts = []
    if curves.empty:
        parts.append(f'<p class="banner">The run folder holds no {CURVES_CSV} values: no gap, curve or statistic can be computed; '
                     "the rows below are all there is.</p>")  # fmt: skip
    loss_rows = curve_options(rows[rows["case"] == "loss"])
    if not loss_rows.empty:
        table = headline(rows, curves)
        parts.append(f"<h3>Loss gap to BF16 over the last 10% of steps</h3>{rows_table(table, TABLE_TEXT)}")
        parts.append(f'<p class="conclusion">{html.escape(loss_conclusion(table))}</p>')
        schedules = ", ".join(dict.fromkeys(json.loads(o or "{}").get("lr_schedule", "constant") for o in loss_rows["options"]))
        parts.append(f'<p class="note">Each seed sets the initial weights (the batches are the same for every curve); an FP8 curve\'s gap is '
                     "to BF16 with the same seed, positive where worse, and a recipe's gap is the mean over its seeds. The noise band is "
                     "twice the standard deviation that mean would have were FP8 no different from BF16: 2σ·√(2/seeds), σ the BF16 "
                     f"seeds' spread. Learning rate after the warm-up: {html.escape(schedules)}.</p>")  # fmt: skip
        references = loss_references(loss_rows)
        parts.extend(chart.to_html() for chart in loss_charts(curves, list(references), "loss", references))
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
