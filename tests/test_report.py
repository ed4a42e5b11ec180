"""HTML reports: pages per granularity, plotly.js once per folder, escaping, and (in headless
Chromium) that every page loads without a script error and every chart plots every row it should.

The run is a synthetic fixture: rows built by fp8bench.benchmarks.matmul's own row builders from made-up,
randomly perturbed timings (timer "fake"), written with RunWriter into a temporary folder.
"""

from __future__ import annotations

import html

import numpy as np
import pytest
from typer.testing import CliRunner

from browser import inlines_bundle, parse_html, render
from fp8bench.cli import app
from fp8bench.config import FastAccum, GemmShape, Granularity, MatmulCase, Status
from fp8bench.model.hardware import GPUS
from fp8bench.benchmarks.matmul import GemmCase, MatmulBenchmark
from fp8bench.harness import runner
from fp8bench.report.write import INDEX_HTML, TIME_COLUMN, page_name, write_reports
from fp8bench.report.html import PLOTLY_JS
from fp8bench.report.matmul import heatmap_id
from fp8bench.harness.results import COLUMNS, Row, RunWriter, load_results, status_text
from fp8bench.harness.timing import Measurement

GPU = GPUS["h100-sxm"]
# A case name that would run script if any page let it through unescaped.
EVIL_NAME = """evil<script>document.title="pwned"</script><img src=x onerror="document.title='pwned'">&amp;,'"""
BACKENDS = ("cublas", "triton")
FP8 = Granularity.fp8()
FAST_ACCUMS = (FastAccum.ON, FastAccum.OFF)
# Made-up throughput (TFLOPS at the largest shape) per backend; FP8 twice BF16, roughly as on an H100.
SYNTHETIC_TFLOPS = {"bf16": 600.0, "cublas": 1200.0, "triton": 1100.0}


def case_row(case: MatmulCase, status: str) -> Row:
    """A matmul row without a measurement, as the harness writes it."""
    return runner.case_row(MatmulBenchmark(), GemmCase(case), status)


def measured_row(case: MatmulCase, m: Measurement, options: dict, gpu, bf16_ms: float | None, rel_err: float | None) -> Row:
    """A measured matmul row, as the harness derives it."""
    columns = {} if rel_err is None else {"rel_err": rel_err}
    return runner.measured_row(MatmulBenchmark(gpu), GemmCase(case), m, reference_ms=bf16_ms, options=options, columns=columns)


def grid_shapes() -> list[GemmShape]:
    """A 2 x 2 x 3 grid of M, K, N (so the heatmaps appear), one shape with the hostile name."""
    shapes = [GemmShape(m, k, n) for m in (256, 512) for k in (256, 512) for n in (256, 512, 1024)]
    return [GemmShape(s.M, s.K, s.N, EVIL_NAME) if (s.M, s.K, s.N) == (512, 512, 1024) else s for s in shapes]


def synthetic_status(case: MatmulCase) -> str | None:
    """Some cases do not run, so the pages must show `unsupported` and `failed` rows."""
    if case.granularity is Granularity.BLOCKWISE and case.fast_accum is FastAccum.ON and case.backend == "cublas":
        return status_text(Status.UNSUPPORTED, "synthetic: blockwise runs with fast-accum off only")
    if case.backend == "triton" and case.granularity is Granularity.AXISWISE and case.shape.N == 1024:
        return status_text(Status.FAILED, "synthetic: <failure> & crash")
    return None


def synthetic_measurement(case: MatmulCase, rng: np.random.Generator) -> Measurement:
    """Time from a throughput that falls off for small shapes, each of 5 repeats perturbed by ~2%."""
    size = case.shape.M * case.shape.K * case.shape.N
    tflops = SYNTHETIC_TFLOPS[case.backend] * (size / 1024**3) ** 0.2 * (0.9 if case.fast_accum is FastAccum.OFF else 1.0)
    ms = case.shape.flops / (tflops * 1e12) * 1e3
    repeats = ms * (1.0 + 0.02 * rng.standard_normal(5))
    return Measurement(tuple(float(t) for t in repeats), 50, float(ms * 1.3), "fake", tuple(rng.uniform(1700, 1980, 5)))


