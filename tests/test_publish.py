"""`fp8bench publish`: the static site, built from the committed reports/ tree (what CI checks) and
from a synthetic tree with hostile names, gate results, skipped folders and two runs per entry.

In headless Chromium every page must load without a script error and draw exactly the points its
rows call for; on disk every link must resolve inside the site, plotly.js must exist once, every
string from a result file must be escaped, and a second build must rebuild only what changed.
"""

from __future__ import annotations

import html
import json
import posixpath
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
from typer.testing import CliRunner

from browser import embedded_graphs, inlines_bundle, parse_html, render
from fp8bench.cli import app
from fp8bench.config import FastAccum, GemmShape, Granularity, MatmulCase, Status
from fp8bench.publish.pages import history_chart, series_history_path
from fp8bench.publish.site import MANIFEST_JSON, publish
from fp8bench.publish.tree import COMPARE_HTML, GATE_JSON, HISTORY_HTML, latest, read_tree, series_of, slug
from fp8bench.model.hardware import GPUS
from fp8bench.report.write import INDEX_HTML, VIEWS, own_pages, page_name
from fp8bench.report.html import PLOTLY_JS, Chart
from fp8bench.report.matmul import heatmap_id, is_grid
from fp8bench.harness.results import RunWriter, load_results, read_metadata, status_text
from test_report import GPU, case_row, measured_row, synthetic_measurement

COMMITTED_REPORTS = Path(__file__).resolve().parent.parent / "reports"
# Strings that would run script if a page let them through: a case name that closes the script
# element plotly's data sits in, and a run folder name (folders cannot hold `/`).
EVIL_CASE = '</script><script>document.title="pwned"</script>'
EVIL_RUN = """<img src=x onerror="document.title='pwned'">"""
MODEL = "synthetic-gpu"
SHAPES = (GemmShape(512, 512, 512), GemmShape(1024, 512, 1024, EVIL_CASE))
SLOWER = 1.25  # the second CI run's cuBLAS fast-accum cases: 25% slower, so the gate sees a regression
CI_COMMAND = "fp8bench run suites/ci.toml --out /ci"  # a suite run: its entries are the series


def write_run(run_dir: Path, started: str | None, seed: int, slow_fast_accum: float = 1.0, **metadata_keys: str) -> None:
    """Synthetic matmul rows (fake timer): BF16 and cuBLAS tensorwise per shape, plus an unsupported row."""
    metadata = {
        "benchmark": "matmul",
        "command": f"synthetic fixture of tests/test_publish.py {EVIL_CASE}",
        "gpu_spec": GPU.key,
        "gpu_name": "none: synthetic test fixture",
        **metadata_keys,
    }
    if started is not None:
        metadata["started_utc"] = started
    rng = np.random.default_rng(seed)
    with RunWriter(run_dir, metadata, resume=True) as writer:  # a later call appends rows: the run grew
        for shape in SHAPES:
            bf16_case = MatmulCase(shape, "bf16", Granularity.NONE, FastAccum.NA)
            bf16 = synthetic_measurement(bf16_case, rng)
            writer.append(measured_row(bf16_case, bf16, {}, GPU, None, None))
            for fast_accum in (FastAccum.ON, FastAccum.OFF):
                case = MatmulCase(shape, "cublas", Granularity.TENSORWISE, fast_accum)
                measurement = synthetic_measurement(case, rng)
                if fast_accum is FastAccum.ON:
                    measurement = replace(measurement, repeat_ms=tuple(t * slow_fast_accum for t in measurement.repeat_ms))
                writer.append(measured_row(case, measurement, {}, GPU, bf16.median_ms, 0.03))
            triton = MatmulCase(shape, "triton", Granularity.TENSORWISE, FastAccum.ON)
            writer.append(case_row(triton, status_text(Status.UNSUPPORTED, "synthetic: <no triton> here")))


def write_synthetic_tree(root: Path) -> None:
    """Two CI runs (folders of suite runs) of entries `square` and `thin`, the second gated against
    the first; a single run with a hostile folder name; and folders that are no runs at all."""
    model = root / MODEL
    ci = {"command": CI_COMMAND}
    write_run(model / "ci-001" / "square", "2026-01-01T10:00:00+00:00", seed=1, **ci)
    write_run(model / "ci-001" / "thin", None, seed=2, **ci)  # records no start time: not on the history chart
    write_run(model / "ci-002" / "square", "2026-01-02T10:00:00+00:00", seed=3, slow_fast_accum=SLOWER, **ci)
    write_run(model / "ci-002" / "thin", "2026-01-02T10:05:00+00:00", seed=4, **ci)
    write_run(model / "ci-002" / "_reruns" / "square" / "case-1", "2026-01-02T10:10:00+00:00", seed=5)
    gated = CliRunner().invoke(app, ["compare", str(model / "ci-001"), str(model / "ci-002"), "--json", str(model / "ci-002" / GATE_JSON)])
    assert gated.exit_code == 1, gated.output  # the slowed cases are a regression
    write_run(model / EVIL_RUN, "2026-01-03T10:00:00+00:00", seed=6, suite_entry=EVIL_RUN)
    (model / "ci-002" / "notes").mkdir()
    (model / "empty-run").mkdir()
    (root / "empty-model").mkdir()


