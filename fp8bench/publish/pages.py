"""The site's own pages (fp8bench.publish.site): the GPU models, a GPU model's latest runs, history
charts, a suite run's entries, and compare pages. Built on the report skeleton (fp8bench.report.html);
every string from a result file or a folder name is escaped, and every link is relative to the page.
"""

from __future__ import annotations

import hashlib
import html
import posixpath
from collections.abc import Iterable

import pandas as pd
import plotly.express as px
from scipy.stats import gmean

from fp8bench.gate.baseline import IncompatibleBaseline
from fp8bench.gate.compare import GateConfig
from fp8bench.gate.output import case_cells, columns, coverage_line, geomean_line, headline, sorted_cases
from fp8bench.config import Granularity, Status
from fp8bench.gate.gate import compare_trees
from fp8bench.harness.validate import MalformedFile, UsageError
from fp8bench.publish.tree import COMPARE_HTML, GATE_JSON, HISTORY_HTML, EntryRun, Run, Tree, latest, slug
from fp8bench.report.write import INDEX_HTML, headline_cells, status_counts
from fp8bench.report.html import Chart, colour_map, page, rows_table

SERIES_HISTORY_DIR = "history"  # a GPU model's folder of one page per series
_MAX_PAGE_NAME = 96  # characters of a series page's file name (file systems take 255 bytes)
SERIES = ("benchmark", "granularity", "backend", "fast_accum")  # a line of a history chart
_SITE = posixpath.curdir
_GEOMEAN_NOTE = (
    "Geometric mean of speedup_vs_bf16 (BF16 time / FP8 time, same shape, same run) over the ok FP8 rows "
    "of each granularity, backend and fast-accumulation setting; the number of rows in parentheses."
)
_HISTORY_NOTE = (
    "x: the run's start time (metadata started_utc); y: the geometric mean of the FP8 speedup over BF16 "
    "of the run's ok rows of one series. Where the rows that ran differ between runs (see `rows` in the "
    "hover), two points are not like for like. Open markers: demo or probe runs (metadata `purpose`), "
    "never a series' latest result."
)


# ---- links and tables -------------------------------------------------------------------------


def _href(from_dir: str, to: str) -> str:
    """A link from a page in site folder `from_dir` to the site path `to`."""
    return posixpath.relpath(to, from_dir)


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def _link_table(frame: pd.DataFrame) -> str:
    """A table whose cells are HTML already (escaped text and links)."""
    if frame.empty:
        return '<p class="note">none</p>'
    return f'<div class="scroll">{frame.to_html(escape=False, index=False, border=0, classes="links", na_rep="")}</div>'


def _nav(from_dir: str, model: str | None) -> str:
    links = [_link(_href(from_dir, INDEX_HTML), "all GPU models")]
    if model is not None:
        links += [
            _link(_href(from_dir, f"{slug(model)}/{INDEX_HTML}"), f"{model}: latest runs"),
            _link(_href(from_dir, f"{slug(model)}/{HISTORY_HTML}"), f"{model}: history"),
        ]
    return f"<nav>{' | '.join(links)}</nav>"


def _time(started: pd.Timestamp | None) -> str:
    return started.strftime("%Y-%m-%d %H:%M UTC") if started is not None else "not recorded"


def _entry_link(from_dir: str, entry: EntryRun, text: str) -> str:
    return _link(_href(from_dir, f"{entry.site_dir}/{INDEX_HTML}"), text)


