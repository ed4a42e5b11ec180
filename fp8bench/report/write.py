"""`fp8bench report`: a run's HTML pages, one per scaling granularity, and an index linking them.

The index opens with the run's answer (its headline): per benchmark and granularity, each backend's best
FP8 result per case (speedup over BF16; cast: GB/s) as a geomean and range over the cases, and ours
(triton, triton-compile) against the best reference; numerics its loss-gap table.

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

import numpy as np
import pandas as pd

from fp8bench.report import cast as report_cast
from fp8bench.report import e2e as report_e2e
from fp8bench.report import matmul as report_matmul

from fp8bench.report import numerics as report_numerics

from fp8bench.report import roofline as report_roofline
from fp8bench.config import Granularity, Status
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


# Files beside results.csv and metadata.json that pages are built from (numerics' step-wise curves and statistics).
DATA_FILES: tuple[str, ...] = report_numerics.DATA_FILES


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
        f"{_measurement_warning(rows, metadata)}{_headline_section(run_dir, rows, metadata)}"
        f"<h2>Pages</h2>{pages}{_summary(rows, metadata)}"
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
        models = metadata.get("gpu_specs") or [metadata["gpu_spec"]]  # several GPU models side by side
        text = f"Predictions of the roofline model for {', '.join(map(str, models))}; nothing was measured in this run."
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


# ---- headline: the run's answer, first on its index ----------------------------------------------

# Our implementations (fp8kernels: eager, compiled, with autotuned GEMM configs); every other FP8 backend is a reference.
OURS = ("triton", "triton-compile", "triton-tuned")
# Per benchmark, the column its headline compares (larger is better) and what it means.
HEADLINE_MEASURES: dict[str, tuple[str, str]] = {
    "matmul": ("speedup_vs_bf16", "GEMM speedup over BF16"),
    "roofline": ("speedup_vs_bf16", "layer step speedup over BF16 (measured)"),
    "e2e": ("speedup_vs_bf16", "training tokens/s speedup over BF16"),
    "cast": ("gbps", "quantize GB/s"),
}
# What makes two rows the same case: the schema's identity columns other than granularity, backend,
# recipe, fast-accum and options, over which a backend's best row is taken.
CASE_KEYS = ["case", "M", "K", "N", "world_size", "compile", "activation_checkpointing", "lm_head"]
HEADLINE_COLUMNS = ["benchmark", "granularity", "backend", "geomean", "low", "high", "cases"]


def best_per_case(rows: pd.DataFrame) -> pd.DataFrame:
    """Per benchmark with a headline measure, granularity, backend and case: the best value of the
    benchmark's measure over the backend's ok FP8 rows of that case (its recipes, fast-accum settings)."""
    frames = []
    for benchmark, (column, _) in HEADLINE_MEASURES.items():
        fp8 = rows[
            (rows["benchmark"] == benchmark)
            & (rows["status"] == Status.OK.value)
            & (rows["granularity"] != Granularity.NONE.value)
            & (pd.to_numeric(rows[column], errors="coerce") > 0)
        ]
        if fp8.empty:
            continue
        keys = ["granularity", "backend", *CASE_KEYS]
        best = fp8.assign(value=pd.to_numeric(fp8[column])).groupby(keys, sort=False, dropna=False)["value"].max()
        frames.append(best.reset_index().assign(benchmark=benchmark))
    if not frames:
        return pd.DataFrame(columns=["benchmark", "granularity", "backend", *CASE_KEYS, "value"])
    return pd.concat(frames, ignore_index=True)


def headline_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per benchmark, granularity and backend: the geometric mean, lowest and highest of its best value
    per case (best_per_case), and the number of cases; in run order."""
    best = best_per_case(rows)
    grouped = best.groupby(["benchmark", "granularity", "backend"], sort=False)["value"]
    table = grouped.agg(geomean=lambda v: float(np.exp(np.log(v).mean())), low="min", high="max", cases="size")
    return table.reset_index()[HEADLINE_COLUMNS]


@dataclass(frozen=True)
class Versus:
    """Ours against the best reference in one benchmark and granularity: each one's geomean, and the
    geomean over the cases both ran of ours' best over the reference's best."""

    benchmark: str
    granularity: str
    ours: str
    ours_geomean: float
    reference: str
    reference_geomean: float
    ratio: float
    cases: int