@pytest.fixture(scope="module")
def committed_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("committed") / "site"
    return site, publish(COMMITTED_REPORTS, site)


@pytest.fixture(scope="module")
def synthetic_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic") / "reports"
    write_synthetic_tree(root)
    site = root.parent / "site"
    return root, site, publish(root, site)


def site_pages(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def ok_fp8(rows):
    return rows[(rows["status"] == "ok") & (rows["granularity"] != Granularity.NONE.value) & (rows["speedup_vs_bf16"] > 0)]


# For a page of another benchmark checked without building its view's charts again: some graphs, each
# drawing at least one point.
SOME_GRAPHS = "some graphs"


def expected_graphs(root: Path, site: Path, only: set[Path] | None = None) -> dict[Path, dict[str, int | None]]:
    """Per chart page (of `only`, or all), each plotly graph's div id and the points it must draw:
    counted from the rows for matmul runs; for other benchmarks (their point counts are
    tests/test_report_views.py's business) the charts their view builds, each to draw at least one
    point (None). Building those charts again costs as much as the site did: where `only` is not
    given, such a page expects SOME_GRAPHS instead."""
    tree = read_tree(root, exclude=site)
    expected: dict[Path, dict[str, int]] = {}
    for model in tree.models:
        history: dict[str, int] = {}
        for name, entries in tree.history(model).items():
            points = sum(
                ok_fp8(e.rows).groupby(["benchmark", "granularity", "backend", "fast_accum"]).ngroups
                for e in entries
                if e.started is not None
            )
            if points:
                history[f"history-{slug(name)}-chart"] = points
            # the series' own page draws its one chart
            expected[site / series_history_path(model, name)] = {f"history-{slug(name)}-chart": points} if points else {}
            for entry in entries:
                # A benchmark with a page of its own (numerics) draws there, not on the granularity pages.
                own = own_pages(entry.rows)
                for benchmark in own:
                    path = site / entry.site_dir / f"{benchmark}.html"
                    if only is None or path in only:
                        expected[path] = {SOME_GRAPHS: None}
                rows = entry.rows[~entry.rows["benchmark"].isin(own)]
                gpu = GPUS.get(str(entry.metadata.get("gpu_spec")))
                for granularity in Granularity.fp8():
                    path = site / entry.site_dir / page_name(granularity)
                    on_page = rows[rows["granularity"].isin({granularity.value, Granularity.NONE.value})]
                    if not (rows["granularity"] == granularity.value).any() or (only is not None and path not in only):
                        continue
                    graphs: dict[str, int | None] = {}
                    for benchmark, benchmark_rows in on_page.groupby("benchmark"):
                        if benchmark == "matmul":
                            shown = benchmark_rows[benchmark_rows["status"] == "ok"]
                            speedups = len(ok_fp8(shown))  # runs without BF16 rows (kernel sweeps) draw no speedup chart
                            graphs.update({"matmul-speedup": speedups} if speedups else {})
                            graphs["matmul-tflops"] = int(shown["tflops"].notna().sum())
                            if is_grid(shown):  # a grid of shapes also draws a heatmap per backend and accumulation
                                series = ok_fp8(shown).groupby(["backend", "fast_accum"], sort=False).groups
                                graphs.update({heatmap_id(backend, accum): None for backend, accum in series})
                        elif only is None:
                            graphs = {SOME_GRAPHS: None}
                        else:
                            graphs.update({
                                c.div_id: None for build in VIEWS[benchmark].charts for c in build(benchmark_rows, gpu) if isinstance(c, Chart)
                            })
                    expected[path] = graphs
        expected[site / slug(model) / HISTORY_HTML] = history
    return expected


def render_all(pages: list[Path]) -> dict[Path, object]:
    """Chromium on every page, two at a time (one per core of a small CI box)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(pages, pool.map(render, pages)))


def check_graphs(where: Path, drawn: dict[str, int], wanted: dict[str, int | None]) -> None:
    if SOME_GRAPHS in wanted:
        assert drawn and all(n > 0 for n in drawn.values()), (where, drawn)
        return
    assert drawn.keys() == wanted.keys(), where
    assert all(drawn[i] == n if n is not None else drawn[i] > 0 for i, n in wanted.items()), (where, drawn)


def check_in_browser(root: Path, site: Path, pages: list[Path] | None = None) -> None:
    """Chromium on `pages` (default: every page): no script error, and each graph draws what it must."""
    pages = pages or site_pages(site)
    expected = expected_graphs(root, site, only=set(pages))
    assert expected, "no chart page expected: the tree has no runs with charts"
    for path, page in render_all(pages).items():
        where = path.relative_to(site)
        assert page.js_errors == (), f"{where}: {page.js_errors}"
        assert page.title != "pwned", where  # what the hostile strings would set
        check_graphs(where, {g.div_id: g.points for g in page.graphs}, expected.get(path, {}))


def check_embedded_graphs(root: Path, site: Path) -> int:
    """Every page's graphs read from the data embedded in it (no browser); return the pages with graphs."""
    expected = expected_graphs(root, site)
    with_graphs = 0
    for path in site_pages(site):
        drawn = {g.div_id: g.points for g in embedded_graphs(path.read_text(encoding="utf-8"))}
        check_graphs(path.relative_to(site), drawn, expected.get(path, {}))
        with_graphs += bool(drawn)
    return with_graphs


def browser_sample(site: Path) -> list[Path]:
    """The pages Chromium renders of a large site: the first chart page of each benchmark's first run
    (their charts are each view's), each history page and the site's index."""
    sample, benchmarks = [site / INDEX_HTML, *sorted(site.glob(f"*/{HISTORY_HTML}"))], set()
    for path in site_pages(site):
        results = path.parent / "results.csv"
        if path.name in (INDEX_HTML, COMPARE_HTML) or not results.is_file():
            continue
        benchmarks_here = set(load_results(results)["benchmark"])
        if not benchmarks_here <= benchmarks:
            benchmarks |= benchmarks_here
            sample.append(path)
    return sample


def local_target(page: Path, reference: str) -> tuple[Path, str]:
    parts = urlsplit(reference)
    assert not parts.scheme and not parts.netloc, f"{page}: {reference} leaves the site (it must work with no network)"
    return (page.parent / unquote(parts.path)).resolve() if parts.path else page.resolve(), parts.fragment


def check_links(site: Path) -> int:
    """Every href and src of every page resolves to a file inside the site (and a #fragment to an id there)."""
    checked = 0
    site = site.resolve()
    for page in site_pages(site):
        dom = parse_html(page.read_text(encoding="utf-8"))
        references = [e.attrs["href"] for e in dom.find_all("a") if "href" in e.attrs]
        references += [e.attrs["src"] for e in dom.find_all("script") if "src" in e.attrs]
        for reference in references:
            target, fragment = local_target(page, reference)
            assert target.is_relative_to(site) and target.is_file(), f"{page.relative_to(site)}: broken link {reference}"
            if fragment:
                ids = {e.attrs.get("id") for e in parse_html(target.read_text(encoding="utf-8")).find_all()}
                assert fragment in ids, f"{page.relative_to(site)}: {reference} names no element of {target.name}"
            checked += 1
    return checked


def check_one_plotly(site: Path) -> None:
    bundles = [p for p in site.rglob("*.js")]
    assert bundles == [site / PLOTLY_JS] and bundles[0].stat().st_size > 1_000_000
    for page in site_pages(site):
        text = page.read_text(encoding="utf-8")
        sources = [e.attrs["src"] for e in parse_html(text).find_all("script") if "src" in e.attrs]
        if "Plotly.newPlot" in text:
            assert len(sources) == 1 and local_target(page, sources[0])[0] == (site / PLOTLY_JS).resolve(), page
        else:
            assert sources == [], page
        assert not inlines_bundle(text, bundles[0]), f"{page} inlines plotly.js"


def table(page: Path, heading: str) -> list[dict[str, str]]:
    """The rows of the first table after an <h2> with this text, cell texts by column header."""
    dom = parse_html(page.read_text(encoding="utf-8"))
    elements = list(dom.iter())
    start = next(i for i, e in enumerate(elements) if e.tag == "h2" and e.text() == heading)
    found = next(e for e in elements[start:] if e.tag == "table")
    header = [th.text().strip() for th in found.find_all("th")]
    return [dict(zip(header, (td.text().strip() for td in tr.find_all("td")))) for tr in found.find_all("tbody")[0].find_all("tr")]


# --- the committed reports (what CI publishes) ---


def committed_run_folders() -> list[Path]:
    """Run folders of the committed tree, <model>/<run>/ or <model>/<suite run>/<entry>/, without the
    `_reruns` side folders of a gate."""
    return sorted(
        csv.parent
        for csv in COMMITTED_REPORTS.rglob("results.csv")
        if not any(part.startswith("_") for part in csv.relative_to(COMMITTED_REPORTS).parts)
    )


def test_committed_reports_site_has_every_run_and_one_plotly(committed_site):
    site, published = committed_site
    runs = committed_run_folders()
    assert runs, "reports/ holds no committed run"
    expected = sorted(
        "/".join((slug(run.relative_to(COMMITTED_REPORTS).parts[0]), "runs", *run.relative_to(COMMITTED_REPORTS).parts[1:]))
        for run in runs
    )
    assert sorted(key for key in published.rebuilt if not key.endswith(COMPARE_HTML)) == expected
    assert published.unchanged == ()
    tree = read_tree(COMMITTED_REPORTS)
    for model in {run.relative_to(COMMITTED_REPORTS).parts[0] for run in runs}:
        latest_rows = table(site / slug(model) / INDEX_HTML, "Latest result of each series")
        series = tree.history(model)
        assert sorted(row["series"] for row in latest_rows) == sorted(name for name, entries in series.items() if latest(entries))
        assert {row["latest run"] for row in latest_rows} <= {run.name for run in tree.models[model]}
        for row in latest_rows:
            gate_json = COMMITTED_REPORTS / model / row["latest run"] / GATE_JSON
            if gate_json.exists():
                assert row["gate"].startswith(json.loads(gate_json.read_text())["verdict"]), row
            else:
                assert row["gate"] == "not gated", row
    check_one_plotly(site)
    assert check_links(site) > 0


def test_committed_reports_geomeans_are_those_of_the_rows(committed_site):
    site, _ = committed_site
    rows_shown = 0
    tree = read_tree(COMMITTED_REPORTS)
    for model in tree.models:
        geomeans = table(site / slug(model) / INDEX_HTML, "Geomean speedup over BF16 of the latest results")
        for series, entries in tree.history(model).items():
            if latest(entries) is None:
                continue
            shown = [row for row in geomeans if row["series"] == series]
            fp8 = ok_fp8(latest(entries).rows)
            assert len(shown) == fp8["granularity"].nunique()  # none for a cast run: it has no BF16 reference
            rows_shown += len(shown)
            for (granularity, backend, fast_accum), speedups in fp8.groupby(["granularity", "backend", "fast_accum"])["speedup_vs_bf16"]:
                (row,) = [r for r in shown if r["granularity"] == granularity]
                geomean = float(np.exp(np.log(speedups).mean()))
                assert row[f"{backend}, accum {fast_accum}"] == f"{geomean:.3f}x ({len(speedups)})"
    assert rows_shown > 0


def test_committed_reports_pages_embed_every_chart_their_rows_call_for(committed_site):
    site, _ = committed_site
    assert check_embedded_graphs(COMMITTED_REPORTS, site) > 0


@pytest.mark.browser
def test_committed_reports_site_renders_a_page_of_each_benchmark_without_errors(committed_site):
    """One page per benchmark (each view's charts), the history and the index: the rest of the committed
    pages are checked from their embedded data (test above), and every page in the synthetic site."""
    site, _ = committed_site
    sample = browser_sample(site)
    assert len(sample) >= 4 and len(sample) < len(site_pages(site)) / 10
    check_in_browser(COMMITTED_REPORTS, site, sample)


# --- a synthetic tree ---


def test_synthetic_site_layout_skips_what_is_not_a_run(synthetic_site):
    root, site, published = synthetic_site
    skipped = {str(s.path.relative_to(root)): s.reason for s in published.skipped}
    assert sorted(skipped) == sorted([f"{MODEL}/ci-002/notes", f"{MODEL}/empty-run", "empty-model"])
    assert skipped[f"{MODEL}/ci-002/notes"] == "holds no results.csv"
    assert skipped[f"{MODEL}/empty-run"] == "holds no results.csv, nor entry folders with one"
    assert skipped["empty-model"] == "holds no run folders"
    entries = sorted(published.rebuilt)
    assert entries == sorted(
        [f"{MODEL}/runs/{run}/{entry}" for run in ("ci-001", "ci-002") for entry in ("square", "thin")]
        + [f"{MODEL}/runs/{slug(EVIL_RUN)}"]
        + [f"{MODEL}/runs/ci-002/{entry}/{COMPARE_HTML}" for entry in ("square", "thin")]
    )
    assert not (site / MODEL / "runs" / "ci-002" / "_reruns").exists()  # a gate's re-runs are no entry
    index_text = (site / INDEX_HTML).read_text()
    for reason in skipped.values():
        assert html.escape(reason) in index_text
    check_one_plotly(site)
    assert check_links(site) > 0


def test_synthetic_site_shows_the_gate_result_and_the_regression(synthetic_site):
    root, site, _ = synthetic_site
    gate = json.loads((root / MODEL / "ci-002" / GATE_JSON).read_text())
    latest = {row["series"]: row for row in table(site / MODEL / INDEX_HTML, "Latest result of each series")}
    for entry in ("square", "thin"):
        outcomes = [case["outcome"] for case in gate["cases"] if case["run"] == entry]
        counts = ", ".join(f"{outcomes.count(o)} {o}" for o in ("PASS", "REGRESSION", "INCONCLUSIVE", "IMPROVEMENT") if o in outcomes)
        assert latest[entry]["gate"] == f"{gate['verdict']} (exit {gate['exit_code']}): {counts}"
        assert latest[entry]["latest run"] == "ci-002" and latest[entry]["compare"] == "vs ci-001"
    assert gate["verdict"] == "REGRESSION" and latest[EVIL_RUN]["gate"] == "not gated"
    assert latest[EVIL_RUN]["note"] == "fake timer: not GPU measurements"
    assert (site / MODEL / "runs" / "ci-002" / GATE_JSON).read_bytes() == (root / MODEL / "ci-002" / GATE_JSON).read_bytes()

    cases = table(site / MODEL / "runs" / "ci-002" / "square" / COMPARE_HTML, "REGRESSION (exit 1): 4 cases on FP8/BF16 speedups measured in the same run (2 pass, 2 regression)")
    outcomes = {row["case"]: row["outcome"] for row in cases}
    assert outcomes == {
        f"matmul/{shape.name}/tensorwise/cublas/e4m3-tensorwise/accum-{accum}": "REGRESSION" if accum == "on" else "PASS"
        for shape in SHAPES
        for accum in ("on", "off")
    }


def test_synthetic_history_says_what_it_could_not_plot(synthetic_site):
    _, site, _ = synthetic_site
    text = (site / MODEL / HISTORY_HTML).read_text()
    assert "not plotted, no start time recorded: ci-001" in text  # thin's first run
    assert text.count("One run so far") == 2  # thin (one timed run) and the hostile single run


def test_strings_from_result_files_and_folder_names_are_escaped(synthetic_site):
    _, site, _ = synthetic_site
    for page in site_pages(site):
        text = page.read_text(encoding="utf-8")
        assert "<script>document.title" not in text and "<img src=x" not in text and "<no triton>" not in text, page
        scripts = parse_html(text).find_all("script")
        assert all("pwned" not in s.text() or "\\u003c" in s.text() for s in scripts), page
    model_index = (site / MODEL / INDEX_HTML).read_text()
    assert html.escape(EVIL_RUN) in model_index
    assert html.escape(EVIL_CASE) in (site / MODEL / "runs" / "ci-002" / "square" / COMPARE_HTML).read_text()
    assert slug(EVIL_RUN).startswith("img-src-x-onerror-document-title-pwned-")


@pytest.mark.browser
def test_synthetic_site_renders_every_chart_without_errors(synthetic_site):
    root, site, _ = synthetic_site
    check_in_browser(root, site)


def test_synthetic_site_embeds_every_chart_its_rows_call_for(synthetic_site):
    root, site, _ = synthetic_site
    assert check_embedded_graphs(root, site) > 0


# --- incremental builds ---


def test_a_second_build_rebuilds_only_what_changed(tmp_path):
    root = tmp_path / "reports"
    write_synthetic_tree(root)
    site = tmp_path / "site"
    first = publish(root, site)
    stamps = {p: p.stat().st_mtime_ns for p in site.rglob("*") if p.is_file()}
    second = publish(root, site)
    assert second.rebuilt == () and sorted(second.unchanged) == sorted(first.rebuilt)
    # what is built per entry run; the pages over many runs (indexes, history) are rewritten every time
    run_pages = [p for p in stamps if p.parent.parent.name in ("ci-001", "ci-002") or p.parent.name == slug(EVIL_RUN)]
    assert run_pages and all(p.stat().st_mtime_ns == stamps[p] for p in run_pages)

    (root / MODEL / "ci-001" / "square" / "results.csv").unlink()
    write_run(root / MODEL / "ci-001" / "square", "2026-01-01T10:00:00+00:00", seed=7, command=CI_COMMAND)  # other measurements
    third = publish(root, site)
    assert sorted(third.rebuilt) == [f"{MODEL}/runs/ci-001/square", f"{MODEL}/runs/ci-002/square/{COMPARE_HTML}"]
    assert (site / MODEL / "runs" / "ci-001" / "square" / "results.csv").read_bytes() == (root / MODEL / "ci-001" / "square" / "results.csv").read_bytes()
    untouched = site / MODEL / "runs" / "ci-002" / "thin" / page_name(Granularity.TENSORWISE)
    assert untouched.stat().st_mtime_ns == stamps[untouched]

    shutil.rmtree(root / MODEL / "ci-001")
    fourth = publish(root, site)
    assert fourth.rebuilt == ()
    assert not (site / MODEL / "runs" / "ci-001").exists()
    assert not (site / MODEL / "runs" / "ci-002" / "square" / COMPARE_HTML).exists()  # no previous run left
    manifest = json.loads((site / MANIFEST_JSON).read_text())
    assert not any("ci-001" in key for key in manifest["pages"])
    assert check_links(site) > 0


def test_changed_rendering_code_rebuilds_everything(tmp_path):
    root = tmp_path / "reports"
    write_run(root / MODEL / "only", "2026-01-01T10:00:00+00:00", seed=1)
    site = tmp_path / "site"
    publish(root, site)
    manifest = json.loads((site / MANIFEST_JSON).read_text())
    (site / MANIFEST_JSON).write_text(json.dumps({**manifest, "code": "from an older fp8bench"}))
    assert publish(root, site).rebuilt == (f"{MODEL}/runs/only",)


# --- bad input ---


def cli(*args: str):
    return CliRunner().invoke(app, ["publish", *map(str, args)], env={"COLUMNS": "1000"})


def test_cli_publishes_and_lists_what_it_skipped(tmp_path):
    root = tmp_path / "reports"
    write_synthetic_tree(root)
    result = cli(root, "--out", tmp_path / "site")
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "empty-model: holds no run folders" in result.output
    # 5 entry runs (2 CI runs of 2 entries, 1 single run) and the 2 compare pages of the second CI run
    assert "7 run folders and compare pages built, 0 unchanged" in result.output


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (lambda root: root.mkdir(), "no runs under"),
        (lambda root: (root / "h100-sxm" / "nothing-here").mkdir(parents=True), "holds no results.csv, nor entry folders"),
        (lambda root: None, "is not a folder"),
        (lambda root: write_run(root, None, seed=1), "is a single run; publish takes the tree above it"),
    ],
    ids=["empty", "no-results", "missing", "single-run"],
)
def test_a_tree_without_runs_is_a_clear_error(tmp_path, layout, message):
    root = tmp_path / "reports"
    layout(root)
    result = cli(root, "--out", tmp_path / "site")
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "site").exists()


