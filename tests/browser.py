"""Test helper: load a page in Debian's headless Chromium and say what rendered.

`render(path)` opens a file:// page, lets it run (virtual time, so no real waiting), and parses the
DOM Chromium dumps: the script errors the page recorded (pages built on fp8bench.report.html carry
the recorder), each plotly graph with its traces and how many data points each drew, the links and
the title. `parse_html` is the same parser for pages read from disk, and `embedded_graphs` reads the
graphs a page would draw from the data in it, both with no browser.

Without Chromium, `render` skips the calling test with the reason, except under CI=true, where a
missing browser fails it: CI installs Chromium, so its absence there is a broken setup.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from fp8bench.report.html import JS_ERRORS_ID

CHROMIUM = "/usr/bin/chromium"
# Headless, no sandbox (tests run as root), and none of the background connections a closed network refuses.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)
# HTML elements that never have an end tag.
_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list["Element | str"] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def iter(self) -> Iterator["Element"]:
        """This element and every element below it, in document order."""
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None) -> list["Element"]:
        return [e for e in self.iter() if (tag is None or e.tag == tag) and (cls is None or cls in e.classes)]

    def text(self) -> str:
        return "".join(child if isinstance(child, str) else child.text() for child in self.children)


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self._open = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {name: value or "" for name, value in attrs})
        self._open[-1].children.append(element)
        if tag not in _VOID:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open[-1].children.append(Element(tag, {name: value or "" for name, value in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self._open) - 1, 0, -1):
            if self._open[depth].tag == tag:
                del self._open[depth:]
                return

    def handle_data(self, data: str) -> None:
        self._open[-1].children.append(data)


def inlines_bundle(page_text: str, bundle: Path) -> bool:
    """Whether a page carries a copy of a script bundle (plotly.js): a stretch from the bundle's middle appears
    in it. Not the page's size: a page of many curves holds megabytes of its own data."""
    code = bundle.read_text(encoding="utf-8")
    return code[len(code) // 2 : len(code) // 2 + 400] in page_text


def parse_html(text: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(text)
    builder.close()
    return builder.root


@dataclass(frozen=True)
class Trace:
    kind: str  # plotly's trace class: "bars", "scatter", "heatmap", ...
    points: int  # data points drawn: bars, markers, lines (one each) or labelled heatmap cells


@dataclass(frozen=True)
class Graph:
    div_id: str
    traces: tuple[Trace, ...]

    @property
    def points(self) -> int:
        return sum(trace.points for trace in self.traces)


@dataclass(frozen=True)
class RenderedPage:
    url: str
    title: str
    js_errors: tuple[str, ...]
    graphs: tuple[Graph, ...]
    links: tuple[str, ...]
    dom: Element

    def graph(self, div_id: str) -> Graph:
        for graph in self.graphs:
            if graph.div_id == div_id:
                return graph
        raise KeyError(f"{self.url} rendered no plotly graph {div_id!r}; it has {[g.div_id for g in self.graphs]}")


def _traces(graph_div: Element) -> tuple[Trace, ...]:
    """Cartesian traces are <g class="trace KIND"> holding one .point per datum; a heatmap is a
    <g class="hm"> holding one .heatmap-label per cell it labelled (charts set texttemplate)."""
    traces = []
    for element in graph_div.iter():
        if "trace" in element.classes:
            kind = " ".join(sorted(c for c in element.classes if not c.startswith("trace")))
            # Markers and bars are one .point per datum; a line without markers is one drawn .js-line path.
            lines = [e for e in element.find_all(cls="js-line") if e.attrs.get("d", "").strip() not in ("", "M0,0Z")]
            traces.append(Trace(kind, len(element.find_all(cls="point")) or len(lines)))
        elif "hm" in element.classes:
            traces.append(Trace("heatmap", len(element.find_all(cls="heatmap-label"))))
    return tuple(traces)


def _js_errors(root: Element) -> tuple[str, ...]:
    """The recorder's list; a page without the recorder, or whose recorder never ran, counts as an error."""
    recorders = [e for e in root.find_all() if e.attrs.get("id") == JS_ERRORS_ID]
    if not recorders:
        return (f"the page has no #{JS_ERRORS_ID} error recorder",)
    recorded = recorders[0].text().strip()
    if not recorded:
        return ("the error recorder never ran (a script before it failed, or the page did not finish loading)",)
    return tuple(json.loads(recorded))


def from_dom(url: str, dom_text: str) -> RenderedPage:
    root = parse_html(dom_text)
    titles = root.find_all("title")
    return RenderedPage(
        url=url,
        title=titles[0].text() if titles else "",
        js_errors=_js_errors(root),
        graphs=tuple(
            Graph(div.attrs.get("id", ""), _traces(div)) for div in root.find_all("div", "js-plotly-plot")
        ),
        links=tuple(a.attrs["href"] for a in root.find_all("a") if "href" in a.attrs),
        dom=root,
    )


def require_chromium() -> str:
    """Chromium's path; skips the test without it, or fails it under CI=true."""
    path = shutil.which("chromium") or (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)
    if path is None:
        reason = f"headless Chromium is not installed (looked for `chromium` on PATH and {CHROMIUM}; apt-get install chromium)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {reason}: .ci/run should have installed it", pytrace=False)
        pytest.skip(reason)
    return path


def render(page: Path, budget_ms: int = 10_000, timeout_s: float = 120.0) -> RenderedPage:
    """Load `page` in a fresh headless Chromium profile and return what rendered.

    `budget_ms` is virtual time: Chromium fast-forwards timers while idle, so a page that renders in
    1 s of virtual time costs about that, not the budget.
    """
    executable = require_chromium()
    url = Path(page).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="chromium-profile-", ignore_cleanup_errors=True) as profile:
        command = [
            executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}", "--dump-dom", url,
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pytest.fail(f"Chromium did not finish {url} within {timeout_s:.0f} s", pytrace=False)
    if done.returncode != 0 or not done.stdout.strip():
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        pytest.fail(f"Chromium exited {done.returncode} on {url} with no DOM; stderr ends:\n{tail}", pytrace=False)
    return from_dom(url, done.stdout)


