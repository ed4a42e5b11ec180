"""The e2e benchmark's report pages and its comparison with the gate.

The fixture, tests/data/e2e-h100-trial, is the results.csv and metadata.json of `fp8bench e2e` with its
defaults on an H100 (metadata.json names the GPU and the software): BF16 eager and compiled, ours, torchao
and TransformerEngine (unsupported there) at every recipe. Runs on several GPUs are derived from it in a
temporary folder with made-up throughput, named as such where they are built.
"""

from __future__ import annotations

import ast
import html
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from browser import parse_html
from fp8bench.cli import app
from fp8bench.config import Granularity
from fp8bench.harness.results import load_results
from fp8bench.model.hardware import GPUS
from fp8bench.model.roofline import IMPLEMENTATIONS
from fp8bench.report import e2e as report_e2e
from fp8bench.report.html import colour_map
from fp8bench.report.write import page_name, write_reports

FIXTURE = Path(__file__).parent / "data" / "e2e-h100-trial"
GPU = GPUS["h100-sxm"]
FP8 = (Granularity.TENSORWISE, Granularity.AXISWISE, Granularity.BLOCKWISE)
HOSTILE_NAME = """x<img src=x onerror="document.title='pwned'">"""
CHARTS = ("e2e-tokens", "e2e-speedup", "e2e-measured-vs-ideal", "e2e-mfu", "e2e-memory")
SECTIONS = ("e2e-headline", "e2e-not-run")
runner = CliRunner()


def copy_fixture(folder: Path) -> Path:
    shutil.copytree(FIXTURE, folder)
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = copy_fixture(tmp_path_factory.mktemp("e2e") / "run")
    write_reports(run_dir)
    return run_dir, load_results(run_dir)


def page_rows(rows: pd.DataFrame, granularity: Granularity) -> pd.DataFrame:
    return rows[rows["granularity"].isin({granularity.value, Granularity.NONE.value})]


def section(run_dir: Path, granularity: Granularity, section_id: str):
    document = parse_html((run_dir / page_name(granularity)).read_text(encoding="utf-8"))
    (found,) = [e for e in document.find_all("section") if e.attrs.get("id") == section_id]
    return found


def table_cells(element) -> list[dict[str, str]]:
    """The rows of every table in `element`, as header -> cell text."""
    rows = []
    for table in element.find_all("table"):
        head = [th.text() for th in table.find_all("th")]
        rows += [dict(zip(head, (td.text() for td in tr.find_all("td")))) for tr in table.find_all("tr") if tr.find_all("td")]
    return rows


def test_a_page_per_granularity_with_every_chart_and_section(run):
    run_dir, rows = run
    assert {p.name for p in run_dir.glob("*.html")} == {"index.html", *(page_name(g) for g in FP8)}
    for granularity in FP8:
        text = (run_dir / page_name(granularity)).read_text(encoding="utf-8")
        ids = [e.attrs["id"] for e in parse_html(text).iter() if e.attrs.get("id", "").startswith("e2e-")]
        breakdown = "e2e-breakdown-llama3-8b-l4-s8192-b1-1-gpu-checkpointing-none"
        # blockwise: no reference implementation ran, so there is nothing to differ from
        difference = [] if granularity is Granularity.BLOCKWISE else ["e2e-difference"]
        assert ids == [SECTIONS[0], *CHARTS, breakdown, *difference, SECTIONS[1]], granularity
        assert "6 N + 12 L H head_dim S" in text and "torchtitan" in text
        assert "MFU against the BF16 dense peak" in text and "MFU against the FP8 dense peak" in text


def test_headline_equals_each_implementations_best_speedup_computed_with_pandas(run):
    run_dir, rows = run
    for granularity in FP8:
        ok = rows[(rows["granularity"] == granularity.value) & (rows["status"] == "ok")]
        best = ok.loc[ok.groupby("backend", sort=False)["speedup_vs_bf16"].idxmax()]
        shown = table_cells(section(run_dir, granularity, "e2e-headline"))
        assert [r["implementation"] for r in shown] == list(best["backend"])
        assert [r["best recipe"] for r in shown] == list(best["recipe"])
        assert [r["speedup over BF16 compiled (block)"] for r in shown] == [f"{v:.3f}" for v in best["speedup_vs_bf16"]]
        assert [r["ideal speedup"] for r in shown] == [f"{v:.3f}" for v in best["ideal_speedup"]]
        ratio = best["speedup_vs_bf16"] / best["ideal_speedup"]
        assert [r["measured / ideal"] for r in shown] == [f"{v:.3f}" for v in ratio]
        assert [r["tokens/s per GPU"] for r in shown] == [f"{v:,.0f}" for v in best["tokens_per_s"]]