def _tree_of_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_publish_into_a_users_folder_is_refused_and_deletes_nothing(tmp_path):
    """A folder of the user's with a manifest.json, css/ and img/ of its own and an index.html:
    refused before anything is written, every file as it was."""
    root = tmp_path / "reports"
    write_run(root / MODEL / "only", None, seed=1)
    users = tmp_path / "my-site"
    for name, text in {"manifest.json": '{"format": 1, "code": "x", "pages": {}}', "index.html": "<p>mine</p>",
                       "css/site.css": "p {}", "img/logo.svg": "<svg/>", MODEL + "/notes.txt": "mine too"}.items():
        (users / name).parent.mkdir(parents=True, exist_ok=True)
        (users / name).write_text(text)
    before = _tree_of_files(users)
    result = cli(root, "--out", users)
    assert result.exit_code == 2, result.output
    assert f"{users} holds files and no {MANIFEST_JSON}, so fp8bench publish did not make it" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert _tree_of_files(users) == before


def test_a_site_build_deletes_only_files_it_wrote(tmp_path):
    """Files a user puts into a published site stay, however the tree changes; an emptied folder of the
    site's goes, one holding the user's file stays."""
    root = tmp_path / "reports"
    write_run(root / MODEL / "a", "2026-01-01T10:00:00+00:00", seed=1)
    write_run(root / MODEL / "b", "2026-01-02T10:00:00+00:00", seed=2)
    site = tmp_path / "site"
    publish(root, site)
    (site / "extra.txt").write_text("user's")
    (site / MODEL / "runs" / "a" / "my-notes.txt").write_text("user's")
    shutil.rmtree(root / MODEL / "b")
    shutil.rmtree(root / MODEL / "a")
    write_run(root / MODEL / "c", "2026-01-03T10:00:00+00:00", seed=3)
    publish(root, site)
    assert (site / "extra.txt").read_text() == "user's"
    assert os.listdir(site / MODEL / "runs" / "a") == ["my-notes.txt"]  # the site's own pages of `a` are gone
    assert not (site / MODEL / "runs" / "b").exists() and (site / MODEL / "runs" / "c" / INDEX_HTML).is_file()


