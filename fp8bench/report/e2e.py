"""The e2e benchmark's page: a LLaMa-3 training step's throughput per implementation and recipe against BF16.

Rows as `fp8bench e2e` writes them: per configuration (case = model, layers, seq, per-GPU batch; world size;
compile mode; activation checkpointing) the BF16 step eagerly and compiled, then each implementation
(`backend`: triton = ours, torchao, te) x recipe, compiled, with the LM head in BF16 or FP8. An FP8 row's
speedup_vs_bf16 is over the BF16 step of its configuration (the compiled one when the run compiles);
repeat_ms holds every measured step, so the whiskers span the fastest to the slowest step.

The page opens with the headline (each implementation's best speedup, ours against the best reference),
then charts of tokens/s/GPU, speedup beside the model-level roofline (`ideal_speedup`: casts free;
`predicted_speedup`: the roofline model's casts added), measured / ideal,
MFU, peak memory and the step time by kernel class, a table of where ours differs from the best reference
per kernel class, FSDP2's all-gather and scaling efficiency for runs on several GPUs, and the rows that did
not run with their reasons. Only `ok` rows are plotted; the page's table lists every row.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import pandas as pd
import plotly.express as px

from fp8bench.config import Granularity, Status
from fp8bench.model.hardware import GpuSpec
from fp8bench.report.html import (
    Chart, chart_id, colour_map, panels_height, plotted_rows, ratio_whiskers, rows_table, run_order,
    stacked_time_figure, throughput_whiskers,
)

OURS = "triton"  # our implementation's backend name; every other FP8 backend is a reference
BF16 = "bf16"
# The columns an FP8 row shares with its BF16 reference (fp8bench.benchmarks.e2e: a case's group).
GROUP_KEYS = ["case", "world_size", "compile", "activation_checkpointing"]
# A headline compares rows that differ only in implementation and recipe.
HEADLINE_KEYS = [*GROUP_KEYS, "lm_head"]
FLOP_FORMULA = (
    "Model FLOPs per token by torchtitan's formula: 6 N + 12 L H head_dim S, with N the parameters "
    "without the embedding, L layers, H attention heads and S the sequence length (attention's products)."
)
# Kernel time per step by class (fp8bench.benchmarks.e2e.KERNEL_CLASSES), as stacked in the breakdown.
CLASS_COLUMNS = {
    "gemm_ms": "GEMM", "cast_ms": "cast/quantize", "attention_ms": "attention", "norm_act_ms": "norm/activation",
    "optimizer_ms": "optimizer", "comm_ms": "communication", "other_ms": "other",
}
# From the profiled step's streams (fp8bench.harness.overlap): what the step spends waiting.
OVERLAP_COLUMNS = {"compute_idle_ms": "compute stream idle", "exposed_comm_ms": "communication nothing overlaps"}
MFU_COLUMNS = {"mfu_bf16_pct": "MFU against the BF16 dense peak, %", "mfu_fp8_pct": "MFU against the FP8 dense peak, %"}
MEMORY_COLUMNS = {"mem_alloc_gb": "peak allocated, GB", "mem_reserved_gb": "peak reserved, GB"}
TABLE_COLUMNS = (
    "case", "world_size", "compile", "activation_checkpointing", "lm_head", "backend", "recipe", "status",
    "tokens_per_s", "speedup_vs_bf16", "ideal_speedup", "predicted_speedup", "measured_vs_predicted", "tflops", "mfu_bf16_pct", "mfu_fp8_pct", "mem_alloc_gb",
    "mem_reserved_gb", "final_loss", "mean_loss", *CLASS_COLUMNS, *OVERLAP_COLUMNS, "allgather_gb", "wall_ms", "repeats", "timer", "options",
)
_TEXT = ("case", "configuration", "implementation", "recipe", "status", "kernel class")
_LABELS = {
    "step": "step", "implementation_label": "implementation", "panel": "configuration", "what": "speedup",
    "tokens_per_s": "tokens/s per GPU", "speedup": "speedup over BF16", "measured_vs_ideal": "measured / ideal speedup",
    "value": "", "measure": "", "kernels": "kernel class", "ms": "ms per step",
}
_HOVER = {"median_ms": ":.4g", "spread_pct": ":.1f", "tokens_per_s": ":.0f"}
MEASURED, IDEAL, PREDICTED = "measured", "ideal (model-level roofline)", "predicted (roofline with casts)"
STEP_WHISKERS = "Bars: the median over the measured steps; whiskers span the fastest to the slowest step."


@dataclass(frozen=True)
class Section:
    """A part of the page that is not a chart (a headline, a table): `body` is HTML whose every string
    from a result file is already escaped."""

    section_id: str
    title: str
    body: str
    note: str = ""

    def to_html(self) -> str:
        note = f'<p class="note">{html.escape(self.note)}</p>' if self.note else ""
        return f'<section id="{self.section_id}"><h3>{html.escape(self.title)}</h3>{note}{self.body}</section>'


def gpus(world_size) -> str:
    return f"{world_size} GPU" + ("" if str(world_size) == "1" else "s")


def configuration(row) -> str:
    """A configuration in words, e.g. `llama3-8b.L4.S8192.B1, 1 GPU, compile block, checkpointing none`."""
    return f"{row['case']}, {gpus(row['world_size'])}, compile {row['compile']}, checkpointing {row['activation_checkpointing']}"


def step_label(backend: str, recipe: str, compile_mode: str, lm_head: str) -> str:
    """What a bar stands for within its configuration: BF16 eager or compiled, or an FP8 recipe (compiled
    per block unless said otherwise; `FP8 LM head` when the head is converted too)."""
    if backend == BF16:
        return "BF16 eager" if compile_mode == "none" else f"BF16 compiled ({compile_mode})"
    compiled = "" if compile_mode == "block" else f", compile {compile_mode}"
    return f"{recipe}{compiled}{', FP8 LM head' if lm_head == 'fp8' else ''}"


def _plotted(rows: pd.DataFrame) -> pd.DataFrame:
    """The `ok` rows with their repeat bounds (report_html.plotted_rows) and labels escaped for plotly;
    `panel` (the configuration without compile mode, which the step label names) groups bars in panels."""
    ok = plotted_rows(rows)
    ok["implementation_label"] = ok["backend"].map(html.escape)
    ok["step"] = [html.escape(step_label(*r)) for r in zip(ok["backend"], ok["recipe"], ok["compile"], ok["lm_head"])]
    ok["panel"] = [
        html.escape(f"{case}, {gpus(ws)}, checkpointing {ac}")
        for case, ws, ac in zip(ok["case"], ok["world_size"], ok["activation_checkpointing"])
    ]
    return ok


def _fp8(ok: pd.DataFrame) -> pd.DataFrame:
    return ok[ok["granularity"] != Granularity.NONE.value]


def _colours(frame: pd.DataFrame) -> dict[str, str]:
    """One colour per implementation on every page and chart, the roofline pages' included."""
    return colour_map(frame["implementation_label"])