_NEW_PLOT = "Plotly.newPlot("


def _array(value) -> list:
    """A plotly data array as written into a page: a list, or numpy data as {"dtype", "bdata", "shape"}."""
    if isinstance(value, dict) and "bdata" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]).newbyteorder("<"))
        return array.astype(float).ravel().tolist()
    if isinstance(value, list):
        return [item for row in value for item in (row if isinstance(row, list) else [row])]
    return []


def _drawn(trace: dict) -> int:
    """Points a trace draws: its values that are finite numbers (y, or x for horizontal bars; z cells
    for a heatmap), as the browser draws a marker, bar or labelled cell for each."""
    if trace.get("type") == "heatmap":
        values = _array(trace.get("z"))
    else:
        values = _array(trace.get("x" if trace.get("orientation") == "h" else "y"))
    return sum(1 for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def embedded_graphs(text: str) -> tuple[Graph, ...]:
    """The plotly graphs a page's scripts would draw, read from the data embedded in it (no browser):
    each `Plotly.newPlot(id, traces, ...)` call's div id and the points of each trace. For the pages
    not rendered in Chromium, which checks the same on what it drew."""
    decoder = json.JSONDecoder()
    graphs = []
    start = text.find(_NEW_PLOT)
    while start != -1:
        position = start + len(_NEW_PLOT)
        while text[position].isspace():
            position += 1
        div_id, position = decoder.raw_decode(text, position)
        position = text.index(",", position) + 1
        while text[position].isspace():
            position += 1
        traces, position = decoder.raw_decode(text, position)
        graphs.append(Graph(div_id, tuple(Trace(t.get("type", "scatter"), _drawn(t)) for t in traces)))
        start = text.find(_NEW_PLOT, position)
    return tuple(graphs)
