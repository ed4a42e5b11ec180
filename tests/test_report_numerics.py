"""The numerics page from runs of the real CLI on a micro model on the CPU (kernels under
TRITON_INTERPRET=1): every chart is on the page, the headline and conclusions are the numbers pandas
computes from the curves file (curves.csv.gz; a plain curves.csv of an older run reads the same), strings from
the files are escaped, and a malformed curves file is an error."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
import statistics

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from fp8bench.benchmarks import numerics
from fp8bench.cli import app
from fp8bench.harness import curves
from fp8bench.report import numerics as report_numerics
from fp8bench.report.write import INDEX_HTML, write_reports

SMALL = ["--model", "micro", "--batch-size", "1", "--seq-len", "16", "--corpus-bytes", "1000000"]


def micro() -> torch.nn.Module:
    return numerics.TinyLM(numerics.TinyLMConfig(dim=32, layers=1, heads=2, ffn=64))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One folder per numerics command, run through the CLI with tiny settings, reports written."""
    root = tmp_path_factory.mktemp("numerics")
    commands = {
        "loss": ["loss", "--recipe", "tensorwise", "--recipe", "rowwise", "--steps", "10", "--eval-every", "5", "--bf16-seeds", "2"],
        "stats": ["stats", "--recipe", "tensorwise-delayed", "--steps", "2"],
        "startup": ["startup", "--steps", "4"],
        "optimizer": ["optimizer", "--loss-steps", "3", "--error-steps", "2", "--seeds", "2"],
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(numerics.MODELS, "micro", micro)
        for name, argv in commands.items():
            result = CliRunner().invoke(app, ["numerics", *argv, *SMALL, "--out", str(root / name)])
            assert result.exit_code == 0, result.output
    for name in commands:
        result = CliRunner().invoke(app, ["report", str(root / name)])
        assert result.exit_code == 0, result.output
    return root


def chart_ids(page: str) -> list[str]:
    return re.findall(r'<div id="([a-z0-9-]+)" class="plotly-graph-div"', page)


def headline_rows(page: str) -> list[list[str]]:
    """The cells of the first table on the page (the headline)."""
    table = page.split("<table", 1)[1].split("</table>", 1)[0]
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr class=[^>]*>(.*?)</tr>", table)]


def pandas_gap(curves: pd.DataFrame, curve: str, reference: str = "bf16-seed0") -> float:
    """Mean loss over the last 10% of steps relative to the reference's, straight from the curves file."""
    loss = curves[curves.metric == "loss"]

    def tail(name: str) -> float:
        values = loss[loss.curve == name].sort_values("step")["value"]
        return values.tail(max(1, math.ceil(0.1 * len(values)))).mean()

    return (tail(curve) - tail(reference)) / tail(reference)


def test_the_report_reads_the_files_the_benchmark_writes():
    assert report_numerics.CURVES_CSV == numerics.CURVES_CSV == "curves.csv.gz"
    assert report_numerics.DATA_FILES == ("curves.csv.gz", "curves.csv", "tensor_stats.csv.gz")  # what a site copies beside results.csv
    assert report_numerics.CURVE_COLUMNS == curves.CURVE_COLUMNS
    assert report_numerics.LAST_FRACTION == curves.LAST_FRACTION
    assert report_numerics.BENCHMARK == numerics.BENCHMARK


def test_trailing_means_and_where_two_curves_settle_known_answers():
    steps = pd.Index(range(1, 21))
    means = report_numerics.trailing_means(pd.Series([float(s) for s in steps], index=steps))
    assert means[1] == 1.0 and means[11] == 10.5 and means[20] == 19.5  # windows of 1, 2 and 2 steps
    reference = pd.Series([5.0, 4.0, 3.0, 2.0, 1.0], index=range(1, 6))
    settles = report_numerics.settles_at
    assert settles(pd.Series([6.0, 4.2, 3.0, 2.0, 1.0], index=range(1, 6)), reference) == 3
    assert settles(pd.Series([5.0, 4.0, 3.0, 2.0, 1.1], index=range(1, 6)), reference) is None
    assert settles(pd.Series([5.0, math.nan, 3.0, 2.0, 1.0], index=range(1, 6)), reference) == 3  # NaN: not settled
    assert settles(reference, reference) == 1


def test_loss_page_opens_with_the_headline_computed_from_curves(runs):
    run = runs / "loss"
    page = (run / "numerics.html").read_text()
    assert f'href="numerics.html"' in (run / INDEX_HTML).read_text()
    assert not (run / "tensorwise.html").exists()  # numerics rows have their own page, not granularity pages
    assert chart_ids(page) == ["loss-loss", "loss-gap", "loss-val-loss", "loss-grad-norm"]
    assert page.index("Loss gap to BF16 over the last 10% of steps") < page.index('id="loss-loss"')
    curves = pd.read_csv(run / numerics.CURVES_CSV)
    seed1 = pandas_gap(curves, "bf16-seed1")
    sigma = abs(seed1) / math.sqrt(2) / (1 + seed1 / 2)  # two seeds: their sample standard deviation, relative to their mean
    rows = {(cells[0], cells[1]): cells for cells in headline_rows(page)}
    assert list(rows) == [("bf16", "bf16"), ("triton", "tensorwise"), ("triton", "rowwise")]
    assert rows[("bf16", "bf16")][2:] == ["2", "ok", "", f"{100 * seed1:+.2f}% .. {100 * seed1:+.2f}% to bf16-seed0",
                                          f"σ {100 * sigma:.2f}%", "the run-to-run noise: the standard deviation of the BF16 seeds&#x27; loss"]  # fmt: skip
    band = 2 * sigma * math.sqrt(2)  # one seed per recipe
    for recipe in ("tensorwise", "rowwise"):
        cells = rows[("triton", recipe)]
        gap = pandas_gap(curves, f"triton-{recipe}-seed0")
        assert cells[2:7] == ["1", "ok", f"{100 * gap:+.2f}%", "one seed", f"±{100 * band:.2f}%"]
        assert cells[7] == f"{'within' if abs(gap) <= band else 'outside'} the noise; {'within' if abs(gap) <= 0.01 else 'OUTSIDE'} 1%"
    # The results rows' rel_err is the same gap.
    results = pd.read_csv(run / "results.csv")
    for options, rel_err in zip(results["options"], results["rel_err"]):
        assert rel_err == pytest.approx(pandas_gap(curves, json.loads(options)["curve"]), abs=1e-6)  # the curves file holds 8 digits


def test_gap_over_steps_ends_at_the_headline_gap_and_matches_the_checkpoints(runs):
    curves = report_numerics.read_curves(runs / "loss")
    loss = report_numerics.values_by_curve(curves)
    gaps = report_numerics.gap_over_steps(loss["triton-tensorwise-seed0"], loss["bf16-seed0"])
    checkpoints = curves[(curves.metric == "loss_gap") & (curves.curve == "triton-tensorwise-seed0")].set_index("step")["value"]
    assert len(checkpoints) == 4
    for step, value in checkpoints.items():
        assert gaps[step] == pytest.approx(value, abs=1e-6)  # the curves file holds 8 digits
    assert gaps.iloc[-1] == pytest.approx(pandas_gap(pd.read_csv(runs / "loss" / numerics.CURVES_CSV), "triton-tensorwise-seed0"), rel=1e-9)


def test_stats_page_charts_every_statistic(runs):
    page = (runs / "stats" / "numerics.html").read_text()
    assert chart_ids(page) == [
        "loss-loss", "loss-gap", "loss-val-loss", "loss-grad-norm",
        "stats-underflow-pct", "stats-saturate-pct", "stats-amax", "stats-scale", "stats-sqnr-steps", "stats-sqnr-per-gemm",
    ]  # fmt: skip
    assert "blocks.0.qkv" in page and "grad_output" in page
    bf16, (implementation, recipe, seeds, _, gap, _, noise, verdict) = headline_rows(page)
    assert bf16[6] == "n/a (one seed)" and (implementation, recipe, seeds, noise) == ("triton", "tensorwise-delayed", "1", "n/a")
    assert verdict in ("within 1%", "OUTSIDE 1%")


def test_startup_page_overlays_both_arms_and_concludes_from_the_data(runs):
    run = runs / "startup"
    page = (run / "numerics.html").read_text()
    assert chart_ids(page) == [
        "startup-scale-1-loss", "startup-scale-1-underflow", "startup-master-from-fp8-loss", "startup-master-from-fp8-underflow",
    ]  # fmt: skip
    curves = pd.concat([pd.read_csv(run / numerics.CURVES_CSV), pd.read_csv(run / numerics.TENSOR_STATS_CSV)], ignore_index=True)
    loss = curves[curves.metric == "loss"].pivot(index="step", columns="curve", values="value")
    for a, b in (("calibrated-seed0", "scale-1-seed0"), ("master-from-hp-seed0", "master-from-fp8-seed0")):
        first = loss[b].iloc[0] / loss[a].iloc[0] - 1
        assert f"{b} starts at loss {loss[b].iloc[0]:.4f} against {a}&#x27;s {loss[a].iloc[0]:.4f} at step 1 ({100 * first:+.2f}%)" in page
        outside = (loss[b] / loss[a] - 1).abs() > 0.01
        if outside.iloc[-1]:
            assert "still more than 1% apart at the last step, 4" in page
        else:
            settled = outside[outside].index.max() + 1 if outside.any() else 1
            assert f"From step {settled} on, {b}&#x27;s loss stays within 1% of {a}&#x27;s" in page
        assert f"{b} is {100 * pandas_gap(curves, b, a):+.2f}% from {a}" in page
        underflow = curves[(curves.metric == "underflow_pct") & (curves.step == 1)].groupby(["curve", "role"])["value"].mean()
        role = underflow[b].idxmax()
        sentence = f"At step 1 the {role} casts lose {underflow[b][role]:.2f}% of their nonzero values to underflow in {b}"
        assert f"{sentence} against {underflow[a][role]:.2f}% in {a}" in page


def test_optimizer_page_tables_memory_error_and_loss(runs):
    run = runs / "optimizer"
    page = (run / "numerics.html").read_text()
    assert chart_ids(page) == ["optimizer-update-error", "optimizer-loss", "optimizer-gap", "optimizer-val-loss", "optimizer-grad-norm"]
    assert "each curve to the one of its seed among adamw-fp32-seed0, adamw-fp32-seed1" in page  # the gap chart's references
    table = report_numerics.optimizer_table(report_numerics.curve_options(pd.read_csv(run / "results.csv", dtype=str, keep_default_na=False)),
                                            report_numerics.read_curves(run))  # fmt: skip
    curves = pd.read_csv(run / numerics.CURVES_CSV)
    state = curves[curves.metric == "state_bytes_per_param"].set_index("curve")["value"]
    assert list(table["optimizer"]) == ["adamw-fp32", "adamw-e4m3-sqrt-e5m2", "adamw-e4m3-fp16"]
    # The noise: the FP32 seeds' spread of the loss over the last 10% of the 3 steps, the last step.
    fp32_last = [curves[(curves.curve == f"adamw-fp32-seed{seed}") & (curves.metric == "loss")].sort_values("step")["value"].iloc[-1] for seed in (0, 1)]
    noise = statistics.stdev(fp32_last) / statistics.mean(fp32_last)
    for row in table.to_dict("records"):
        name = row["optimizer"]
        assert row["state bytes / param"] == pytest.approx(state[name])
        assert row["state memory vs FP32"] == f"{100 * state[name] / state['adamw-fp32']:.1f}%"
        # Each seed's gap is to FP32 AdamW with the same seed; the column is their mean.
        gaps = [pandas_gap(curves, f"{name}-seed{seed}", f"adamw-fp32-seed{seed}") for seed in (0, 1)]
        assert row["seeds"] == 2 and row["loss gap vs FP32, last 10%"] == f"{100 * sum(gaps) / 2:+.2f}%"
        assert row["over the seeds"] == f"{100 * min(gaps):+.2f}% .. {100 * max(gaps):+.2f}%"
        assert row["noise band"] == f"±{100 * 2 * noise:.2f}%"  # twice noise * sqrt(2 / 2 seeds)
    errors = curves[curves.metric == "update_rel_err"].sort_values("step").groupby("curve")["value"].last()
    assert table.set_index("optimizer").loc["adamw-e4m3-fp16", "update rel. error"] == pytest.approx(errors["adamw-e4m3-fp16"])
    assert math.isnan(table["GB/s"].iloc[0])  # timed on a GPU only


def test_every_chart_renders_in_a_browser(runs):
    """In Chromium (skipped without it, failed under CI): no script error, every chart draws its traces
    (lines count no points in the browser helper; bars do)."""
    from browser import render

    for name in ("loss", "stats", "startup", "optimizer"):
        page = runs / name / "numerics.html"
        rendered = render(page)
        assert rendered.js_errors == ()
        assert [graph.div_id for graph in rendered.graphs] == chart_ids(page.read_text())
        assert all(graph.traces for graph in rendered.graphs), name
        assert all(trace.points > 0 for graph in rendered.graphs for trace in graph.traces if trace.kind == "bars"), name


def test_strings_from_the_files_are_escaped(tmp_path, runs):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("results.csv", "metadata.json"):
        (run / name).write_text((runs / "loss" / name).read_text().replace("triton-rowwise-seed0", "<b>x</b>-seed0"))
    text = curves.read_values_text(runs / "loss" / numerics.CURVES_CSV)
    curves.append_member(run / numerics.CURVES_CSV, text.replace("triton-rowwise-seed0", "<b>x</b>-seed0"))
    write_reports(run)
    page = (run / "numerics.html").read_text()
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;-seed0" in page
    assert "\\u003cb\\u003e" not in page  # how plotly writes an unescaped label into its JSON


def _rows_only(tmp_path, runs, name: str = "run"):
    """A folder with the loss run's results.csv and metadata.json, no curves file."""
    run = tmp_path / name
    run.mkdir()
    for name in ("results.csv", "metadata.json"):
        (run / name).write_text((runs / "loss" / name).read_text())
    return run


@pytest.mark.parametrize(("name", "content", "message"), [
    (numerics.CURVES_CSV, gzip.compress(b"curve,step\nbf16-seed0,1\n"), "is not a curves file: its columns are ['curve', 'step']"),
    (curves.LEGACY_CURVES_CSV, b"curve,step\nbf16-seed0,1\n", "is not a curves file: its columns are ['curve', 'step']"),
    (numerics.CURVES_CSV, b"curve,step\nbf16-seed0,1\n", ": not gzip-compressed (Error -3 while decompressing data: incorrect header check)"),
    (curves.LEGACY_CURVES_CSV, b"curve,step,metric,layer,role,value\nbf16-seed0,1,loss,,,4.5", ": its last line is torn (no newline)"),
])  # fmt: skip
def test_a_malformed_curves_file_is_an_error_naming_it(tmp_path, runs, name, content, message):
    run = _rows_only(tmp_path, runs)
    (run / name).write_bytes(content)
    result = CliRunner().invoke(app, ["report", str(run)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and result.output.startswith(f"error: {run / name}"), result.output
    assert message in result.output, result.output


def test_an_older_runs_plain_curves_file_gives_the_same_page(tmp_path, runs):
    run = _rows_only(tmp_path, runs, "loss")  # the folder's name is the page's title
    (run / curves.LEGACY_CURVES_CSV).write_text(curves.read_values_text(runs / "loss" / numerics.CURVES_CSV), newline="")
    pd.testing.assert_frame_equal(report_numerics.read_curves(run), report_numerics.read_curves(runs / "loss"))
    write_reports(run)
    assert (run / "numerics.html").read_text() == (runs / "loss" / "numerics.html").read_text()
    assert not (run / numerics.CURVES_CSV).exists()  # a report reads the folder; it does not convert it


def test_a_folder_with_both_curves_files_is_an_error_naming_both(tmp_path, runs):
    run = _rows_only(tmp_path, runs)
    shutil.copyfile(runs / "loss" / numerics.CURVES_CSV, run / numerics.CURVES_CSV)
    (run / curves.LEGACY_CURVES_CSV).write_text(curves.read_values_text(runs / "loss" / numerics.CURVES_CSV), newline="")
    result = CliRunner().invoke(app, ["report", str(run)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith(f"error: {run / numerics.CURVES_CSV} and {run / curves.LEGACY_CURVES_CSV}: a run folder holds one curves file")
    assert not (run / "numerics.html").exists()


def test_a_run_without_curves_says_so_and_keeps_its_rows(tmp_path, runs):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("results.csv", "metadata.json"):
        (run / name).write_text((runs / "loss" / name).read_text())
    write_reports(run)
    page = (run / "numerics.html").read_text()
    assert f"The run folder holds no {numerics.CURVES_CSV} values" in page and chart_ids(page) == []
    assert [cells[2] for cells in headline_rows(page)] == ["0"] * 3 and [cells[4] for cells in headline_rows(page)][1:] == ["n/a"] * 2


def test_curves_that_did_not_run_are_headline_rows_with_their_status(tmp_path, monkeypatch):
    """Without the interpreter on a CPU, the FP8 curve is an unsupported row: listed, not measured."""
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setitem(numerics.MODELS, "micro", micro)
    argv = ["numerics", "loss", "--recipe", "tensorwise", "--steps", "2", "--bf16-seeds", "1", *SMALL, "--out", str(tmp_path)]
    assert CliRunner().invoke(app, argv).exit_code == 0
    assert CliRunner().invoke(app, ["report", str(tmp_path)]).exit_code == 0
    _, (implementation, recipe, seeds, status, gap, _, noise, verdict) = headline_rows((tmp_path / "numerics.html").read_text())
    assert (implementation, recipe, seeds, gap, noise, verdict) == ("triton", "tensorwise", "0", "n/a", "n/a", "not measured")
    assert status.startswith("unsupported: our FP8 kernels run on a CUDA GPU")