def _panel_height(frame: pd.DataFrame) -> int:
    return panels_height(frame["panel"].nunique())


def _best(rows: pd.DataFrame) -> pd.Series:
    """The row of highest speedup (the first in run order among equals)."""
    return rows.loc[rows["speedup_vs_bf16"].idxmax()]


def _fmt(value: float, digits: str = ".3f", suffix: str = "") -> str:
    return "" if pd.isna(value) else f"{value:{digits}}{suffix}"


# ---- headline -------------------------------------------------------------------------------------


def headline(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Section]:
    """Per configuration and LM head: each implementation's best FP8 speedup over its BF16 reference, and
    ours against the best reference implementation."""
    fp8 = _fp8(_plotted(rows))
    fp8 = fp8[fp8["speedup_vs_bf16"].notna()]
    if fp8.empty:
        return []
    parts = []
    for keys, of_group in fp8.groupby(HEADLINE_KEYS, sort=False):
        group = dict(zip(HEADLINE_KEYS, keys))
        best = pd.DataFrame([_best(of_impl) for _, of_impl in of_group.groupby("backend", sort=False)])
        reference_label = step_label(BF16, BF16, group["compile"], BF16)
        table = pd.DataFrame({
            "implementation": best["backend"], "best recipe": best["recipe"],
            f"speedup over {reference_label}": best["speedup_vs_bf16"].map(_fmt),
            "ideal speedup": best["ideal_speedup"].map(_fmt),
            "measured / ideal": (best["speedup_vs_bf16"] / best["ideal_speedup"]).map(_fmt),
            "predicted speedup": best["predicted_speedup"].map(_fmt),
            "measured / predicted": best["measured_vs_predicted"].map(_fmt),
            "tokens/s per GPU": best["tokens_per_s"].map(lambda v: _fmt(v, ",.0f")),
        })  # fmt: skip
        title = f"{configuration(group)}, LM head {group['lm_head']}"
        parts.append(f"<h4>{html.escape(title)}</h4><p class=\"headline\">{html.escape(_verdict(best))}</p>")
        parts.append(rows_table(table, ("implementation", "best recipe")))
    note = f"{FLOP_FORMULA} Speedup: the BF16 step's median time over the FP8 step's, same configuration, same run."
    return [Section("e2e-headline", "Headline: best FP8 speedup per implementation", "".join(parts), note)]