def test_a_manifest_listing_a_file_outside_the_site_deletes_nothing(tmp_path):
    root = tmp_path / "reports"
    write_run(root / MODEL / "a", "2026-01-01T10:00:00+00:00", seed=1)
    site = tmp_path / "site"
    publish(root, site)
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's")
    manifest = json.loads((site / MANIFEST_JSON).read_text())
    (site / MANIFEST_JSON).write_text(json.dumps({**manifest, "files": [*manifest["files"], "../precious.txt"]}))
    result = cli(root, "--out", site)
    assert result.exit_code == 2 and "lists '../precious.txt', not a file inside the site" in result.output
    assert precious.read_text() == "the user's"


def test_an_interrupted_first_publish_is_finished_by_the_next(tmp_path, monkeypatch):
    import fp8bench.publish.site as site_module

    root = tmp_path / "reports"
    write_run(root / MODEL / "a", "2026-01-01T10:00:00+00:00", seed=1)
    write_run(root / MODEL / "b", "2026-01-02T10:00:00+00:00", seed=2)
    site = tmp_path / "site"
    real = site_module.write_reports
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(site_module, "write_reports", interrupted)
    with pytest.raises(KeyboardInterrupt):
        publish(root, site, jobs=1)  # in this process, where the stand-in is
    monkeypatch.setattr(site_module, "write_reports", real)
    result = cli(root, "--out", site)
    assert result.exit_code == 0, result.output
    assert "3 run folders and compare pages built" in result.output  # b re-ran a's command: b against a too
    assert {p.name for p in (site / MODEL / "runs").iterdir()} == {"a", "b"}
    written = set(json.loads((site / MANIFEST_JSON).read_text())["files"])
    assert written == {str(p.relative_to(site)) for p in site.rglob("*") if p.is_file() and p.name != MANIFEST_JSON}