def test_headline_sentence_puts_ours_against_the_best_reference(run):
    run_dir, rows = run
    ok = rows[(rows["granularity"] == "tensorwise") & (rows["status"] == "ok")]
    ours = ok[ok["backend"] == "triton"]["speedup_vs_bf16"].max()
    reference = ok[ok["backend"] != "triton"]["speedup_vs_bf16"].max()
    sentence = section(run_dir, Granularity.TENSORWISE, "e2e-headline").find_all("p", "headline")[0].text()
    # the H100 run: ours tensorwise-delayed 1.183x, torchao tensorwise 1.122x
    assert sentence == (
        f"Ours: {ours:.3f}x (tensorwise-delayed); best reference: torchao {reference:.3f}x (tensorwise); "
        f"ours / reference = {ours / reference:.3f}."
    )


def test_difference_table_is_ours_minus_the_best_reference_per_kernel_class(run):
    run_dir, rows = run
    ok = rows[(rows["granularity"] == "tensorwise") & (rows["status"] == "ok")]
    ours = ok.loc[ok[ok["backend"] == "triton"]["speedup_vs_bf16"].idxmax()]
    reference = ok.loc[ok[ok["backend"] != "triton"]["speedup_vs_bf16"].idxmax()]
    shown = {r["kernel class"]: r for r in table_cells(section(run_dir, Granularity.TENSORWISE, "e2e-difference"))}
    columns = {"median_ms": "step (median)", **report_e2e.CLASS_COLUMNS}
    assert list(shown) == list(columns.values())
    for column, name in columns.items():
        assert shown[name]["ours - reference, ms"] == f"{ours[column] - reference[column]:+.2f}"
        assert shown[name]["torchao: tensorwise, ms"] == f"{reference[column]:.2f}"


def test_rows_that_did_not_run_are_listed_with_their_reasons(run):
    run_dir, rows = run
    for granularity in FP8:
        missing = rows[(rows["granularity"] == granularity.value) & (rows["status"] != "ok")]
        shown = table_cells(section(run_dir, granularity, "e2e-not-run"))
        assert [(r["implementation"], r["recipe"], r["status"]) for r in shown] == list(
            zip(missing["backend"], missing["recipe"], missing["status"])
        )


def test_charts_plot_every_ok_row_in_one_colour_per_implementation(run):
    _, rows = run
    rows = page_rows(rows, Granularity.TENSORWISE)
    ok = rows[rows["status"] == "ok"]
    fp8 = ok[ok["granularity"] != "none"]
    colours = colour_map([*IMPLEMENTATIONS, "bf16"])
    (tokens,) = report_e2e.tokens_chart(rows, GPU)
    assert sum(len(t.y) for t in tokens.figure.data) == len(ok)  # BF16 eager and compiled too
    (speedup,) = report_e2e.speedup_chart(rows, GPU)
    measured = [t for t in speedup.figure.data if t.type == "bar" and report_e2e.MEASURED in t.name]
    ideal = [t for t in speedup.figure.data if t.type == "bar" and report_e2e.IDEAL in t.name]
    assert sorted(v for t in measured for v in t.y) == sorted(fp8["speedup_vs_bf16"])
    assert sorted(v for t in ideal for v in t.y) == sorted(fp8["ideal_speedup"])
    (mfu,) = report_e2e.mfu_chart(rows, GPU)
    assert sum(len(t.y) for t in mfu.figure.data) == 2 * len(ok)
    (memory,) = report_e2e.memory_chart(rows, GPU)
    for chart in (tokens, speedup, mfu, memory):
        for trace in chart.figure.data:
            if trace.type == "bar":
                implementation = trace.name.split(",")[0]
                assert trace.marker.color == colours[implementation], (chart.div_id, trace.name)
    (breakdown,) = report_e2e.breakdown_charts(rows, GPU)
    stacks = [t for t in breakdown.figure.data if t.type == "bar"]
    for column, name in report_e2e.CLASS_COLUMNS.items():
        values = [v for t in stacks if t.name == name for v in t.y]
        assert sorted(values) == sorted(ok[column][ok[column] > 0])


