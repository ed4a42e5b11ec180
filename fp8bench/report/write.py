"""`fp8bench report`: a run's HTML pages, one per scaling granularity, and an index linking them.

Every page shows the run's FP8 rows of one granularity beside the BF16 reference rows (granularity
`none`), for each benchmark in the run: the benchmark's charts, then a table of all its rows, the
ones that did not run included, then the run's metadata. Charts come from `VIEWS`, one entry per
benchmark listing its chart builders; a new benchmark adds an entry there, not a branch here.
A benchmark whose view has `sections` (numerics: its curves span granularities and live in a file
beside results.csv) gets one page of its own, `<benchmark>.html`, instead of the granularity pages.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from fp8bench.report import cast as report_cast
from fp8bench.report import e2e as report_e2e
from fp8bench.report import matmul as report_matmul

from fp8bench.report import numerics as report_numerics

from fp8bench.report import roofline as report_roofline
from fp8bench.config import Granularity
from fp8bench.model.hardware import GPUS, GpuSpec
from fp8bench.report.html import Chart, metadata_table, page, rows_table, write_plotly_js
from fp8bench.harness.results import COLUMNS, METADATA_JSON, SCHEMA, RESULTS_CSV, load_results, read_metadata

INDEX_HTML = "index.html"
TIME_COLUMN = "median (spread)"
_SPREAD_NOTE = "Spread: " + next(c.doc for c in SCHEMA if c.name == "spread_pct") + "."
_TEXT_COLUMNS = ("benchmark", "case", "granularity", "backend", "recipe", "fast_accum", "options", "status", "timer")


class PagePart(Protocol):
    """A chart (fp8bench.report.html.Chart) or another part of a benchmark's section, as HTML."""

    def to_html(self) -> str: ...


# A chart builder takes one page's rows of its benchmark and the GPU model (None when unknown) and
# returns the charts (or other parts: a headline, a table) it can draw from them (none when the rows
# hold nothing for it).
ChartBuilder = Callable[[pd.DataFrame, "GpuSpec | None"], list[PagePart]]
# A section builder takes the run folder and the run's rows of its benchmark and returns the HTML
# sections of the benchmark's own page (charts included), from the folder's files.
SectionBuilder = Callable[[Path, pd.DataFrame], list[str]]


@dataclass(frozen=True)
class BenchmarkView:
    """How a benchmark's rows appear on a page."""

    charts: tuple[ChartBuilder, ...] = ()
    # Columns of the rows table (`status` among them; TIME_COLUMN follows it, standing in for
    # median_ms and spread_pct); None: every schema column that holds a value.
    table_columns: tuple[str, ...] | None = None
    # Set: the benchmark's rows get a page of their own built from these sections, not granularity pages.
    sections: SectionBuilder | None = None


VIEWS: dict[str, BenchmarkView] = {
    "matmul": BenchmarkView(
        charts=(report_matmul.speedup_chart, report_matmul.tflops_chart, report_matmul.speedup_heatmaps),
        table_columns=report_matmul.TABLE_COLUMNS,
    ),
    "cast": BenchmarkView(charts=report_cast.CHARTS, table_columns=report_cast.TABLE_COLUMNS),
    "roofline": BenchmarkView(charts=report_roofline.CHARTS, table_columns=report_roofline.TABLE_COLUMNS),
    "e2e": BenchmarkView(charts=report_e2e.VIEW, table_columns=report_e2e.TABLE_COLUMNS),
    report_numerics.BENCHMARK: BenchmarkView(sections=report_numerics.sections),
}


def page_name(granularity: Granularity) -> str:
    return "bf16.html" if granularity is Granularity.NONE else f"{granularity.value}.html"


def own_pages(rows: pd.DataFrame) -> list[str]:
    """The run's benchmarks that get a page of their own (a view with `sections`), in run order."""
    return [b for b in dict.fromkeys(rows["benchmark"]) if b in VIEWS and VIEWS[b].sections is not None]


# Files beside results.csv and metadata.json that pages are built from (numerics' step-wise curves).
DATA_FILES: tuple[str, ...] = (report_numerics.CURVES_CSV,)


def page_names(rows: pd.DataFrame) -> list[str]:
    """The pages write_reports writes for these rows, index first."""
    benchmarks = own_pages(rows)
    shared = rows[~rows["benchmark"].isin(benchmarks)]
    return [INDEX_HTML, *(page_name(g) for g in page_granularities(shared)), *(f"{b}.html" for b in benchmarks)]