def test_a_malformed_results_file_fails_publish_with_exit_2_and_writes_nothing(tmp_path):
    root = tmp_path / "reports"
    write_run(root / MODEL / "good", None, seed=1)
    (root / MODEL / "broken").mkdir()
    (root / MODEL / "broken" / "results.csv").write_text("benchmark,case\nmatmul,x\n")
    result = cli(root, "--out", tmp_path / "site")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {root / MODEL / 'broken' / 'results.csv'}: does not follow the result schema: missing column(s) "
        "M, K, N, granularity, backend, recipe, fast_accum, options, status, median_ms, repeats, repeat_ms, timer"
    )
    assert not (tmp_path / "site").exists()


def test_a_malformed_gate_json_is_shown_not_fatal(tmp_path):
    root = tmp_path / "reports"
    write_run(root / MODEL / "ci" / "square", "2026-01-01T10:00:00+00:00", seed=1)
    (root / MODEL / "ci" / GATE_JSON).write_text('{"verdict": "MAYBE", "cases": []}')
    publish(root, tmp_path / "site")
    (row,) = table(tmp_path / "site" / MODEL / INDEX_HTML, "Latest result of each series")
    assert row["gate"].startswith(f"{GATE_JSON} unreadable:") and "MAYBE" in row["gate"]


