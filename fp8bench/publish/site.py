"""`fp8bench publish`: a static site of every run under a reports tree, rebuilt incrementally.

The tree holds runs by GPU model; a run is one results folder or a folder of suite runs:

    reports/<gpu-model>/<run>/results.csv             (+ metadata.json)   a single run
    reports/<gpu-model>/<run>/<entry>/results.csv     (+ metadata.json)   a folder of suite runs
    reports/<gpu-model>/<run>/gate.json               `fp8bench gate --json`, if the run was gated

Folders whose names start with `_` or `.` are not runs (`fp8bench gate` keeps re-runs in `_reruns`).
A suite *entry* is what repeats from run to run (`square-4096` in every CI run); a single run is an
entry of its own, named by its folder. The site:

    site/index.html                          the GPU models
    site/plotly.min.js                       the one copy of plotly.js every chart page loads
    site/manifest.json                       fingerprints of what was built: unchanged runs are not rebuilt
    site/<model>/index.html                  the latest run of every entry (geomean speedups, gate status), all runs
    site/<model>/history.html                per entry, the geomean speedup of each series across runs
    site/<model>/runs/<run>/[<entry>/]       the run's reports (fp8bench.report.write) with its results.csv and
                                             metadata.json, and compare.html against the entry's previous run
    site/<model>/runs/<run>/index.html       for a folder of suite runs: its entries and gate result

Pages open from file:// with no network: data is embedded in them (plotly figures as JSON, which
plotly writes with `<`, `>` and `&` as unicode escapes, so no string can close the script), every
string from a result file or a folder name is escaped, and links are relative. Folder names become
path segments through `slug`, so no name can reach outside its folder or collide with a page.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import plotly

from fp8bench.gate import compare
from fp8bench.gate import output as compare_output
from fp8bench.harness import results
from fp8bench.model import hardware
from fp8bench.publish import pages as publish_pages
from fp8bench.publish import tree as publish_tree
from fp8bench.report import html as report_html
from fp8bench.report import matmul as report_matmul
from fp8bench.report import write as report
from fp8bench.publish.tree import (
    COMPARE_HTML, GATE_JSON, HISTORY_HTML, RUNS_DIR, EntryRun, Run, Skipped, Tree, read_tree, slug,
)
from fp8bench.report.write import INDEX_HTML, write_reports
from fp8bench.report.html import write_plotly_js
from fp8bench.harness.results import METADATA_JSON, RESULTS_CSV

MANIFEST_JSON = "manifest.json"
_MANIFEST_FORMAT = 1
# The code that renders pages: when it changes, every page is rebuilt, whatever the fingerprints say.
_RENDERING_MODULES = (compare, compare_output, hardware, publish_pages, publish_tree, report, report_html, report_matmul, results)


@dataclass(frozen=True)
class Published:
    """What a build did: site-relative pages (run folders, compare pages) rebuilt and left as they
    were, and the folders of the tree that were skipped."""

    index: Path
    rebuilt: tuple[str, ...]
    unchanged: tuple[str, ...]
    skipped: tuple[Skipped, ...]


def _code_fingerprint() -> str:
    digest = hashlib.sha256(plotly.__version__.encode())
    for source in (*(module.__file__ for module in _RENDERING_MODULES), __file__):
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()


@dataclass
class _Manifest:
    """Fingerprints of what was built, by site-relative path, valid for one version of the rendering code."""

    code: str
    pages: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, out: Path, code: str) -> "_Manifest":
        """The site's manifest (empty when written by other rendering code, or unreadable); an empty
        one for a new or empty folder. Refuses a folder that holds anything else, so that pruning
        stale pages can never delete what the site did not write."""
        path = out / MANIFEST_JSON
        if not path.is_file():
            if out.exists() and (not out.is_dir() or any(out.iterdir())):
                raise ValueError(f"{out} exists and is not an fp8bench site (no {MANIFEST_JSON}); give publish a new or empty folder")
            return cls(code)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            same = data.get("format") == _MANIFEST_FORMAT and data.get("code") == code
            pages = {str(k): str(v) for k, v in data["pages"].items()} if same else {}
        except (ValueError, KeyError, TypeError, AttributeError):
            pages = {}
        return cls(code, pages)

    def save(self, out: Path) -> None:
        data = {"format": _MANIFEST_FORMAT, "code": self.code, "pages": dict(sorted(self.pages.items()))}
        (out / MANIFEST_JSON).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


@dataclass
class _Build:
    """Decides, page by page, whether the manifest of the last build still holds it."""

    old: _Manifest
    new: _Manifest
    rebuilt: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def stale(self, key: PurePosixPath, fingerprint: str, written: Path) -> bool:
        self.new.pages[str(key)] = fingerprint
        if self.old.pages.get(str(key)) == fingerprint and written.exists():
            self.unchanged.append(str(key))
            return False
        self.rebuilt.append(str(key))
        return True


def publish(reports: Path, out: Path) -> Published:
    """Build the site of a reports tree in `out`, or bring it up to date: a run folder is rebuilt
    only when its results.csv or metadata.json changed (or the rendering code did), a compare page
    only when one of its two runs did. Raises ValueError for a tree with no runs or an `out` that
    is not a site."""
    out = Path(out)
    tree = read_tree(reports, exclude=out)
    old = _Manifest.load(out, _code_fingerprint())
    build = _Build(old, _Manifest(old.code))
    out.mkdir(parents=True, exist_ok=True)
    write_plotly_js(out)
    for model, runs in tree.models.items():
        for run in runs:
            for entry in run.entries:
                if build.stale(entry.site_dir, entry.fingerprint, out / entry.site_dir / INDEX_HTML):
                    _write_run_reports(entry, out)
            _copy_gate_json(run, out)
        for entries in tree.history(model).values():
            for previous, entry in zip(entries, entries[1:]):
                page = entry.site_dir / COMPARE_HTML
                if build.stale(page, f"{previous.fingerprint}:{entry.fingerprint}", out / page):
                    (out / page).write_text(publish_pages.compare_page(previous, entry), encoding="utf-8")
    _prune(out, tree)
    _write_summaries(tree, out)
    build.new.save(out)
    return Published(out / INDEX_HTML, tuple(build.rebuilt), tuple(build.unchanged), tree.skipped)


def _write_run_reports(entry: EntryRun, out: Path) -> None:
    """The entry's results files and its reports (fp8bench.report.write), loading the site's plotly.js."""
    target = out / entry.site_dir
    target.mkdir(parents=True, exist_ok=True)
    for name in (RESULTS_CSV, METADATA_JSON):
        if (entry.source / name).is_file():
            shutil.copyfile(entry.source / name, target / name)
    write_reports(target, plotly_dir=posixpath.relpath(".", str(entry.site_dir)) + "/")


def _copy_gate_json(run: Run, out: Path) -> None:
    target = out / run.site_dir / GATE_JSON
    if run.gate is None:
        target.unlink(missing_ok=True)
    else:
        shutil.copyfile(run.source / GATE_JSON, target)


def _prune(out: Path, tree: Tree) -> None:
    """Delete what earlier builds wrote for GPU models, runs and entries gone from the tree, and
    the compare pages of entries whose previous run is gone."""
    kept = {PurePosixPath(".")}
    for model, runs in tree.models.items():
        kept |= {PurePosixPath(slug(model)), PurePosixPath(slug(model), RUNS_DIR)}
        kept |= {run.site_dir for run in runs} | {entry.site_dir for run in runs for entry in run.entries}
    for folder in sorted(path for path in out.rglob("*") if path.is_dir()):
        relative = PurePosixPath(folder.relative_to(out).as_posix())
        if relative not in kept and relative.parent in kept and folder.is_dir():
            shutil.rmtree(folder)
    for model in tree.models:
        for entries in tree.history(model).values():
            (out / entries[0].site_dir / COMPARE_HTML).unlink(missing_ok=True)


def _write_summaries(tree: Tree, out: Path) -> None:
    """The pages over many runs: cheap to write, so written on every build."""
    (out / INDEX_HTML).write_text(publish_pages.site_index(tree), encoding="utf-8")
    for model, runs in tree.models.items():
        model_dir = out / slug(model)
        (model_dir / INDEX_HTML).write_text(publish_pages.model_index(tree, model), encoding="utf-8")
        (model_dir / HISTORY_HTML).write_text(publish_pages.history_page(tree, model), encoding="utf-8")
        for run in runs:
            if run.is_suite:
                (out / run.site_dir / INDEX_HTML).write_text(publish_pages.suite_run_page(tree, run), encoding="utf-8")