def _compare_link(from_dir: str, entry: EntryRun, previous: EntryRun | None) -> str:
    if previous is None:
        return "first run"
    return _link(_href(from_dir, f"{entry.site_dir}/{COMPARE_HTML}"), f"vs {previous.run}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _history_id(series: str) -> str:
    return f"history-{slug(series)}"


def measurement_note(entry: EntryRun) -> str:
    """Why an entry's numbers may not be GPU measurements of a known GPU ("" when they are)."""
    if (entry.rows["timer"] == "fake").any():
        return "fake timer: not GPU measurements"
    if not entry.metadata.get("gpu_name"):
        return "no GPU recorded"
    return ""


def _previous(tree: Tree, model: str) -> dict[int, EntryRun | None]:
    """Each entry run's predecessor among the model's runs of the same series (by id of the entry run)."""
    previous: dict[int, EntryRun | None] = {}
    for entries in tree.history(model).values():
        for before, entry in zip([None, *entries], entries):
            previous[id(entry)] = before
    return previous


# ---- geomean speedups ---------------------------------------------------------------------------


def geomean_speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """Per series (SERIES), the geometric mean of the FP8 speedups over its ok rows, and their count."""
    fp8 = rows[
        (rows["status"] == Status.OK.value)
        & (rows["granularity"] != Granularity.NONE.value)
        & (rows["speedup_vs_bf16"] > 0)
    ]
    grouped = fp8.groupby(list(SERIES), sort=False)["speedup_vs_bf16"]
    return grouped.agg(geomean=gmean, rows="size").reset_index()


def _accumulation(fast_accum: str) -> str:
    return "fast accumulation " + ("n/a" if fast_accum == "n/a" else fast_accum)


def _series_label(row: pd.Series) -> str:
    accum = "na" if row["fast_accum"] == "n/a" else row["fast_accum"]
    return f"{row['benchmark']}/{row['granularity']}/{row['backend']}/accum-{accum}"


def _geomean_table(entries: Iterable[EntryRun]) -> str:
    """The latest results' geomeans: a row per series and granularity, a column per backend and accumulation."""
    frames = []
    for entry in entries:
        speedups = geomean_speedups(entry.rows)
        speedups.insert(0, "series", entry.series)
        frames.append(speedups)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if table.empty:
        return '<p class="note">no FP8 speedups in these runs (no ok FP8 row with a BF16 reference)</p>'
    order = {g.value: i for i, g in enumerate(Granularity)}
    table["column"] = table["backend"] + ", accum " + table["fast_accum"]
    table["cell"] = [f"{g:.3f}x ({n})" for g, n in zip(table["geomean"], table["rows"])]
    table["order"] = table["granularity"].map(order)
    wide = table.pivot_table(index=["series", "benchmark", "order", "granularity"], columns="column", values="cell", aggfunc="first")
    wide = wide.reset_index().drop(columns="order").fillna("")
    wide.columns.name = None
    return f'<p class="note">{html.escape(_GEOMEAN_NOTE)}</p>' + rows_table(wide, ("series", "benchmark", "granularity"))


# ---- pages ----------------------------------------------------------------------------------------


# The benchmarks whose current headline the site's root shows, in this order.
HEADLINE_BENCHMARKS = ("matmul", "cast", "roofline", "e2e", "numerics")


def current_runs(tree: Tree, model: str) -> dict[str, EntryRun]:
    """Per benchmark (HEADLINE_BENCHMARKS) the model's most recently started entry run holding ok rows of
    it, among those measured on a recorded GPU (measurement_note empty)."""
    current: dict[str, EntryRun] = {}
    for entries in tree.history(model).values():
        for entry in entries:
            if measurement_note(entry) or not entry.can_be_latest:  # no GPU measurement, or a demo or probe
                continue
            ok = entry.rows[entry.rows["status"] == Status.OK.value]
            for benchmark in set(ok["benchmark"]) & set(HEADLINE_BENCHMARKS):
                if benchmark not in current or entry.order > current[benchmark].order:
                    current[benchmark] = entry
    return {b: current[b] for b in HEADLINE_BENCHMARKS if b in current}


def _headline_row(benchmark: str, entry: EntryRun) -> dict[str, str]:
    """A benchmark's row of the site root: its current run's headline per granularity (numerics: a
    link to its own page, whose headline is a table), the run, GPU and start."""
    row = {"benchmark": html.escape(benchmark)}
    if benchmark == "numerics":
        row["headline"] = _link(f"{entry.site_dir}/numerics.html", "loss gap to BF16 per recipe")
    else:
        cells = headline_cells(entry.rows[entry.rows["benchmark"] == benchmark])
        row["headline"] = "<br>".join(html.escape(f"{g}: {t}") for g, t in zip(cells["granularity"], cells["text"]))
    row["run"] = _link(f"{entry.site_dir}/{INDEX_HTML}", entry.entry if entry.in_suite else entry.run)
    row["started"] = html.escape(_time(entry.started))
    return row


def site_index(tree: Tree) -> str:
    """Per GPU model, the headline of each benchmark's current run (current_runs) with links; folders
    that hold no run in a footnote."""
    sections = []
    for model, runs in tree.models.items():
        rows = [_headline_row(benchmark, entry) for benchmark, entry in current_runs(tree, model).items()]
        links = " | ".join([
            _link(f"{slug(model)}/{INDEX_HTML}", f"all {_count(len(runs), 'run')}"), _link(f"{slug(model)}/{HISTORY_HTML}", "history"),
        ])  # fmt: skip
        table = _link_table(pd.DataFrame(rows)) if rows else '<p class="note">no run measured on a recorded GPU</p>'
        gpus = sorted({str(e.metadata.get("gpu_name") or "no GPU recorded") for run in runs for e in run.entries})
        sections.append(f"<h2>{html.escape(model)}</h2><p>{html.escape(', '.join(gpus))}: {links}</p>{table}")
    note = (
        '<p class="note">Each benchmark\'s latest run on the GPU model; per scaling granularity the geometric mean '
        "over the run's cases of each backend's best FP8 result (speedup over BF16 in the same run; cast: GB/s), "
        "and ours (triton) against the best reference.</p>"
    )
    body = note + ("".join(sections) or '<p class="note">no runs</p>')
    return page("fp8bench results: the latest headline per GPU model", body + _skipped_footnote(tree), plotly=False)


def _skipped_footnote(tree: Tree, under: str | None = None) -> str:
    """The folders (under `under`, a GPU model, if given) that hold no run (notes, probes, logs), as a
    footnote: one line, names and reasons in a collapsed list."""
    skipped = [s for s in tree.skipped if under is None or s.path.is_relative_to(tree.root / under)]
    if not skipped:
        return ""
    items = "".join(f"<li>{html.escape(str(s.path.relative_to(tree.root)))}: {html.escape(s.reason)}</li>" for s in skipped)
    return (
        f'<footer class="note"><details><summary>Not shown: {_count(len(skipped), "folder")} under the reports '
        f"root without a run (notes, probes, logs)</summary><ul>{items}</ul></details></footer>"
    )


def model_index(tree: Tree, model: str) -> str:
    here = slug(model)
    history = tree.history(model)
    previous = _previous(tree, model)
    latest_results = [entry for entry in map(latest, history.values()) if entry is not None]
    runs_by_name = {run.name: run for run in tree.models[model]}
    latest_rows = [
        {
            "series": html.escape(entry.series),
            "latest run": _entry_link(here, entry, entry.run),
            "started": _time(entry.started),
            "GPU": html.escape(str(entry.metadata.get("gpu_name") or "not recorded")),
            "rows": html.escape(status_counts(entry.rows)),
            "gate": html.escape(runs_by_name[entry.run].gate_status(entry)),
            "compare": _compare_link(here, entry, previous[id(entry)]),
            "history": _link(_href(slug(model), series_history_path(model, entry.series)), _count(len(history[entry.series]), "run")),
            "note": html.escape(measurement_note(entry)),
        }
        for entry in latest_results
    ]
    run_rows = [
        {
            "run": _link(_href(here, f"{run.site_dir}/{INDEX_HTML}"), run.name),
            "started": _time(run.started),
            "entries": ", ".join(_entry_link(here, e, e.entry) for e in run.entries) if run.is_suite else "a single run",
            "gate": html.escape(run.gate_status()),
        }
        for run in tree.models[model]
    ]
    body = (
        f"{_nav(here, model)}<h2>Latest result of each series</h2>"
        '<p class="note">A series is a benchmark that repeats from run to run: a suite entry, or a command with '
        "the options that change what it measures, whatever folder each run was written to; its latest "
        "result is its newest run that is not a demo or probe. Gate: the run's gate.json from fp8bench "
        "gate --json, if it has one.</p>"
        f"{_link_table(pd.DataFrame(latest_rows))}"
        f"<h2>Geomean speedup over BF16 of the latest results</h2>{_geomean_table(latest_results)}"
        f"<h2>All runs, newest first</h2>{_link_table(pd.DataFrame(run_rows))}"
        f"{_skipped_footnote(tree, model)}"
    )
    return page(f"{model}: fp8bench results", body, plotly=False)


def history_chart(name: str, entries: list[EntryRun]) -> Chart | None:
    """Geomean speedup per series against run start time; None when no run has a speedup to plot."""
    points = []
    for entry in entries:
        if entry.started is None:
            continue
        for _, row in geomean_speedups(entry.rows).iterrows():
            points.append(
                {
                    "started": entry.started,
                    "speedup": row["geomean"],
                    "rows": row["rows"],
                    # plotly renders HTML in labels: escaped before they reach it
                    "series": html.escape(_series_label(row)),
                    "backend": html.escape(row["backend"]),
                    "granularity": html.escape(row["granularity"]),
                    "accumulation": html.escape(_accumulation(row["fast_accum"])),
                    "run": html.escape(entry.run),
                    "purpose": entry.purpose or "measurement",
                }
            )
    if not points:
        return None
    frame = pd.DataFrame(points).sort_values("started", kind="stable")
    # a panel per granularity, a backend's own colour on every page, the accumulation as the dash
    figure = px.line(
        frame, x="started", y="speedup", color="backend", line_dash="accumulation", facet_col="granularity",
        color_discrete_map=colour_map(frame["backend"]), markers=True,
        # a demo or probe point is its own open marker, off the line through the measurements
        symbol="purpose", symbol_map={"measurement": "circle", "demo": "circle-open", "probe": "diamond-open"},
        hover_data={"series": True, "run": True, "rows": True, "speedup": ":.3f", "purpose": True},
        labels={"started": "run start (UTC)", "speedup": "geomean speedup over BF16"},
    )  # fmt: skip
    figure.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    figure.add_hline(y=1.0, line_dash="dot", annotation_text="BF16", annotation_position="top left")
    note = _HISTORY_NOTE
    if frame["started"].nunique() == 1:
        note += " One run so far: each series is a single point; a line needs a second run."
        # plotly would span a millisecond around a single time
        day = pd.Timedelta(days=1)
        figure.update_xaxes(range=[frame["started"].iloc[0] - day, frame["started"].iloc[0] + day])
    return Chart(f"{_history_id(name)}-chart", f"{name}: geomean speedup over BF16, run by run", figure, note)


def _series_section(tree: Tree, model: str, name: str, here: str, previous: dict[int, EntryRun | None]) -> tuple[list[str], bool]:
    """One series' heading (the anchor the index links to, there whether or not the series has a chart:
    cast runs have none), its chart and its runs, newest first; and whether it has a chart."""
    entries = tree.history(model)[name]
    parts = [f'<h2 id="{html.escape(_history_id(name))}">{html.escape(name)}</h2>']
    chart = history_chart(name, entries)
    untimed = [e.run for e in entries if e.started is None]
    if untimed:
        parts.append(f'<p class="note">not plotted, no start time recorded: {html.escape(", ".join(untimed))}</p>')
    parts.append(
        chart.to_html() if chart else '<p class="note">no FP8 speedups to plot (no ok FP8 row with a BF16 reference)</p>'
    )
    rows = [
        {
            "run": _entry_link(here, e, e.run),
            "started": _time(e.started),
            "rows": html.escape(status_counts(e.rows)),
            "purpose": html.escape(e.purpose or "measurement"),
            "compare": _compare_link(here, e, previous[id(e)]),
        }
        for e in reversed(entries)
    ]
    parts.append(_link_table(pd.DataFrame(rows)))
    return parts, chart is not None


def history_page(tree: Tree, model: str) -> str:
    """Every series of a GPU model on one page."""
    here = slug(model)
    previous = _previous(tree, model)
    parts = [_nav(here, model)]
    for name in tree.history(model):
        parts += _series_section(tree, model, name, here, previous)[0]
    return page(f"{model}: history", "\n".join(parts), plotly=True, plotly_dir="../")


def series_history_path(model: str, series: str) -> str:
    """A series' own history page, relative to the site root."""
    name = slug(series)
    if len(name) > _MAX_PAGE_NAME:  # a command-line series: its start and a hash of the whole name
        name = f"{name[:_MAX_PAGE_NAME - 9]}-{hashlib.sha256(series.encode()).hexdigest()[:8]}"
    return f"{slug(model)}/{SERIES_HISTORY_DIR}/{name}.html"


def series_history_page(tree: Tree, model: str, series: str) -> str:
    """One series' history on a page of its own: what the model index links to."""
    here = series_history_path(model, series).rpartition("/")[0]
    section, charted = _series_section(tree, model, series, here, _previous(tree, model))
    return page(f"{model}: {series}, history", "\n".join([_nav(here, model), *section]), plotly=charted, plotly_dir="../../")


def suite_run_page(tree: Tree, run: Run) -> str:
    here = str(run.site_dir)
    previous = _previous(tree, run.model)
    gate = html.escape(run.gate_status())
    if run.gate is not None:
        gate += f" ({_link(GATE_JSON, GATE_JSON)})"
    rows = [
        {
            "entry": _entry_link(here, e, e.entry),
            "started": _time(e.started),
            "rows": html.escape(status_counts(e.rows)),
            "gate": html.escape(run.gate_status(e)),
            "compare": _compare_link(here, e, previous[id(e)]),
            "note": html.escape(measurement_note(e)),
        }
        for e in run.entries
    ]
    body = f"{_nav(here, run.model)}<p>Gate: {gate}</p><h2>Entries</h2>{_link_table(pd.DataFrame(rows))}"
    return page(f"{run.name}: suite run on {run.model}", body, plotly=False)


def compare_page(previous: EntryRun, entry: EntryRun) -> str:
    """The entry against its previous run (fp8bench.gate.compare with the default thresholds)."""
    here = str(entry.site_dir)
    title = f"{entry.entry}: {previous.run} vs {entry.run}"
    config = GateConfig()
    thresholds = config.speedup.thresholds
    parts = [
        _nav(here, entry.model),
        f"<p>Baseline: {_entry_link(here, previous, previous.run)} (started {_time(previous.started)}); "
        f"new: {_entry_link(here, entry, entry.run)} (started {_time(entry.started)}).</p>",
        f'<p class="note">Gated metric: FP8/BF16 speedups of the same run, with the default thresholds of '
        f"docs/gating.md (floor {thresholds.floor_pct:g}%, k_sigma {thresholds.k_sigma:g}, alpha "
        f"{thresholds.alpha:g}, geomean floor {config.speedup.geomean_floor_pct:g}%); a suite's own [gate] "
        "table may set others.</p>",
    ]
    try:
        comparison = compare_trees(previous.source, entry.source, config)
    except (UsageError, IncompatibleBaseline, MalformedFile) as err:  # e.g. a case measured twice in one run
        parts.append(f'<p class="banner">not compared: {html.escape(str(err))}</p>')
        return page(title, "\n".join(parts), plotly=False)
    shown = columns(comparison)
    cases = pd.DataFrame([case_cells(c, comparison.metric)[-len(shown):] for c in sorted_cases(comparison)], columns=list(shown))
    parts += [
        f"<h2>{html.escape(headline(comparison))}</h2><p>{html.escape(geomean_line(comparison))}; "
        f"{html.escape(coverage_line(comparison))}</p>",
        "<p class=\"note\">slowdown = new cost / baseline cost - 1 (positive is worse)</p>",
        rows_table(cases, ("run", "case", "outcome")),
    ]
    if comparison.not_compared:
        reasons = pd.Series([s.reason for s in comparison.not_compared]).value_counts(sort=False)
        skipped = pd.DataFrame({"reason": reasons.index, "cases": reasons.to_numpy()})
        parts += [f"<h3>{len(comparison.not_compared)} cases not compared</h3>", rows_table(skipped, ("reason",))]
    parts += [f'<p class="note">note: {html.escape(note)}</p>' for note in comparison.notes]
    return page(title, "\n".join(parts), plotly=False)