def write_synthetic_run(run_dir, rng: np.random.Generator) -> None:
    metadata = {
        "benchmark": "matmul",
        "command": "synthetic fixture of tests/test_report.py <not a run>",
        "gpu_spec": GPU.key,
        "gpu_name": "none: synthetic test fixture",
        "versions": {"torch": "synthetic <1.0>", "plotly": "synthetic"},
    }
    with RunWriter(run_dir, metadata) as writer:
        for shape in grid_shapes():
            bf16_case = MatmulCase(shape, "bf16", Granularity.NONE, FastAccum.NA)
            bf16 = synthetic_measurement(bf16_case, rng)
            writer.append(measured_row(bf16_case, bf16, {}, GPU, None, None))
            for granularity in FP8:
                for backend in BACKENDS:
                    for fast_accum in FAST_ACCUMS:
                        case = MatmulCase(shape, backend, granularity, fast_accum)
                        status = synthetic_status(case)
                        if status:
                            writer.append(case_row(case, status))
                            continue
                        m = synthetic_measurement(case, rng)
                        options = {"config": "synthetic"}
                        writer.append(measured_row(case, m, options, GPU, bf16.median_ms, float(rng.uniform(1e-3, 5e-2))))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("synthetic-run")
    write_synthetic_run(run_dir, np.random.default_rng(20240601))
    pages = write_reports(run_dir)
    return run_dir, pages, load_results(run_dir)


def page_rows(rows, granularity: Granularity):
    return rows[rows["granularity"].isin({granularity.value, Granularity.NONE.value})]


def table_rows(page_path) -> list[dict[str, str]]:
    """The rows table of a written page, cell texts by column header."""
    (table,) = [t for t in parse_html(page_path.read_text()).find_all("table") if "rows" in t.classes]
    header = [th.text() for th in table.find_all("th")]
    return [dict(zip(header, (td.text() for td in tr.find_all("td")))) for tr in table.find_all("tbody")[0].find_all("tr")]


# --- written files (no browser) ---


def test_one_page_per_granularity_and_an_index(run):
    run_dir, pages, _ = run
    assert pages == [run_dir / INDEX_HTML, *(run_dir / page_name(g) for g in FP8)]
    assert all(path.stat().st_size > 0 for path in pages)
    index_links = {a.attrs["href"] for a in parse_html(pages[0].read_text()).find_all("a")}
    assert {page_name(g) for g in FP8} <= index_links


def test_plotly_js_written_once_and_referenced_by_every_chart_page(run):
    run_dir, pages, _ = run
    bundle = run_dir / PLOTLY_JS
    assert bundle.stat().st_size > 1_000_000
    before = bundle.stat().st_mtime_ns
    write_reports(run_dir)
    assert bundle.stat().st_mtime_ns == before, "an unchanged plotly.js must not be rewritten"
    assert sorted(p.name for p in run_dir.glob("*.js")) == [PLOTLY_JS]
    for path in pages[1:]:
        text = path.read_text()
        scripts = parse_html(text).find_all("script")
        assert [s.attrs["src"] for s in scripts if "src" in s.attrs] == [PLOTLY_JS]
        assert not inlines_bundle(text, bundle), f"{path.name} inlines plotly.js"


def test_a_page_with_plotly_inlined_is_caught(run):
    """The check the pages pass is one that fails: a page carrying plotly.js, as plotly's include_plotlyjs=True
    writes it, is reported; the same page referencing the bundle is not."""
    run_dir, pages, _ = run
    bundle = run_dir / PLOTLY_JS
    page = pages[1].read_text()
    assert inlines_bundle(page.replace("</head>", f"<script>{bundle.read_text()}</script></head>"), bundle)
    assert not inlines_bundle(page, bundle)


def test_every_table_lists_all_rows_of_its_granularity_and_bf16(run):
    run_dir, _, rows = run
    for granularity in FP8:
        expected = page_rows(rows, granularity)
        shown = table_rows(run_dir / page_name(granularity))
        assert len(shown) == len(expected)
        assert sorted(r["status"] for r in shown) == sorted(expected["status"])
        assert sum(r["backend"] == "bf16" for r in shown) == len(grid_shapes())


