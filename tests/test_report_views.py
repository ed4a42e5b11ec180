"""The cast and roofline pages: which charts they carry and (in headless Chromium) that every chart draws
every point it should, without a script error.

The runs are synthetic fixtures (timer "fake"): cast rows built by fp8bench.benchmarks.cast's own row builders,
roofline predictions by the model itself (fp8bench.benchmarks.roofline.run_roofline) and measured rows by
fp8bench.benchmarks.layer's builders, from made-up, randomly perturbed timings, written with RunWriter into a
temporary folder. No number here is a GPU measurement.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from functools import partial

import numpy as np
import pandas as pd
import pytest

from browser import render
from fp8bench.benchmarks import cast
from fp8bench.benchmarks import layer
from fp8bench.benchmarks import roofline as predicted
from fp8bench.model import roofline as rl
from fp8bench.model.calibration import CalibrationProfile
from fp8bench.config import GemmShape, Granularity, Status
from fp8bench.model.hardware import GPUS
from fp8bench.nn.recipes import RECIPES
from fp8bench.report.write import page_name, write_reports
from fp8bench.report.cast import TARGET_PCT_OF_COPY, gbps_chart, pct_of_copy_chart
from fp8bench.report.html import chart_id, plotted_rows, ratio_whiskers
from fp8bench.report.roofline import SQNR_COLUMNS, SYMBOLS, measured_vs_predicted_chart, speedup_chart
from fp8bench.harness import runner
from fp8bench.harness.results import COPY_RECIPE, RunWriter, load_results, status_text
from fp8bench.harness.timing import Measurement

GPU = GPUS["h100-sxm"]
FP8 = Granularity.fp8()
# A case name that would run script if a chart let it through unescaped.
HOSTILE_NAME = """x<img src=x onerror="document.title='pwned'">"""
METADATA = {
    "command": "synthetic fixture of tests/test_report_views.py <not a run>",
    "gpu_spec": GPU.key,
    "gpu_name": "none: synthetic test fixture",
}


def fake_measurement(ms: float, rng: np.random.Generator) -> Measurement:
    """Five repeats of about `ms`, each perturbed by ~2%."""
    repeats = ms * (1.0 + 0.02 * rng.standard_normal(5))
    return Measurement(tuple(float(t) for t in repeats), 50, ms * 1.3, "fake", tuple(rng.uniform(1700, 1980, 5)))


def ok_rows(rows: pd.DataFrame, granularity: Granularity) -> pd.DataFrame:
    """A page's rows that charts may plot: `ok`, of the page's granularity or BF16."""
    shown = rows[rows["granularity"].isin({granularity.value, Granularity.NONE.value})]
    return shown[shown["status"] == Status.OK.value]


# ---- the cast run: per tensor the copy, then every recipe by every implementation ----

CAST_SHAPES = (cast.CastShape(8192, 8192), cast.CastShape(4096, 14336, HOSTILE_NAME), cast.CastShape(1000, 4096))
# Made-up bandwidth: the copy's in GB/s, and each implementation's share of it for a one-pass recipe.
COPY_GBPS = 2900.0
SHARE_OF_COPY = {"triton": 0.9, "torch": 0.1, "torch-compile": 0.8, "te": 0.93}


def synthetic_cast_status(shape: cast.CastShape, recipe: cast.CastRecipe, implementation: str) -> str | None:
    """Cases that do not run, as fp8bench.benchmarks.cast would write them (and one failure made up)."""
    problem = recipe.problem_with(shape)
    if problem:
        return status_text(Status.UNSUPPORTED, problem)
    if implementation == "te" and recipe.granularity is Granularity.AXISWISE:
        return status_text(Status.UNSUPPORTED, "synthetic: transformer_engine has no per-row (axiswise) scaling")
    if implementation == "triton" and recipe.name == "axiswise+t" and shape.name == HOSTILE_NAME:
        return status_text(Status.FAILED, "synthetic: 3 rowwise scales differ from the reference")
    return None


def write_cast_run(run_dir, rng: np.random.Generator) -> None:
    config = cast.CastConfig(CAST_SHAPES, tuple(cast.CAST_RECIPES.values()))
    benchmark = cast.CastBenchmark(config)
    with RunWriter(run_dir, {**METADATA, "benchmark": "cast"}) as writer:
        for shape in config.shapes:
            copy_case = cast.CastCase(shape, None, "torch", config)
            copy = runner.measured_row(benchmark, copy_case, fake_measurement(copy_case.work.bytes / COPY_GBPS * 1e-6, rng))
            writer.append(copy)
            for recipe in config.recipes:
                for implementation in config.implementations:
                    case = cast.CastCase(shape, recipe, implementation, config)
                    status = synthetic_cast_status(shape, recipe, implementation)
                    if status:
                        writer.append(runner.case_row(benchmark, case, status))
                        continue
                    gbps = copy.values["gbps"] * SHARE_OF_COPY[implementation] / recipe.input_reads()
                    m = fake_measurement(case.work.bytes / gbps * 1e-6, rng)
                    rel_err = float(rng.uniform(0.02, 0.04))
                    writer.append(runner.measured_row(benchmark, case, m, reference=copy.values, columns={"rel_err": rel_err}))


# ---- the roofline run: the model's predictions, then (on a "GPU") the measured steps ----

ROOFLINE_SHAPES = (GemmShape(8192, 4096, 4096), GemmShape(16384, 8192, 8192, HOSTILE_NAME))
SYNTHETIC_PROFILE = CalibrationProfile(
    gpu_key=GPU.key, gpu_name="none: synthetic test fixture", bf16_tflops=700.0,
    fp8_tflops={"tensorwise/on": 1300.0}, copy_tbps=3.0, launch_us=2.5, measured_utc="synthetic",
)
# How much slower than the model's prediction each made-up step runs.
SLOWDOWN = {"bf16-compile": 1.05, "bf16": 1.2, "triton-compile": 1.15, "triton": 1.5, "torchao-compile": 1.25, "te": 1.1}
# Kernel names by the model's terms, named so that fp8bench.benchmarks.layer.kernel_kind sorts them as the model does.
KERNEL_NAMES = {
    "gemm": "nvjet_synthetic_gemm", "cast": "synthetic_quantize", "layernorm": "synthetic_layer_norm",
    "sigmoid": "synthetic_sigmoid",
}


def synthetic_status(case: layer.LayerCase) -> str | None:
    if case.backend == "te" and case.recipe_name == "blockwise":
        return status_text(Status.UNSUPPORTED, "synthetic: transformer_engine: no block scaling here")
    if case.backend == "triton" and case.recipe_name == "rowwise_with_gw_hp" and case.shape.name == HOSTILE_NAME:
        return status_text(Status.FAILED, "synthetic: <failure>")
    return None


def synthetic_step(case: layer.LayerCase, ceilings: rl.Ceilings, rng) -> tuple[Measurement, dict[str, float]]:
    """Kernel times: the model's, each slowed down by the backend's SLOWDOWN."""
    if case.recipe is None:
        times = [rl.time_kernel(kernel, ceilings) for kernel in rl.layer_kernels(case.shape, None)]
    else:
        times = rl.predict(case.shape, case.recipe, rl.IMPLEMENTATIONS[case.implementation], ceilings).fp8
    kernels: dict[str, float] = defaultdict(float)
    for t in times:
        kernels[KERNEL_NAMES[t.kernel.term.split(":")[0]]] += t.seconds * 1e3 * SLOWDOWN[case.backend]
    return fake_measurement(sum(kernels.values()), rng), dict(kernels)


def synthetic_sqnr(case: layer.LayerCase, rng) -> dict[str, float]:
    """As fp8bench.benchmarks.layer writes it: none for the BF16 eager layer (the reference itself), an infinite
    (identical) grad_weight for compiled BF16, FP8 noise for FP8 steps."""
    if case.backend == "bf16":
        return {}
    if case.recipe is None:
        return dict(zip(SQNR_COLUMNS, (48.0, 46.0, math.inf)))
    return {name: float(rng.uniform(26.0, 30.0)) for name in SQNR_COLUMNS}


def write_roofline_run(run_dir, rng: np.random.Generator, measured: bool, metadata=METADATA) -> None:
    ceilings = (rl.spec_ceilings(GPU), rl.calibrated_ceilings(SYNTHETIC_PROFILE))
    recipes = tuple(RECIPES.values())
    config = predicted.RooflineConfig(ROOFLINE_SHAPES, recipes, tuple(rl.IMPLEMENTATIONS.values()), ceilings)
    with RunWriter(run_dir, {**metadata, "benchmark": "roofline", "prediction_only": not measured}) as writer:
        predicted.run_roofline(config, writer)
        if not measured:
            return
        measured_with = ceilings[-1]  # the calibrated ceilings, as `fp8bench roofline` picks them
        layer_config = layer.LayerConfig(ROOFLINE_SHAPES, recipes)
        benchmark = layer.LayerBenchmark(layer_config, measured_with, timer=None, run_dir=run_dir)
        for shape in ROOFLINE_SHAPES:
            reference_ms = None
            for case in layer_config.cases(shape):
                step = layer.StepCase(case, benchmark)
                status = synthetic_status(case)
                if status:
                    writer.append(runner.case_row(benchmark, step, status))
                    continue
                m, kernels = synthetic_step(case, measured_with, rng)
                columns = layer.step_columns(case, kernels, synthetic_sqnr(case, rng), measured_with)
                writer.append(runner.measured_row(benchmark, step, m, reference_ms=reference_ms, columns=columns))
                if step.is_reference:
                    reference_ms = m.median_ms


def reported_run(tmp_path_factory, name: str, write) -> tuple:
    """A temporary run folder filled by `write(run_dir)`, with its pages written; and its rows."""
    run_dir = tmp_path_factory.mktemp(name)
    write(run_dir)
    write_reports(run_dir)
    return run_dir, load_results(run_dir)


@pytest.fixture(scope="module")
def cast_run(tmp_path_factory):
    return reported_run(tmp_path_factory, "cast-run", partial(write_cast_run, rng=np.random.default_rng(11)))


@pytest.fixture(scope="module")
def roofline_run(tmp_path_factory):
    write = partial(write_roofline_run, rng=np.random.default_rng(12), measured=True)
    return reported_run(tmp_path_factory, "roofline-run", write)


@pytest.fixture(scope="module")
def predicted_run(tmp_path_factory):
    write = partial(write_roofline_run, rng=np.random.default_rng(13), measured=False)
    return reported_run(tmp_path_factory, "roofline-predicted", write)


def chart_ids(page_path) -> list[str]:
    text = page_path.read_text()
    return [part.split('"', 1)[0] for part in text.split('<div id="')[1:]]


def kernel_time_id(case: str) -> str:
    return chart_id("roofline-kernel-time", case)


# ---- written pages and figures (no browser) ----


def test_the_fixtures_are_what_the_benchmarks_write(cast_run, roofline_run, predicted_run):
    _, cast_rows = cast_run
    assert set(cast_rows["timer"]) == {"fake", ""}  # "": the rows that did not run
    copies = cast_rows[cast_rows["recipe"] == COPY_RECIPE]
    assert len(copies) == len(CAST_SHAPES) and set(copies["granularity"]) == {"none"} and copies["pct_peak"].isna().all()
    casts = cast_rows[(cast_rows["recipe"] != COPY_RECIPE) & (cast_rows["status"] == "ok")]
    assert casts["pct_peak"].between(2, 100).all() and (cast_rows["N"] == 0).all()  # a cast has no product
    _, rows = roofline_run
    measured = rows[rows["backend"] != "model"]
    assert set(measured["backend"]) == set(SLOWDOWN) and set(measured["timer"]) == {"fake", ""}
    assert (measured[measured["status"] == "ok"]["predicted_ms"] > 0).all()
    assert measured["measured_vs_predicted"].between(0.5, 1.0).sum() > 20  # slowed down by 5-50%
    _, predicted = predicted_run
    assert set(predicted["backend"]) == {"model"} and predicted["median_ms"].isna().all()


def test_cast_pages_carry_both_charts(cast_run):
    run_dir, _ = cast_run
    for granularity in FP8:
        page = run_dir / page_name(granularity)
        assert chart_ids(page) == ["cast-gbps", "cast-pct-of-copy"], page.name
        assert "no charts for these rows" not in page.read_text()


def test_roofline_pages_carry_every_chart_a_shape_each_for_kernel_time(roofline_run):
    run_dir, _ = roofline_run
    kernel_time = [kernel_time_id(shape.name) for shape in ROOFLINE_SHAPES]
    for granularity in FP8:
        ids = chart_ids(run_dir / page_name(granularity))
        assert ids == ["roofline-speedup", "roofline-measured-vs-predicted", *kernel_time, "roofline-sqnr"]


def test_a_prediction_only_run_charts_its_predicted_speedups_and_nothing_measured(predicted_run):
    run_dir, rows = predicted_run
    for granularity in FP8:
        predicted_time = [chart_id("roofline-predicted-time", shape.name) for shape in ROOFLINE_SHAPES]
        assert chart_ids(run_dir / page_name(granularity)) == ["roofline-speedup", *predicted_time]
        ok = ok_rows(rows, granularity)
        (chart,) = speedup_chart(ok, GPU)
        predicted = ok[(ok["granularity"] == granularity.value) & ok["predicted_speedup"].notna()]
        plotted = sorted(y for trace in chart.figure.data for y in trace.y)
        assert plotted == pytest.approx(sorted(predicted["predicted_speedup"])) and len(plotted) > 0
        assert {trace.marker.symbol for trace in chart.figure.data} <= {"circle-open", "square-open"}


def test_a_prediction_only_run_without_a_gpu_says_what_it_predicts_for_without_a_warning(tmp_path):
    """Predicted on a machine with no GPU (no gpu_name), for the GPU model the run names."""
    metadata = {k: v for k, v in METADATA.items() if k != "gpu_name"}
    write_roofline_run(tmp_path, np.random.default_rng(13), measured=False, metadata=metadata)
    write_reports(tmp_path)
    text = (tmp_path / "index.html").read_text()
    assert f'<p class="note">Predictions of the roofline model for {GPU.key}; nothing was measured in this run.</p>' in text
    assert 'class="banner"' not in text


def test_measured_and_predicted_markers_of_an_implementation_share_a_slot(roofline_run):
    _, rows = roofline_run
    (chart,) = speedup_chart(ok_rows(rows, Granularity.TENSORWISE), GPU)
    groups = defaultdict(set)
    for trace in chart.figure.data:
        implementation, what = trace.name.split(", ", 1)
        assert trace.offsetgroup == implementation and trace.marker.symbol == SYMBOLS[what]
        groups[implementation].add(what)
    assert groups["triton"] == set(SYMBOLS)  # eager and compiled, predicted under both ceilings
    assert groups["unfused"] == {"predicted (spec ceilings)", "predicted (calibrated ceilings)"}  # never measured
    assert chart.figure.layout.scattermode == "group"


def test_an_implementation_has_one_colour_on_every_chart_and_page(cast_run, roofline_run, predicted_run):
    def colours_of(charts) -> dict[str, set[str]]:
        found = defaultdict(set)
        for chart in charts:
            for trace in chart.figure.data:
                found[trace.name.split(", ")[0]].add(trace.marker.color)  # implementation[, what]
        return found

    views = ((cast_run, (gbps_chart, pct_of_copy_chart)), (roofline_run, (speedup_chart, measured_vs_predicted_chart)))
    for run, builders in views:
        _, rows = run
        charts = [chart for g in FP8 for build in builders for chart in build(ok_rows(rows, g), GPU)]
        if run is roofline_run:
            charts += [chart for g in FP8 for chart in speedup_chart(ok_rows(predicted_run[1], g), GPU)]
        colours = colours_of(charts)
        assert all(len(c) == 1 for c in colours.values()), colours
        assert len({c for (c,) in colours.values()}) == len(colours) >= 4


def test_ratio_whiskers_pair_fastest_with_slowest():
    frame = pd.DataFrame({"case": ["a"], "value": [2.0], "median_ms": [1.0], "fastest_ms": [0.9], "slowest_ms": [1.2]})
    reference = pd.DataFrame(
        {"case": ["a", "a"], "median_ms": [9.0, 2.0], "fastest_ms": [9.0, 1.8], "slowest_ms": [9.0, 2.5]}
    )
    (row,) = ratio_whiskers(frame, reference, ["case"], "value").to_dict("records")  # the last reference row counts
    assert row["whisker_up"] == pytest.approx(2.5 / 0.9 - 2.0)
    assert row["whisker_down"] == pytest.approx(2.0 - 1.8 / 1.2)


def test_share_of_copy_whiskers_come_from_both_repeats(cast_run):
    _, rows = cast_run
    ok = ok_rows(rows, Granularity.BLOCKWISE)
    (chart,) = pct_of_copy_chart(ok, GPU)
    lines = [shape.y0 for shape in chart.figure.layout.shapes]  # in every panel, one per tensor
    assert sorted(lines) == [TARGET_PCT_OF_COPY] * len(CAST_SHAPES) + [100.0] * len(CAST_SHAPES)
    plotted = plotted_rows(ok)
    cast_row = plotted[(plotted["recipe"] == "blockwise-1x128") & (plotted["backend"] == "te")].iloc[0]
    copy_row = plotted[(plotted["recipe"] == COPY_RECIPE) & (plotted["case"] == cast_row["case"])].iloc[0]
    bytes_ratio = json.loads(cast_row["options"])["bytes"] / json.loads(copy_row["options"])["bytes"]
    highest = 100.0 * bytes_ratio * copy_row["slowest_ms"] / cast_row["fastest_ms"]
    for trace in chart.figure.data:
        for x, y, up in zip(trace.x, trace.y, trace.error_y.array):
            if x == "blockwise-1x128" and trace.name == "te" and y == pytest.approx(cast_row["pct_peak"], rel=1e-5):
                assert y + up == pytest.approx(highest, rel=1e-4)
                return
    pytest.fail("the te blockwise-1x128 bar is not in the chart")


# ---- in headless Chromium ----


@pytest.fixture(scope="module")
def rendered(cast_run, roofline_run, predicted_run):
    return {
        (name, granularity): render(run_dir / page_name(granularity))
        for name, (run_dir, _) in (("cast", cast_run), ("roofline", roofline_run), ("predicted", predicted_run))
        for granularity in FP8
    }


def drawn_pages(name: str, run, rendered):
    """(granularity, the page as Chromium drew it, the rows its charts may plot) for each FP8 page of a run."""
    _, rows = run
    for granularity in FP8:
        yield granularity, rendered[(name, granularity)], ok_rows(rows, granularity)


@pytest.mark.browser
def test_every_page_loads_without_script_errors(rendered):
    for key, page in rendered.items():
        assert page.js_errors == (), f"{key}: {page.js_errors}"
        assert "pwned" not in page.title


@pytest.mark.browser
def test_cast_charts_plot_every_ok_row(cast_run, rendered):
    for _, page, ok in drawn_pages("cast", cast_run, rendered):
        gbps = page.graph("cast-gbps")
        assert gbps.points == len(ok)  # the copies too
        assert {t.kind for t in gbps.traces} == {"bars"}
        assert len(gbps.traces) == len(ok.groupby(["backend", "case"]))  # a panel per tensor
        share = page.graph("cast-pct-of-copy")
        assert share.points == (ok["recipe"] != COPY_RECIPE).sum() == ok["pct_peak"].notna().sum()


@pytest.mark.browser
def test_roofline_charts_plot_every_point_they_should(roofline_run, rendered):
    for granularity, page, ok in drawn_pages("roofline", roofline_run, rendered):
        fp8 = ok[ok["granularity"] == granularity.value]
        model = fp8["backend"] == "model"
        speedup = page.graph("roofline-speedup")
        predicted = (model & fp8["predicted_speedup"].notna()).sum()
        assert speedup.points == predicted + (~model & fp8["speedup_vs_bf16"].notna()).sum()
        measured_fp8 = fp8[~model]
        assert page.graph("roofline-measured-vs-predicted").points == len(measured_fp8) > 0
        measured = ok[ok["backend"] != "model"]
        for case, steps in measured.groupby("case"):
            parts = (steps[["gemm_ms", "cast_ms", "other_ms"]] > 0).to_numpy().sum()
            assert parts < 3 * len(steps)  # BF16 steps have no cast kernels: no empty bar for them
            assert page.graph(kernel_time_id(case)).points == parts + len(steps)  # and a median marker per step
        sqnr = page.graph("roofline-sqnr")
        assert sqnr.points == measured[list(SQNR_COLUMNS)].notna().to_numpy().sum()


@pytest.mark.browser
def test_a_prediction_only_run_draws_its_predicted_speedups(predicted_run, rendered):
    for granularity, page, ok in drawn_pages("predicted", predicted_run, rendered):
        fp8 = ok[ok["granularity"] == granularity.value]
        predicted_time = [chart_id("roofline-predicted-time", shape.name) for shape in ROOFLINE_SHAPES]
        assert [g.div_id for g in page.graphs] == ["roofline-speedup", *predicted_time]
        assert page.graphs[0].points == fp8["predicted_speedup"].notna().sum() > 0
        for case, steps in ok.groupby("case"):  # a bar per kind of kernel a predicted step has
            parts = (steps[["gemm_ms", "cast_ms", "other_ms"]] > 0).to_numpy().sum()
            assert page.graph(chart_id("roofline-predicted-time", case)).points == parts > 0


def test_the_roofline_hover_labels_escape_the_bound_column(predicted_run):
    """plotly renders hover labels as HTML: a `bound` cell from a results file must reach it escaped."""
    _, rows = predicted_run
    hostile = rows.assign(bound="<b onmouseover=alert(1)>compute</b>")
    (chart,) = speedup_chart(ok_rows(hostile, Granularity.TENSORWISE), GPU)
    labels = {str(value) for trace in chart.figure.data for point in trace.customdata for value in point}
    assert "&lt;b onmouseover=alert(1)&gt;compute&lt;/b&gt;" in labels
    assert not any("<b" in label for label in labels)
