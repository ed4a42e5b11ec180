"""HTML building blocks of every report page: the page skeleton, plotly.js once per folder, charts,
and escaped tables of rows and metadata.

Pages open from file:// with no network: each references one copy of `plotly.min.js`, its folder's
(a run's reports) or the site root's (fp8bench.publish.site).
Every string that came from a result file is escaped here (tables, metadata) or by the chart builders
(plotly renders a subset of HTML in labels, so labels are escaped before they reach it). The head of
every page carries a recorder of script errors that a headless browser check reads back
(tests/browser.py); the static site's pages use the same skeleton.
The benchmark views (fp8bench.report_*) share the data side of their charts from here too: the `ok`
rows with their repeat bounds, whiskers and their notes, run order, colours, chart ids and heights.
"""

from __future__ import annotations

import html
import math
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.colors
import plotly.express as px
import plotly.graph_objects as go
import plotly.offline

from fp8bench.config import Status
from fp8bench.harness.results import repeat_times

PLOTLY_JS = "plotly.min.js"
# The hidden element that holds the JSON list of script errors a page met while loading.
JS_ERRORS_ID = "js-errors"

# First in <head>, so it sees errors of everything after it: script errors through window.onerror,
# scripts or styles that failed to load through a capturing listener (those never reach onerror).
_ERROR_RECORDER = """<script>
(function () {
  var errors = [];
  function show() {
    var element = document.getElementById("%(id)s");
    if (element) element.textContent = JSON.stringify(errors);
  }
  function record(text) { errors.push(String(text)); show(); }
  window.onerror = function (message, source, line) { record(message + " (" + source + ":" + line + ")"); };
  window.addEventListener("error", function (event) {
    if (event.target !== window) record("failed to load " + (event.target.src || event.target.href));
  }, true);
  window.addEventListener("unhandledrejection", function (event) { record("unhandled rejection: " + event.reason); });
  document.addEventListener("DOMContentLoaded", show);
})();
</script>""" % {"id": JS_ERRORS_ID}

_STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; }
td.text, table.links td { text-align: left; }
tr.status-unsupported td { background: #fff6dd; }
tr.status-failed td { background: #fde2e2; }
.banner { background: #fde2e2; border: 1px solid #d88; padding: 0.6em; margin: 1em 0; }
.note { color: #666; font-style: italic; }
.scroll { overflow-x: auto; }
</style>"""


@dataclass(frozen=True)
class Chart:
    """One plotly figure on a page; `div_id` is stable so checks and links can find the chart."""

    div_id: str
    title: str
    figure: go.Figure
    note: str = ""

    def to_html(self) -> str:
        div = self.figure.to_html(
            full_html=False, include_plotlyjs=False, div_id=self.div_id, config={"displaylogo": False}
        )
        note = f'<p class="note">{html.escape(self.note)}</p>' if self.note else ""
        return f"<section><h3>{html.escape(self.title)}</h3>{note}{div}</section>"


def page(title: str, body: str, *, plotly: bool, plotly_dir: str = "") -> str:
    """A whole page around `body` (already HTML); `plotly` adds the script tag of the bundle in
    `plotly_dir`, a relative URL ending in `/` ("" for the page's own folder; the site keeps one copy)."""
    script = f'<script charset="utf-8" src="{html.escape(plotly_dir)}{PLOTLY_JS}"></script>' if plotly else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"{_ERROR_RECORDER}<title>{html.escape(title)}</title>{_STYLE}{script}</head>\n"
        f'<body><pre id="{JS_ERRORS_ID}" hidden></pre>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n'
    )


def write_plotly_js(folder: Path) -> Path:
    """The one copy of plotly.js for every page in `folder`; rewritten only if plotly's bundle changed."""
    path = Path(folder) / PLOTLY_JS
    bundle = plotly.offline.get_plotlyjs()
    if not path.exists() or path.read_text(encoding="utf-8") != bundle:
        path.write_text(bundle, encoding="utf-8")
    return path


def rows_table(frame: pd.DataFrame, text_columns: Iterable[str]) -> str:
    """An HTML table of result rows, every cell escaped; rows that did not run carry their status as
    a class (`status-unsupported`, `status-failed`) so they stand out."""
    if frame.empty:
        return '<p class="note">no rows</p>'
    text = set(text_columns)
    head = "".join(f"<th>{html.escape(str(column))}</th>" for column in frame.columns)
    body = []
    for _, row in frame.iterrows():
        cells = "".join(
            f'<td{" class=text" if column in text else ""}>{html.escape(_display(row[column]))}</td>'
            for column in frame.columns
        )
        body.append(f'<tr class="status-{_status_of(row.get("status", "ok")).value}">{cells}</tr>')
    return f'<div class="scroll"><table class="rows"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _status_of(cell: str) -> Status:
    """The status a `status` cell starts with; anything unrecognised counts as failed."""
    try:
        return Status(str(cell).split(":", 1)[0].strip())
    except ValueError:
        return Status.FAILED


def _display(value: Any) -> str:
    if isinstance(value, float):
        return "" if pd.isna(value) else f"{value:.4g}"
    return str(value)


def metadata_table(metadata: Mapping[str, Any]) -> str:
    """The run's metadata as a two-column table, nested keys flattened (`versions.torch`)."""
    if not metadata:
        return '<p class="note">this run has no metadata.json</p>'
    flat = pd.json_normalize(dict(metadata), sep=".").iloc[0]
    rows = "".join(
        f"<tr><th>{html.escape(str(key))}</th><td class=text>{html.escape(_display(value))}</td></tr>"
        for key, value in sorted(flat.items())
    )
    return f'<table class="metadata">{rows}</table>'


# ---- the data side of charts, shared by the benchmark views ----

WHISKER_NOTE = "Markers are medians of the repeat medians; whiskers span the fastest to the slowest repeat."
PANEL_HEIGHT_PX = 300  # one panel of a chart with a panel per shape, recipe or tensor


def plotted_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The `ok` rows, with the fastest and slowest repeat (from `repeat_ms`) and `shape`, the case name
    escaped for plotly (it renders HTML tags in labels)."""
    ok = rows[rows["status"] == Status.OK.value].copy()
    repeats = ok["repeat_ms"].map(repeat_times)
    ok["fastest_ms"] = repeats.map(lambda times: min(times) if times else math.nan)
    ok["slowest_ms"] = repeats.map(lambda times: max(times) if times else math.nan)
    ok["shape"] = ok["case"].map(html.escape)
    return ok


def run_order(frame: pd.DataFrame, *columns: str) -> dict[str, list[str]]:
    """Category orders for plotly: each column's values in run order (the order the suite listed them)."""
    return {column: list(dict.fromkeys(frame[column])) for column in columns}


def throughput_whiskers(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """`frame` (plotted_rows) with whiskers of `column`, a throughput (work / median time): its values at
    the fastest and at the slowest repeat."""
    return frame.assign(
        whisker_up=frame[column] * (frame["median_ms"] / frame["fastest_ms"] - 1.0),
        whisker_down=frame[column] * (1.0 - frame["median_ms"] / frame["slowest_ms"]),
    )


def ratio_whiskers(frame: pd.DataFrame, reference: pd.DataFrame, keys: list[str], column: str) -> pd.DataFrame:
    """`frame` (plotted_rows) with whiskers of `column`, a value proportional to the reference's time over
    the row's (a speedup, a share of the copy bandwidth): its extremes pair the row's fastest repeat with
    the reference's slowest, and the other way round. `reference` (plotted_rows) is matched on `keys`,
    its last row per key; a row without a reference gets no whiskers."""
    bounds = reference.drop_duplicates(keys, keep="last")[[*keys, "median_ms", "fastest_ms", "slowest_ms"]]
    merged = frame.merge(bounds, on=keys, how="left", suffixes=("", "_reference"))
    # value = factor * reference time / row time: the factor is 1 for a speedup, 100 x the bytes ratio for a share.
    factor = merged[column] * merged["median_ms"] / merged["median_ms_reference"]
    merged["whisker_up"] = factor * merged["slowest_ms_reference"] / merged["fastest_ms"] - merged[column]
    merged["whisker_down"] = merged[column] - factor * merged["fastest_ms_reference"] / merged["slowest_ms"]
    return merged


# The colour of each backend and implementation on every chart of every page: ours (triton) in reds,
# torchao in greens, each compiled variant a lighter shade of its eager one, BF16 in greys.
BACKEND_COLOURS: dict[str, str] = {
    "bf16": "#7f7f7f", "bf16-compile": "#b8b8b8",
    "cublas": "#1f77b4",
    "triton": "#d62728", "triton-compile": "#ff7f7f", "triton-tuned": "#8c0d0d",
    "torchao": "#2ca02c", "torchao-compile": "#98df8a",
    "te": "#9467bd", "te-layer": "#c5b0d5",
    "torch": "#8c564b", "torch-compile": "#c49c94",
    "unfused": "#e377c2",
    "public model": "#17becf", "refined model": "#bcbd22",
}  # fmt: skip
# Colours for any other label (numerics' curves, optimizers): picked by a hash of the label, so a label
# keeps its colour from page to page.
_OTHER_COLOURS = tuple(c for c in plotly.colors.qualitative.Dark24 if c.lower() not in {v.lower() for v in BACKEND_COLOURS.values()})


def colour_map(labels: Iterable[str]) -> dict[str, str]:
    """A colour per label, the same in every chart and on every page: BACKEND_COLOURS' for a backend or
    implementation, else one picked by the label's hash (the next free one where two labels of one chart
    would share it)."""
    colours: dict[str, str] = {}
    for label in dict.fromkeys(labels):
        colour = BACKEND_COLOURS.get(html.unescape(label))
        if colour is None:
            start = zlib.crc32(label.encode("utf-8"))
            free = [_OTHER_COLOURS[(start + i) % len(_OTHER_COLOURS)] for i in range(len(_OTHER_COLOURS))]
            colour = next((c for c in free if c not in colours.values()), free[0])
        colours[label] = colour
    return colours


def ratio_whisker_note(reference: str) -> str:
    """The note under a chart with ratio_whiskers, against `reference` (what the ratio divides by)."""
    return (
        f"Markers are medians of the repeat medians; whiskers pair the row's fastest repeat with {reference}'s "
        "slowest and the other way round."
    )


def chart_id(*parts: str) -> str:
    """A chart's div id from its parts: only [a-z0-9-], whatever the parts (backend, case names) hold."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


def panels_height(panels: int) -> int:
    """Height of a chart with `panels` panels stacked above one axis of long shape names."""
    return 260 + PANEL_HEIGHT_PX * panels


def stacked_time_figure(steps: pd.DataFrame, columns: Mapping[str, str], median_name: str, labels: Mapping[str, str]) -> go.Figure:
    """One bar per step (`steps`: plotted_rows with a `step` label each, in run order) of its kernel time
    stacked by kind (`columns`: column -> kind, in stacking order; an empty kind draws no bar), with the
    step's median time (`median_name`) as a black dash beside it and whiskers from its fastest to its
    slowest repeat."""
    parts = steps.melt(id_vars=["step"], value_vars=list(columns), var_name="kernels", value_name="ms")
    parts = parts[parts["ms"] > 0]
    parts = parts.assign(kernels=parts["kernels"].map(columns))
    figure = px.bar(
        parts, x="step", y="ms", color="kernels", labels=dict(labels),
        category_orders={"step": list(steps["step"]), "kernels": list(columns.values())},
    )
    figure.add_trace(
        go.Scatter(
            x=steps["step"], y=steps["median_ms"], mode="markers", name=median_name,
            marker={"symbol": "line-ew-open", "size": 24, "color": "black"},
            error_y={"array": steps["slowest_ms"] - steps["median_ms"], "arrayminus": steps["median_ms"] - steps["fastest_ms"]},
        )
    )
    figure.update_layout(height=panels_height(1))
    return figure