def page_granularities(rows: pd.DataFrame) -> list[Granularity]:
    """The FP8 granularities in the run, in the usual order; only BF16 when the run has no FP8 row."""
    present = set(rows["granularity"])
    unknown = sorted(present - {g.value for g in Granularity})
    if unknown:
        raise ValueError(
            f"results hold granularities {unknown} that are none of: {', '.join(g.value for g in Granularity)}"
        )
    fp8 = [g for g in Granularity.fp8() if g.value in present]
    return fp8 or ([Granularity.NONE] if present else [])


def write_reports(run_dir: Path, plotly_dir: str | None = None) -> list[Path]:
    """Write index.html, one page per granularity and one per benchmark with a page of its own into the
    run folder; return their paths, index first.

    Chart pages load the folder's own copy of plotly.js, written here; with `plotly_dir` (a relative
    URL ending in `/`) they load the copy there instead, which the caller keeps (the site has one).

    Raises FileNotFoundError without a results.csv, MalformedFile (fp8bench.harness.validate) for a
    malformed results.csv or metadata.json, and ValueError for granularities no page shows.
    """
    run_dir = Path(run_dir)
    rows = load_results(run_dir)
    metadata = read_metadata(run_dir)
    page_granularities(rows)  # every row's granularity is a known one
    benchmarks = own_pages(rows)
    shared = rows[~rows["benchmark"].isin(benchmarks)]
    granularities = page_granularities(shared)
    navigation = _navigation(granularities, benchmarks)
    gpu = GPUS.get(str(metadata.get("gpu_spec")))
    if (granularities or benchmarks) and plotly_dir is None:
        write_plotly_js(run_dir)
    pages = []
    for granularity in granularities:
        path = run_dir / page_name(granularity)
        shown = shared[shared["granularity"].isin({granularity.value, Granularity.NONE.value})]
        text = _granularity_page(run_dir, granularity, navigation, shown, metadata, gpu, plotly_dir or "")
        path.write_text(text, encoding="utf-8")
        pages.append(path)
    for benchmark in benchmarks:
        path = run_dir / f"{benchmark}.html"
        text = _benchmark_page(run_dir, benchmark, navigation, rows[rows["benchmark"] == benchmark], metadata, plotly_dir or "")
        path.write_text(text, encoding="utf-8")
        pages.append(path)
    index = run_dir / INDEX_HTML
    index.write_text(_index_page(run_dir, granularities, benchmarks, rows, shared, metadata), encoding="utf-8")
    return [index, *pages]


def _granularity_page(
    run_dir: Path,
    granularity: Granularity,
    navigation: str,
    rows: pd.DataFrame,
    metadata: dict[str, Any],
    gpu: GpuSpec | None,
    plotly_dir: str,
) -> str:
    if granularity is Granularity.NONE:
        title = f"{run_dir.name}: BF16 reference"
    else:
        title = f"{run_dir.name}: {granularity.value} scaling against BF16"
    parts = [navigation, _measurement_warning(rows, metadata), _summary(rows, metadata)]
    charted = False
    for benchmark, benchmark_rows in rows.groupby("benchmark", sort=False):
        view = VIEWS.get(benchmark, BenchmarkView())
        parts.append(f"<h2>{html.escape(benchmark)}</h2>")
        charts = [chart for build in view.charts for chart in build(benchmark_rows, gpu)]
        parts.extend(chart.to_html() for chart in charts)
        charted = charted or any(isinstance(chart, Chart) for chart in charts)
        if not charts:
            parts.append('<p class="note">no charts for these rows; every row is in the table below</p>')
        parts.append(_rows_section(benchmark, benchmark_rows, view.table_columns))
    parts.append(f"<h2>Run metadata</h2>{metadata_table(metadata)}")
    return page(title, "\n".join(parts), plotly=charted, plotly_dir=plotly_dir)


def _benchmark_page(run_dir: Path, benchmark: str, navigation: str, rows: pd.DataFrame, metadata: dict[str, Any], plotly_dir: str) -> str:
    """A benchmark's own page: its view's sections of the whole run, then its rows and the metadata."""
    view = VIEWS[benchmark]
    parts = [navigation, _measurement_warning(rows, metadata), _summary(rows, metadata), f"<h2>{html.escape(benchmark)}</h2>"]
    parts.extend(view.sections(run_dir, rows))
    parts.append(_rows_section(benchmark, rows, view.table_columns))
    parts.append(f"<h2>Run metadata</h2>{metadata_table(metadata)}")
    return page(f"{run_dir.name}: {benchmark}", "\n".join(parts), plotly=True, plotly_dir=plotly_dir)