def test_strings_from_the_results_are_escaped(tmp_path):
    run_dir = copy_fixture(tmp_path / "run")
    results = pd.read_csv(run_dir / "results.csv", dtype=str, keep_default_na=False)
    results["case"] = HOSTILE_NAME
    results.loc[results["status"] != "ok", "status"] = "unsupported: " + HOSTILE_NAME
    results.to_csv(run_dir / "results.csv", index=False)
    write_reports(run_dir)
    for granularity in FP8:
        text = (run_dir / page_name(granularity)).read_text(encoding="utf-8")
        assert "<img" not in text
        assert "\\u003cimg" not in text  # plotly's JSON writes "<" so, and renders the label as HTML
        assert html.escape(HOSTILE_NAME) in text  # in the tables
        assert "x&lt;img src=x" in text.split('id="e2e-tokens"', 1)[1]  # in the charts' labels


GEMM_GROWTH_MS, COMM_MS, EXPOSED_MS, ONE_GPU_EXPOSED_MS = 2.0, 30.0, 4.0, 0.5


def _two_gpu_rows(run_dir: Path) -> pd.DataFrame:
    """The fixture's ok compiled rows again on 2 GPUs, with made-up throughput (96% of one GPU's, the step
    as much longer), GEMM time (GEMM_GROWTH_MS more), communication (COMM_MS) and all-gather bytes:
    synthetic, to check the arithmetic of the scaling tables."""
    results = pd.read_csv(run_dir / "results.csv", dtype=str, keep_default_na=False)
    results["exposed_comm_ms"] = str(ONE_GPU_EXPOSED_MS)  # a column the fixture's run predates
    several = results[(results["status"] == "ok") & (results["compile"] == "block")].copy()
    several["world_size"] = "2"
    several["tokens_per_s"] = (several["tokens_per_s"].astype(float) * 0.96).map(str)
    several["median_ms"] = (several["median_ms"].astype(float) / 0.96).map(str)
    several["gemm_ms"] = (several["gemm_ms"].astype(float) + GEMM_GROWTH_MS).map(str)
    several["comm_ms"] = str(COMM_MS)
    several["exposed_comm_ms"] = str(EXPOSED_MS)
    several["allgather_gb"] = "1.5"
    several["timer"] = "fake"
    pd.concat([results, several]).to_csv(run_dir / "results.csv", index=False)
    return load_results(run_dir)


def test_a_run_against_a_baseline_on_several_gpus_scales_from_its_fewest(tmp_path):
    """--baseline-gpus 2 with --nproc-per-node 4: the 4-GPU rows against the 2-GPU ones; the 2-GPU rows, the
    baseline, have no efficiency of their own."""
    run_dir = copy_fixture(tmp_path / "run")
    _two_gpu_rows(run_dir)
    results = pd.read_csv(run_dir / "results.csv", dtype=str, keep_default_na=False)
    results = results[results["world_size"] == "2"]
    four = results.copy()
    four["world_size"] = "4"
    four["tokens_per_s"] = (four["tokens_per_s"].astype(float) * 0.9).map(str)
    four["median_ms"] = (four["median_ms"].astype(float) / 0.9).map(str)
    pd.concat([results, four]).to_csv(run_dir / "results.csv", index=False)
    rows = page_rows(load_results(run_dir), Granularity.TENSORWISE)
    scaling, growth = report_e2e.scaling_table(rows, GPU)
    shown = table_cells(parse_html(scaling.to_html()))
    assert {r["scaling efficiency"] for r in shown if r["on 2 GPUs"]} == {"90.0%"}
    assert sum(1 for r in shown if not r["on 2 GPUs"] and not r["scaling efficiency"]) == (rows["world_size"] == "2").sum()
    assert "same step's on 2 GPUs (the run's fewest)" in scaling.note
    grown = table_cells(parse_html(growth.to_html()))
    assert len(grown) == (rows["world_size"] == "4").sum() > 0 and all("step on 2 GPUs, ms" in cells for cells in grown)