def test_a_site_inside_the_reports_tree_is_not_read_as_runs(tmp_path):
    root = tmp_path / "reports"
    write_run(root / MODEL / "only", "2026-01-01T10:00:00+00:00", seed=1)
    publish(root, root / "site")
    again = publish(root, root / "site")
    assert again.skipped == () and again.unchanged == (f"{MODEL}/runs/only",)


# --- history by benchmark identity ---

SQUARE_COMMAND = "fp8bench matmul --shape-gen square --granularity all --backend cublas --out /runs/{} {}"


def write_history_tree(root: Path) -> Path:
    """One command re-run into three differently named folders (the newest a demo), and a suite entry
    run twice, once as `fp8bench run --only` into a folder of its own."""
    model = root / MODEL
    for folder, started, extra, purpose in (
        ("matmul-square", "2026-02-01T10:00:00+00:00", "", None),
        ("square-again-run2", "2026-02-02T10:00:00+00:00", "--resume", None),
        ("square-slowed-on-purpose", "2026-02-03T10:00:00+00:00", "", "demo"),
    ):
        keys = {"purpose": purpose} if purpose else {}
        # options in another order on the second run: the same measurement
        command = SQUARE_COMMAND.format(folder, extra)
        if extra:
            command = f"fp8bench matmul --backend cublas --out /elsewhere/{folder} --granularity all --shape-gen square {extra}"
        write_run(model / folder, started, seed=len(folder), command=command, **keys)
    write_run(model / "ci-a" / "square-4096", "2026-02-01T11:00:00+00:00", seed=7, command="fp8bench run suites/ci.toml --out /x")
    write_run(model / "roofline-only", "2026-02-02T11:00:00+00:00", seed=8, command="fp8bench run suites/ci.toml --only square-4096 --out /y")
    return model