def _rows_section(benchmark: str, rows: pd.DataFrame, columns: tuple[str, ...] | None) -> str:
    return (
        f"<h3>All {html.escape(benchmark)} rows</h3><p class=\"note\">{html.escape(_SPREAD_NOTE)}</p>"
        f"{rows_table(table_frame(rows, columns), _TEXT_COLUMNS)}"
    )


def _index_page(
    run_dir: Path, granularities: list[Granularity], benchmarks: list[str], rows: pd.DataFrame, shared: pd.DataFrame, metadata: dict[str, Any]
) -> str:
    items = []
    for granularity in granularities:
        shown = shared[shared["granularity"].isin({granularity.value, Granularity.NONE.value})]
        label = "BF16 reference" if granularity is Granularity.NONE else f"{granularity.value} scaling"
        items.append(f'<li><a href="{page_name(granularity)}">{label}</a>: {html.escape(status_counts(shown))}</li>')
    for benchmark in benchmarks:
        shown = rows[rows["benchmark"] == benchmark]
        items.append(f'<li><a href="{benchmark}.html">{html.escape(benchmark)}</a>: {html.escape(status_counts(shown))}</li>')
    pages = f"<ul>{''.join(items)}</ul>" if items else '<p class="note">no result rows yet</p>'
    body = (
        f"{_measurement_warning(rows, metadata)}{_summary(rows, metadata)}<h2>Pages</h2>{pages}"
        f'<p>Data: <a href="{RESULTS_CSV}">{RESULTS_CSV}</a>, <a href="{METADATA_JSON}">{METADATA_JSON}</a></p>'
        f"<h2>Run metadata</h2>{metadata_table(metadata)}"
    )
    return page(f"{run_dir.name}: fp8bench report", body, plotly=False)


def table_frame(rows: pd.DataFrame, columns: tuple[str, ...] | None) -> pd.DataFrame:
    """The rows as the table shows them: the median and its repeat spread in one cell."""
    if columns is None:
        columns = tuple(
            c for c in COLUMNS if c not in ("median_ms", "spread_pct") and rows[c].replace("", pd.NA).notna().any()
        )
    # Built as a list, not by masked assignment: pandas 3.0 and 3.1 index a boolean mask differently.
    time = pd.Series(
        [
            "" if pd.isna(median) else f"{median:.4g} ms ({spread:.1f}%)" if pd.notna(spread) else f"{median:.4g} ms"
            for median, spread in zip(rows["median_ms"], rows["spread_pct"])
        ],
        index=rows.index,
        dtype=object,
    )
    table = rows[list(columns)].copy()
    table.insert(table.columns.get_loc("status") + 1, TIME_COLUMN, time)
    return table


def status_counts(rows: pd.DataFrame) -> str:
    """E.g. `12 ok, 2 unsupported, 1 failed`."""
    counts = rows["status"].str.split(":", n=1).str[0].str.strip().value_counts(sort=False)
    return ", ".join(f"{count} {status}" for status, count in counts.items()) or "no rows"


def _summary(rows: pd.DataFrame, metadata: dict[str, Any]) -> str:
    facts = {
        "GPU": metadata.get("gpu_name") or "not recorded",
        "started (UTC)": metadata.get("started_utc") or "not recorded",
        "command": metadata.get("command") or "not recorded",
        "rows": status_counts(rows),
    }
    items = "".join(f"<li>{html.escape(key)}: {html.escape(str(value))}</li>" for key, value in facts.items())
    return f"<ul class=\"summary\">{items}</ul>"


def _measurement_warning(rows: pd.DataFrame, metadata: dict[str, Any]) -> str:
    """A banner when the numbers are not GPU measurements (a fake timer) or name no GPU; a note for a
    run of predictions only, which measured nothing and names the GPU model it predicts for."""
    if (rows["timer"] == "fake").any():
        text = "Rows here were timed with the fake timer of the tests: they are not GPU measurements."
    elif metadata.get("prediction_only") and metadata.get("gpu_spec"):
        text = f"Predictions of the roofline model for {metadata['gpu_spec']}; nothing was measured in this run."
        return f'<p class="note">{html.escape(text)}</p>'
    elif not rows.empty and not metadata.get("gpu_name"):
        text = "The run's metadata names no GPU: these numbers cannot be attributed to a GPU."
    else:
        return ""
    return f'<p class="banner">{html.escape(text)}</p>'


def _navigation(granularities: list[Granularity], benchmarks: list[str]) -> str:
    links = [f'<a href="{INDEX_HTML}">index</a>'] + [
        f'<a href="{page_name(g)}">{"BF16" if g is Granularity.NONE else g.value}</a>' for g in granularities
    ] + [f'<a href="{b}.html">{html.escape(b)}</a>' for b in benchmarks]
    return f"<nav>{' | '.join(links)}</nav>"