def _verdict(best: pd.DataFrame) -> str:
    """Ours against the best reference, in one sentence."""
    ours = best[best["backend"] == OURS]
    references = best[best["backend"] != OURS]
    if ours.empty:
        return "ours (triton) has no ok row here."
    ours_row = ours.iloc[0]
    text = f"Ours: {ours_row['speedup_vs_bf16']:.3f}x ({ours_row['recipe']})"
    if references.empty:
        return f"{text}; no reference implementation has an ok row here."
    reference = _best(references)
    ratio = ours_row["speedup_vs_bf16"] / reference["speedup_vs_bf16"]
    return (
        f"{text}; best reference: {reference['backend']} {reference['speedup_vs_bf16']:.3f}x ({reference['recipe']}); "
        f"ours / reference = {ratio:.3f}."
    )


# ---- charts ---------------------------------------------------------------------------------------


def tokens_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """Tokens/s per GPU per step, BF16 eager and compiled included, a colour per implementation."""
    ok = _plotted(rows)
    ok = throughput_whiskers(ok[ok["tokens_per_s"].notna()], "tokens_per_s")
    if ok.empty:
        return []
    figure = px.bar(
        ok, x="step", y="tokens_per_s", color="implementation_label", facet_row="panel", barmode="group",
        error_y="whisker_up", error_y_minus="whisker_down", color_discrete_map=_colours(ok),
        category_orders=run_order(ok, "step", "panel", "implementation_label"), hover_data=_HOVER, labels=_LABELS,
    )
    figure.update_layout(height=_panel_height(ok))
    note = f"Batch x sequence / median step time, per GPU. {STEP_WHISKERS}"
    return [Chart("e2e-tokens", "Tokens/s per GPU", figure, note)]