@pytest.mark.parametrize(
    ("entry", "in_suite", "metadata", "series"),
    [
        ("any", False, {"command": "fp8bench matmul --out /a/b --resume --shape-gen llama --backend bf16 --backend cublas"},
         "matmul --backend bf16 --backend cublas --shape-gen llama"),
        ("any", False, {"command": "/venv/bin/fp8bench roofline --no-measure --gpu h100-sxm --out=/x"}, "roofline --gpu h100-sxm --no-measure"),
        ("square-4096", True, {"command": "fp8bench gate --suite suites/ci.toml --baseline main --json /x.json"}, "square-4096"),
        ("any", False, {"command": "fp8bench run suites/roofline.toml --only roofline-8192 --resume --out /x"}, "roofline-8192"),
        ("fast", True, {"command": "kernels/bench/gemm_sweep.py gluon --out /x"}, "kernels/bench/gemm_sweep.py gluon: fast"),
        ("any", False, {"command": "fp8bench matmul", "suite_entry": "square-4096"}, "square-4096"),
        ("folder-name", False, {}, "folder-name"),
        ("square-4096", True, {}, "square-4096"),
    ],
)  # fmt: skip
def test_a_runs_series_is_its_benchmark_identity(entry, in_suite, metadata, series):
    assert series_of("folder-name", entry, in_suite, metadata) == series