def test_unsupported_and_failed_rows_are_shown_as_such(run):
    run_dir, _, rows = run
    shown = table_rows(run_dir / page_name(Granularity.BLOCKWISE))
    unsupported = [r for r in shown if r["status"].startswith("unsupported")]
    assert len(unsupported) == len(grid_shapes())  # cublas blockwise with fast-accum on, every shape
    assert all(r[TIME_COLUMN] == "" and r["tflops"] == "" for r in unsupported)
    failed = [r for r in table_rows(run_dir / page_name(Granularity.AXISWISE)) if r["status"].startswith("failed")]
    assert len(failed) == len(rows[rows["status"].str.startswith("failed")]) > 0
    assert failed[0]["status"] == "failed: synthetic: <failure> & crash"  # the parser unescapes; see the escaping test


def test_medians_are_shown_with_their_spread(run):
    run_dir, _, rows = run
    shown = table_rows(run_dir / page_name(Granularity.TENSORWISE))
    ok = page_rows(rows, Granularity.TENSORWISE)
    ok = ok[ok["status"] == "ok"]
    cells = sorted(r[TIME_COLUMN] for r in shown if r["status"] == "ok")
    assert cells == sorted(f"{m:.4g} ms ({s:.1f}%)" for m, s in zip(ok["median_ms"], ok["spread_pct"]))


def test_strings_from_the_results_are_escaped(run):
    run_dir, pages, _ = run
    for path in pages:
        text = path.read_text()
        assert "<script>document.title" not in text and "<img src=x" not in text
        assert "<failure>" not in text
    tensorwise = (run_dir / page_name(Granularity.TENSORWISE)).read_text()
    assert html.escape(EVIL_NAME) in tensorwise  # the table shows the name as text
    assert "synthetic &lt;1.0&gt;" in tensorwise  # metadata values too


def test_fake_timings_carry_a_banner(run):
    _, pages, _ = run
    for path in pages:
        banners = [p.text() for p in parse_html(path.read_text()).find_all("p", "banner")]
        assert banners and "not GPU measurements" in banners[0]


def test_a_run_with_no_rows_gets_an_index_only(tmp_path):
    RunWriter(tmp_path, {"command": "interrupted before the first case"}).close()
    assert write_reports(tmp_path) == [tmp_path / INDEX_HTML]
    assert "no result rows yet" in (tmp_path / INDEX_HTML).read_text()
    assert not (tmp_path / PLOTLY_JS).exists()


def test_an_unknown_granularity_is_a_clear_error(tmp_path):
    row = case_row(MatmulCase(GemmShape(64, 64, 64), "bf16", Granularity.NONE, FastAccum.NA), "ok")
    row.values["granularity"] = "mxfp8"
    with RunWriter(tmp_path, {}) as writer:
        writer.append(row)
    with pytest.raises(ValueError, match=r"granularities \['mxfp8'\] that are none of"):
        write_reports(tmp_path)



def test_a_bf16_only_run_without_a_gpu_model_gets_one_page_and_no_peak_line(tmp_path):
    rng = np.random.default_rng(3)
    with RunWriter(tmp_path, {"command": "synthetic", "gpu_name": "none: synthetic test fixture"}) as writer:
        for shape in grid_shapes()[:3]:
            case = MatmulCase(shape, "bf16", Granularity.NONE, FastAccum.NA)
            writer.append(measured_row(case, synthetic_measurement(case, rng), {}, None, None, None))
    pages = write_reports(tmp_path)
    assert pages == [tmp_path / INDEX_HTML, tmp_path / page_name(Granularity.NONE)]
    text = pages[1].read_text()
    assert "no peak is drawn" in text and "matmul-speedup" not in text and "matmul-tflops" in text
    assert len(table_rows(pages[1])) == 3


def test_a_benchmark_without_chart_builders_still_lists_its_rows(tmp_path):
    gbps = float(np.random.default_rng(5).uniform(1000, 3000))
    row = case_row(MatmulCase(GemmShape(4096, 4096, 1), "triton", Granularity.TENSORWISE, FastAccum.OFF), "ok")
    row.values.update(benchmark="unviewed", median_ms=0.05, spread_pct=1.5, gbps=gbps, timer="fake")
    with RunWriter(tmp_path, {"command": "synthetic"}) as writer:
        writer.append(row)
    (page_path,) = write_reports(tmp_path)[1:]
    assert "no charts for these rows" in page_path.read_text()
    (shown,) = table_rows(page_path)
    assert shown["benchmark"] == "unviewed" and shown["gbps"] == f"{gbps:.4g}" and shown[TIME_COLUMN] == "0.05 ms (1.5%)"