def speedup_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """Measured speedup over BF16 (solid, with whiskers) beside the model-level roofline (hatched)."""
    ok = _plotted(rows)
    fp8 = _fp8(ok)
    fp8 = fp8[fp8["speedup_vs_bf16"].notna()]
    if fp8.empty:
        return []
    measured = ratio_whiskers(fp8, ok[ok["backend"] == BF16], GROUP_KEYS, "speedup_vs_bf16")
    ideal = fp8[fp8["ideal_speedup"].notna()]
    predicted = fp8[fp8["predicted_speedup"].notna()]
    bars = pd.concat(
        [measured.assign(speedup=measured["speedup_vs_bf16"], what=MEASURED),
         ideal.assign(speedup=ideal["ideal_speedup"], what=IDEAL),
         predicted.assign(speedup=predicted["predicted_speedup"], what=PREDICTED)],
        ignore_index=True,
    )  # fmt: skip
    figure = px.bar(
        bars, x="step", y="speedup", color="implementation_label", pattern_shape="what", facet_row="panel",
        barmode="group", error_y="whisker_up", error_y_minus="whisker_down", color_discrete_map=_colours(bars),
        category_orders={**run_order(bars, "step", "panel", "implementation_label"), "what": [MEASURED, IDEAL, PREDICTED]},
        hover_data={"median_ms": ":.4g", "spread_pct": ":.1f"}, labels=_LABELS,
    )
    figure.add_hline(y=1.0, line_dash="dot", annotation_text="BF16", annotation_position="top left")
    figure.update_layout(height=_panel_height(bars))
    note = (
        "Solid: measured, the BF16 step's median time over the FP8 step's (BF16 compiled as the FP8 steps are, "
        "same configuration, same run). Hatched /: the model-level roofline, the profiled BF16 step with every "
        "converted linear's GEMMs at the recipe's FP8 rate and casts free (ideal_speedup). Hatched \\: the roofline "
        "model's prediction, the same with each converted linear's casts as the layer roofline plans them for the "
        "implementation, at the memory bandwidth (predicted_speedup). Whiskers pair the "
        "FP8 row's fastest step with the BF16 step's slowest and the other way round."
    )
    return [Chart("e2e-speedup", "Speedup over BF16: measured, ideal and predicted", figure, note)]


def measured_vs_ideal_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """Measured speedup / ideal speedup per FP8 step, with a line at 1 (the roofline reached)."""
    fp8 = _fp8(_plotted(rows))
    fp8 = fp8.assign(measured_vs_ideal=fp8["speedup_vs_bf16"] / fp8["ideal_speedup"]).dropna(subset=["measured_vs_ideal"])
    if fp8.empty:
        return []
    figure = px.bar(
        fp8, x="step", y="measured_vs_ideal", color="implementation_label", facet_row="panel", barmode="group",
        color_discrete_map=_colours(fp8), category_orders=run_order(fp8, "step", "panel", "implementation_label"),
        hover_data={"speedup_vs_bf16": ":.3f", "ideal_speedup": ":.3f"}, labels=_LABELS,
    )
    figure.add_hline(y=1.0, line_dash="dot", annotation_text="ideal", annotation_position="top left")
    figure.update_layout(height=_panel_height(fp8))
    note = "The measured speedup over the model-level roofline's: 1 is every converted GEMM at the FP8 rate with free casts."
    return [Chart("e2e-measured-vs-ideal", "Measured / ideal speedup", figure, note)]


def _measure_bars(ok: pd.DataFrame, columns: dict[str, str], chart: str, title: str, note: str) -> list[Chart]:
    """Grouped bars of several columns of each step, a row of panels per column, a column per configuration."""
    long = ok.melt(
        id_vars=["step", "implementation_label", "panel"], value_vars=list(columns), var_name="measure", value_name="value",
    ).dropna(subset=["value"])
    if long.empty:
        return []
    long["measure"] = long["measure"].map(columns)
    figure = px.bar(
        long, x="step", y="value", color="implementation_label", facet_row="measure", facet_col="panel",
        barmode="group", color_discrete_map=_colours(long), labels=_LABELS,
        category_orders={**run_order(long, "step", "panel", "implementation_label"), "measure": list(columns.values())},
    )
    figure.update_yaxes(matches=None)
    # Panel titles say what they hold without plotly's `column=` prefix (the first `=`: values are escaped).
    figure.for_each_annotation(lambda annotation: annotation.update(text=annotation.text.split("=", 1)[-1]))
    figure.update_layout(height=panels_height(len(columns)))
    return [Chart(chart, title, figure, note)]


def mfu_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """Model FLOPs utilisation against the BF16 and against the FP8 dense peak."""
    peaks = "the GPU's dense peaks"
    if gpu is not None:
        peaks = f"{gpu.name}'s dense peaks: BF16 {gpu.bf16_tflops:.0f}, FP8 {gpu.fp8_tflops:.0f} TFLOPS"
    note = f"Model TFLOPS per GPU as % of {peaks}. {FLOP_FORMULA}"
    return _measure_bars(_plotted(rows), MFU_COLUMNS, "e2e-mfu", "MFU", note)