def ours_against_reference(rows: pd.DataFrame) -> list[Versus]:
    """Per benchmark and granularity where both ran: our best backend (by geomean) against the best
    reference backend (by geomean)."""
    best = best_per_case(rows)
    table = headline_table(rows)
    found = []
    for (benchmark, granularity), group in table.groupby(["benchmark", "granularity"], sort=False):
        ours = group[group["backend"].isin(OURS)]
        references = group[~group["backend"].isin(OURS)]
        if ours.empty or references.empty:
            continue
        our = ours.loc[ours["geomean"].idxmax()]
        reference = references.loc[references["geomean"].idxmax()]
        here = best[(best["benchmark"] == benchmark) & (best["granularity"] == granularity)]
        by_case = here.pivot_table(index=CASE_KEYS, columns="backend", values="value", dropna=False, aggfunc="first")
        paired = (by_case[our["backend"]] / by_case[reference["backend"]]).dropna()
        if paired.empty:
            continue
        found.append(Versus(
            benchmark, granularity, our["backend"], our["geomean"], reference["backend"], reference["geomean"],
            float(np.exp(np.log(paired).mean())), len(paired),
        ))  # fmt: skip
    return found


def _times(value: float) -> str:
    return f"{value:.2f}x"


def _value(benchmark: str, value: float) -> str:
    return f"{value:,.0f} GB/s" if HEADLINE_MEASURES[benchmark][0] == "gbps" else _times(value)


def _spread(benchmark: str, low: float, high: float, cases: int) -> str:
    """`1 case`, or the range over several: `0.97x to 1.99x, 8 cases`."""
    if cases == 1:
        return "1 case"
    return f"{_value(benchmark, low)} to {_value(benchmark, high)}, {cases} cases"


def headline_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """The run's answer, a short sentence per benchmark and granularity (columns benchmark, granularity,
    text): the best backend's geomean and range over the cases, and ours against the best reference."""
    table = headline_table(rows)
    versus = {(v.benchmark, v.granularity): v for v in ours_against_reference(rows)}
    cells = []
    for (benchmark, granularity), group in table.groupby(["benchmark", "granularity"], sort=False):
        top = group.loc[group["geomean"].idxmax()]
        text = f"best {top['backend']} {_value(benchmark, top['geomean'])} ({_spread(benchmark, top['low'], top['high'], top['cases'])})"
        v = versus.get((benchmark, granularity))
        if v is not None and v.ours != top["backend"]:
            text += f"; ours {v.ours} {_value(benchmark, v.ours_geomean)}, {_times(v.ratio)} {v.reference}'s"
        elif v is not None:
            text += f", {_times(v.ratio)} the best reference ({v.reference})"
        cells.append({"benchmark": benchmark, "granularity": granularity, "text": text})
    return pd.DataFrame(cells, columns=["benchmark", "granularity", "text"])


def _headline_section(run_dir: Path, rows: pd.DataFrame, metadata: dict[str, Any]) -> str:
    """The index's first section: GPU and date, a sentence per benchmark and granularity, and per
    benchmark with several backends a table of each one's geomean (range) by granularity; numerics'
    own headline table."""
    gpu = metadata.get("gpu_name") or "no GPU recorded"
    started = metadata.get("started_utc") or "start time not recorded"
    parts = [f'<p class="headline-facts">{html.escape(f"{gpu}, started {started}")}</p>']
    cells = headline_cells(rows)
    table = headline_table(rows)
    for benchmark, group in table.groupby("benchmark", sort=False):
        measure = f"{benchmark}: {HEADLINE_MEASURES[benchmark][1]}, geomean over the run's cases of each backend's best per case"
        lines = cells[cells["benchmark"] == benchmark]
        items = "".join(f"<li>{html.escape(f'{g}: {t}')}</li>" for g, t in zip(lines["granularity"], lines["text"]))
        parts.append(f'<h3>{html.escape(measure)}</h3><ul class="headline">{items}</ul>')
        if group["backend"].nunique() > 1:
            shown = group.assign(
                cell=[f"{_value(benchmark, g)} ({_spread(benchmark, lo, hi, n)})" for g, lo, hi, n in zip(group["geomean"], group["low"], group["high"], group["cases"])],
                backend=[f"{b} (ours)" if b in OURS else b for b in group["backend"]],
            )  # fmt: skip
            wide = shown.pivot_table(index="backend", columns="granularity", values="cell", aggfunc="first", sort=False)
            wide = wide.reset_index().fillna("")
            wide.columns.name = None
            parts.append(rows_table(wide, ("backend",)))
    if report_numerics.BENCHMARK in set(rows["benchmark"]):
        numerics = rows[rows["benchmark"] == report_numerics.BENCHMARK]
        found = report_numerics.headline(numerics, report_numerics.read_curves(run_dir))
        parts.append(f"<h3>numerics: loss gap to BF16 over the last 10% of steps</h3>{rows_table(found, report_numerics.TABLE_TEXT)}")
    if len(parts) == 1:
        parts.append('<p class="note">no measured FP8 result with a BF16 reference in this run; the pages below list every row</p>')
    return "<h2>Headline</h2>" + "".join(parts)