def test_reruns_in_differently_named_folders_are_one_series_and_a_demo_is_never_latest(tmp_path):
    root = tmp_path / "reports"
    write_history_tree(root)
    history = read_tree(root).history(MODEL)
    square = "matmul --backend cublas --granularity all --shape-gen square"
    assert {name: [e.run for e in entries] for name, entries in history.items()} == {
        square: ["matmul-square", "square-again-run2", "square-slowed-on-purpose"],
        "square-4096": ["ci-a", "roofline-only"],
    }
    assert latest(history[square]).run == "square-again-run2"  # the newer demo is not the latest result
    assert latest(history["square-4096"]).run == "roofline-only"

    site = tmp_path / "site"
    publish(root, site)
    latest_rows = table(site / MODEL / INDEX_HTML, "Latest result of each series")
    assert [(row["series"], row["latest run"], row["history"]) for row in latest_rows] == [
        (square, "square-again-run2", "3 runs"),
        ("square-4096", "roofline-only", "2 runs"),
    ]
    history_page = site / MODEL / HISTORY_HTML
    drawn = {graph.div_id: graph for graph in embedded_graphs(history_page.read_text(encoding="utf-8"))}
    assert sum(trace.points for trace in drawn[f"history-{slug(square)}-chart"].traces) == 6  # 3 runs x 2 series
    traces = history_chart(square, history[square]).figure.data
    lines = [trace for trace in traces if trace.marker.symbol == "circle"]
    demos = [trace for trace in traces if trace.marker.symbol == "circle-open"]
    # a line per backend and accumulation through the two measurements; the demo as open markers beside it
    assert sorted(len(trace.x) for trace in lines) == [2, 2]
    assert sorted(len(trace.x) for trace in demos) == [1, 1]
    purposes = [row["purpose"] for row in table(history_page, square)]
    assert purposes == ["demo", "measurement", "measurement"]  # newest first
    # the index links each series to a page of its own: the same chart and runs
    index_links = [a.attrs["href"] for a in parse_html((site / MODEL / INDEX_HTML).read_text(encoding="utf-8")).find_all("a")]
    own_page = site / series_history_path(MODEL, square)
    assert posixpath.relpath(own_page, site / MODEL) in index_links
    assert [row["run"] for row in table(own_page, square)] == ["square-slowed-on-purpose", "square-again-run2", "matmul-square"]
    drawn_alone = {graph.div_id: graph for graph in embedded_graphs(own_page.read_text(encoding="utf-8"))}
    assert sum(trace.points for trace in drawn_alone[f"history-{slug(square)}-chart"].traces) == 6


def test_an_unknown_purpose_is_a_malformed_file(tmp_path):
    root = tmp_path / "reports"
    write_run(root / MODEL / "run", None, seed=1, purpose="showcase")
    result = cli(root, "--out", tmp_path / "site")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {root / MODEL / 'run' / 'metadata.json'}: purpose is a string ('showcase'); expected one of demo, probe"
    )


def test_the_committed_gate_demo_is_in_history_but_never_latest(committed_site):
    tree = read_tree(COMMITTED_REPORTS)
    history = tree.history("h100-sxm")
    for entry in ("square-4096", "llama3-8b-w2-M8192"):
        runs = [e.run for e in history[entry]]
        assert "ci-quick-gate-slowed" in runs
        assert latest(history[entry]).run != "ci-quick-gate-slowed"
