"""HTML building blocks of every report page: the page skeleton, plotly.js once per folder, charts,
and escaped tables of rows and metadata.

Pages open from file:// with no network: each references one copy of `plotly.min.js`, its folder's
(a run's reports) or the site root's (fp8bench.publish).
Every string that came from a result file is escaped here (tables, metadata) or by the chart builders
(plotly renders a subset of HTML in labels, so labels are escaped before they reach it). The head of
every page carries a recorder of script errors that a headless browser check reads back
(tests/browser.py); the static site's pages use the same skeleton.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.offline

from fp8bench.config import Status

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