# --- the CLI ---


def test_cli_report_writes_the_pages(tmp_path):
    write_synthetic_run(tmp_path, np.random.default_rng(7))
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in (INDEX_HTML, *(page_name(g) for g in FP8)):
        assert (tmp_path / name).exists() and name in result.output


@pytest.mark.parametrize(
    ("csv_text", "metadata_text", "message"),
    [
        (None, None, "{run} holds no results.csv"),
        ("benchmark,case\nmatmul,x\n", None, "{run}/results.csv: does not follow the result schema"),
        (",".join(COLUMNS) + "\n", "{not json", "{run}/metadata.json: not valid JSON"),
        (",".join(COLUMNS) + "\n" + ",".join(["matmul"] * 5) + "\n", None, "{run}/results.csv: line 2 has 5 fields"),
    ],
)
def test_cli_report_rejects_bad_input_with_one_line_and_exit_2(tmp_path, csv_text, metadata_text, message):
    if csv_text is not None:
        (tmp_path / "results.csv").write_text(csv_text)
    if metadata_text is not None:
        (tmp_path / "metadata.json").write_text(metadata_text)
    result = CliRunner().invoke(app, ["report", str(tmp_path)], env={"COLUMNS": "1000"})  # no wrapped lines
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: " + message.format(run=tmp_path)), line
    assert result.exception is None or isinstance(result.exception, SystemExit)


# --- in headless Chromium ---


@pytest.fixture(scope="module")
def rendered(run):
    run_dir, pages, _ = run
    return {path.name: render(path) for path in pages}


@pytest.mark.browser
def test_every_page_loads_without_script_errors(run, rendered):
    _, pages, _ = run
    for path in pages:
        page = rendered[path.name]
        assert page.js_errors == (), f"{path.name}: {page.js_errors}"
        assert "pwned" not in page.title


@pytest.mark.browser
def test_every_chart_plots_every_row_it_should(run, rendered):
    _, _, rows = run
    assert rendered[INDEX_HTML].graphs == ()
    for granularity in FP8:
        page = rendered[page_name(granularity)]
        ok = page_rows(rows, granularity)
        ok = ok[ok["status"] == "ok"]
        fp8 = ok[ok["granularity"] == granularity.value]
        series = fp8.groupby(["backend", "fast_accum"]).size()

        speedup = page.graph("matmul-speedup")
        assert speedup.points == len(fp8)
        assert sorted(t.points for t in speedup.traces) == sorted(series)
        assert {t.kind for t in speedup.traces} == {"bars"}

        tflops = page.graph("matmul-tflops")
        assert tflops.points == len(ok)  # the BF16 rows too
        assert len(tflops.traces) == len(series) + 1

        for (backend, fast_accum), count in series.items():
            heatmap = page.graph(heatmap_id(backend, fast_accum))
            assert heatmap.points == count
            assert len(heatmap.traces) == fp8["M"].nunique()  # a panel per M
        assert len(page.graphs) == 2 + len(series)


@pytest.mark.browser
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('<script>undefinedFunction();</script>', "undefinedFunction is not defined"),
        ('<script>Promise.reject("boom");</script>', "unhandled rejection: boom"),
        ("", "failed to load file://"),  # a chart page whose folder lacks plotly.min.js
    ],
)
def test_the_browser_check_sees_script_errors(tmp_path, body, expected):
    from fp8bench.report.html import page

    path = tmp_path / "broken.html"
    path.write_text(page("broken on purpose", body, plotly=True))
    errors = render(path).js_errors
    assert any(expected in error for error in errors), errors


@pytest.mark.browser
def test_the_browser_check_flags_a_page_without_the_recorder(tmp_path):
    path = tmp_path / "bare.html"
    path.write_text("<!DOCTYPE html><html><body><p>no recorder</p></body></html>")
    assert render(path).js_errors == ("the page has no #js-errors error recorder",)


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_browser_skips_except_under_ci(monkeypatch, ci, outcome):
    import browser

    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="Chromium is not installed"):
        browser.require_chromium()