def memory_chart(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """Peak memory allocated by torch and reserved by its caching allocator over the measured steps."""
    note = "Peak over the measured steps, per GPU, GB (1e9 bytes)."
    return _measure_bars(_plotted(rows), MEMORY_COLUMNS, "e2e-memory", "Peak memory per GPU", note)


def breakdown_charts(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Chart]:
    """Per configuration, each step's kernel time stacked by class, with the step's median time and the
    spread of its steps beside each stack."""
    ok = _plotted(rows)
    steps = ok[ok[list(CLASS_COLUMNS)].notna().any(axis=1)]
    steps = steps.assign(step=steps["implementation_label"] + "<br>" + steps["step"])
    charts = []
    for panel, of_panel in steps.groupby("panel", sort=False):
        figure = stacked_time_figure(of_panel, CLASS_COLUMNS, "median step time", _LABELS)
        note = (
            "Bars: GPU time of one profiled step's kernels by class of kernel name (every kernel is in the run's "
            "e2e_kernels.csv); casts fused into RMSNorm or SwiGLU count as norm/activation. Kernels on concurrent "
            "streams (FSDP2's collectives) overlap compute, so a stack may be taller than the step. Black dashes: "
            "the median step time, whiskers from the fastest to the slowest step."
        )
        title = f"Step time by kernel class: {html.unescape(panel)}"  # Chart escapes its title
        charts.append(Chart(chart_id("e2e-breakdown", html.unescape(panel)), title, figure, note))
    return charts


# ---- tables ---------------------------------------------------------------------------------------


def difference_tables(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Section]:
    """Per configuration, our fastest step against the best reference's, ms per kernel class."""
    fp8 = _fp8(_plotted(rows))
    fp8 = fp8[fp8["speedup_vs_bf16"].notna()]
    parts = []
    for keys, of_group in fp8.groupby(HEADLINE_KEYS, sort=False):
        ours, references = of_group[of_group["backend"] == OURS], of_group[of_group["backend"] != OURS]
        if ours.empty or references.empty:
            continue
        ours, reference = _best(ours), _best(references)
        names = {"median_ms": "step (median)", **CLASS_COLUMNS}
        table = pd.DataFrame({
            "kernel class": list(names.values()),
            f"ours: {ours['recipe']}, ms": [_fmt(ours[c], ".2f") for c in names],
            f"{reference['backend']}: {reference['recipe']}, ms": [_fmt(reference[c], ".2f") for c in names],
            "ours - reference, ms": [_fmt(ours[c] - reference[c], "+.2f") for c in names],
        })  # fmt: skip
        title = f"{configuration(dict(zip(HEADLINE_KEYS, keys)))}, LM head {keys[-1]}"
        parts.append(f"<h4>{html.escape(title)}</h4>{rows_table(table, ('kernel class',))}")
    if not parts:
        return []
    note = (
        "Our fastest FP8 step against the fastest reference implementation's, kernel time per step by class "
        "(one profiled step each); negative: ours spends less. The classes overlap where streams run concurrently."
    )
    return [Section("e2e-difference", "Where ours differs from the best reference", "".join(parts), note)]


def _identity(rows: pd.DataFrame) -> dict[str, object]:
    return {"configuration": [configuration(r) for _, r in rows.iterrows()], "implementation": rows["backend"],
            "recipe": rows["recipe"]}


def scaling_table(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Section]:
    """Rows on several GPUs: bytes all-gathered per step, and per-GPU throughput against the same step on the
    run's fewest GPUs (one, or the K of --baseline-gpus) at the same per-GPU batch where the run holds it; then,
    for those, where the step grows, per kernel class."""
    ok = _plotted(rows)
    world_size = pd.to_numeric(ok["world_size"], errors="coerce")  # empty in a row written without it
    several = ok[world_size > 1]
    if several.empty:
        return []
    fewest = world_size.min() if world_size.min() < world_size.max() else 1  # a run on N GPUs alone: against one
    keys = ["case", "compile", "activation_checkpointing", "lm_head", "backend", "recipe"]
    measures = ["tokens_per_s", "median_ms", *CLASS_COLUMNS, *OVERLAP_COLUMNS]
    baseline = ok[world_size == fewest].drop_duplicates(keys, keep="last")[[*keys, *measures]]
    merged = several.merge(baseline, on=keys, how="left", suffixes=("", "_base"))
    # The baseline's own rows (with --baseline-gpus K, on several GPUs too) have nothing to be measured against.
    merged.loc[pd.to_numeric(merged["world_size"], errors="coerce") == fewest, [f"{m}_base" for m in measures]] = None
    on_fewest = gpus(int(fewest))
    table = pd.DataFrame({
        **_identity(merged), "all-gathered per step per GPU, GB": merged["allgather_gb"].map(lambda v: _fmt(v, ".3f")),
        "tokens/s per GPU": merged["tokens_per_s"].map(lambda v: _fmt(v, ",.0f")),
        f"on {on_fewest}": merged["tokens_per_s_base"].map(lambda v: _fmt(v, ",.0f")),
        "scaling efficiency": (100 * merged["tokens_per_s"] / merged["tokens_per_s_base"]).map(lambda v: _fmt(v, ".1f", "%")),
    })  # fmt: skip
    note = (
        "FSDP2: bytes all-gathered per step on each GPU, from the parameters' sizes and all-gather dtypes (FP8 "
        f"for tensorwise weights of ours and torchao). Scaling efficiency: tokens/s per GPU on N GPUs over the "
        f"same step's on {on_fewest} (the run's fewest) at the same per-GPU batch, where the run holds both."
    )
    sections = [Section("e2e-scaling", "Several GPUs: all-gather and scaling", rows_table(table, _TEXT), note)]
    compared = merged[merged["median_ms_base"].notna()]
    if compared.empty:
        return sections
    growth = pd.DataFrame({
        **_identity(compared), f"step on {on_fewest}, ms": compared["median_ms_base"].map(lambda v: _fmt(v, ".1f")),
        "step, ms": compared["median_ms"].map(lambda v: _fmt(v, ".1f")),
        "step grows, ms": (compared["median_ms"] - compared["median_ms_base"]).map(lambda v: _fmt(v, "+.1f")),
        **{f"{label}, ms": (compared[column] - compared[f"{column}_base"]).map(lambda v: _fmt(v, "+.1f"))
           for column, label in (CLASS_COLUMNS | OVERLAP_COLUMNS).items()},
    })  # fmt: skip
    growth_note = (
        f"The median step on N GPUs against the same step on {on_fewest}, and each kernel class's time per step "
        f"(one profiled step each) on N GPUs less on {on_fewest}: where the step grows (a class's kernels slowed beside the "
        "collectives, FSDP2's copies, the collectives themselves) and where it shrinks (the optimizer steps each "
        "rank's shard). Communication runs beside the compute, so the classes' growth need not add up to the "
        "step's. The compute stream's idle time (the step's span less the time it has a kernel running) and, of "
        "it, the time NCCL's kernels run while it has none (communication nothing overlaps) come from the same "
        "profiled step; empty for a run written before they were recorded."
    )
    sections.append(Section("e2e-scaling-growth", "Several GPUs: where the step grows", rows_table(growth, _TEXT), growth_note))
    return sections


def not_run_table(rows: pd.DataFrame, gpu: GpuSpec | None) -> list[Section]:
    """The rows that did not run, with their reasons."""
    missing = rows[rows["status"] != Status.OK.value]
    if missing.empty:
        return []
    table = pd.DataFrame({**_identity(missing), "LM head": missing["lm_head"], "status": missing["status"]})
    return [Section("e2e-not-run", "Steps that did not run", rows_table(table, _TEXT))]


VIEW = (
    headline, tokens_chart, speedup_chart, measured_vs_ideal_chart, mfu_chart, memory_chart, breakdown_charts,
    difference_tables, scaling_table, not_run_table,
)