def test_runs_on_several_gpus_show_all_gather_bytes_and_scaling_efficiency(tmp_path):
    run_dir = copy_fixture(tmp_path / "run")
    rows = page_rows(_two_gpu_rows(run_dir), Granularity.TENSORWISE)
    scaling, growth = report_e2e.scaling_table(rows, GPU)
    shown = table_cells(parse_html(scaling.to_html()))
    two = rows[(rows["world_size"] == "2")]
    assert [r["implementation"] for r in shown] == list(two["backend"])
    assert {r["scaling efficiency"] for r in shown} == {"96.0%"}
    assert {r["all-gathered per step per GPU, GB"] for r in shown} == {"1.500"}
    # where the step grows: the step's growth, and each class's (here GEMM and communication only)
    grown = table_cells(parse_html(growth.to_html()))
    one = rows[rows["world_size"] == "1"].set_index(["backend", "recipe", "compile"])
    assert [r["implementation"] for r in grown] == list(two["backend"])
    for cells, (_, row) in zip(grown, two.iterrows()):
        same_step = one.loc[(row["backend"], row["recipe"], row["compile"])]
        step_1gpu = same_step["median_ms"]
        assert cells["step on 1 GPU, ms"] == f"{step_1gpu:.1f}"
        assert cells["step grows, ms"] == f"{step_1gpu / 0.96 - step_1gpu:+.1f}"
        assert cells["GEMM, ms"] == f"{GEMM_GROWTH_MS:+.1f}"
        assert cells["communication, ms"] == f"{COMM_MS - same_step['comm_ms']:+.1f}"
        assert cells["attention, ms"] == "+0.0"
        assert cells["communication nothing overlaps, ms"] == f"{EXPOSED_MS - ONE_GPU_EXPOSED_MS:+.1f}"
        assert cells["compute stream idle, ms"] == ""  # not recorded in the fixture's run
    assert report_e2e.scaling_table(page_rows(load_results(FIXTURE), Granularity.TENSORWISE), GPU) == []
    # a panel per world size in the charts
    (tokens,) = report_e2e.tokens_chart(rows, GPU)
    assert {a.text for a in tokens.figure.layout.annotations} >= {
        "configuration=llama3-8b.L4.S8192.B1, 1 GPU, checkpointing none",
        "configuration=llama3-8b.L4.S8192.B1, 2 GPUs, checkpointing none",
    }


def test_the_report_imports_no_benchmark():
    tree = ast.parse(Path(report_e2e.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    assert not [m for m in imported if m and m.startswith("fp8bench.benchmarks")]


def test_compare_passes_the_run_against_itself_and_compares_every_ok_case(tmp_path):
    base, new = copy_fixture(tmp_path / "base"), copy_fixture(tmp_path / "new")
    result = runner.invoke(app, ["compare", str(base), str(new), "--json", str(tmp_path / "out.json")])
    assert result.exit_code == 0, result.output
    comparison = json.loads((tmp_path / "out.json").read_text())
    assert comparison["verdict"] == "PASS"
    rows = load_results(FIXTURE)
    ok = rows[(rows["status"] == "ok") & (rows["granularity"] != "none")]
    compared = {(c["case_id"]["backend"], c["case_id"]["recipe"]): c for c in comparison["cases"]}
    assert set(compared) == set(zip(ok["backend"], ok["recipe"]))
    assert {c["outcome"] for c in compared.values()} == {"PASS"}
    assert {c["slowdown_pct"] for c in compared.values()} == {0.0}
    not_ok = rows[rows["status"] != "ok"]
    assert len(comparison["not_compared"]) == len(not_ok)


def test_the_roofline_models_prediction_is_in_the_headline_the_table_and_the_speedup_chart(tmp_path):
    """Rows with predicted_speedup (made up here: 0.97 of the ideal) and measured_vs_predicted: the headline
    shows both for each implementation's best row, the speedup chart a predicted bar per row."""
    run_dir = copy_fixture(tmp_path / "run")
    frame = pd.read_csv(run_dir / "results.csv")
    fp8 = frame["ideal_speedup"].notna()
    frame.loc[fp8, "predicted_speedup"] = 0.97 * frame.loc[fp8, "ideal_speedup"]
    frame.loc[fp8, "measured_vs_predicted"] = frame.loc[fp8, "speedup_vs_bf16"] / frame.loc[fp8, "predicted_speedup"]
    frame.to_csv(run_dir / "results.csv", index=False)
    write_reports(run_dir)
    rows = load_results(run_dir)
    ok = rows[(rows["granularity"] == Granularity.TENSORWISE.value) & (rows["status"] == "ok")]
    best = ok.loc[ok.groupby("backend", sort=False)["speedup_vs_bf16"].idxmax()]
    shown = table_cells(section(run_dir, Granularity.TENSORWISE, "e2e-headline"))
    assert [r["predicted speedup"] for r in shown] == [f"{v:.3f}" for v in best["predicted_speedup"]]
    assert [r["measured / predicted"] for r in shown] == [f"{v:.3f}" for v in best["measured_vs_predicted"]]
    (speedup,) = report_e2e.speedup_chart(page_rows(rows, Granularity.TENSORWISE), GPU)
    predicted = [v for t in speedup.figure.data if t.type == "bar" and report_e2e.PREDICTED in t.name for v in t.y]
    assert sorted(predicted) == sorted(ok["predicted_speedup"])
