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
    site/.fp8bench-site.json                 the site's marker: fingerprints of what was built (unchanged runs are
                                             not rebuilt) and every file written, the only ones a build deletes
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
import multiprocessing
import os
import posixpath
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
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
from fp8bench.report import cast as report_cast
from fp8bench.report import e2e as report_e2e
from fp8bench.report import matmul as report_matmul
from fp8bench.report import numerics as report_numerics
from fp8bench.report import roofline as report_roofline
from fp8bench.report import write as report
from fp8bench.publish.tree import (
    COMPARE_HTML, GATE_JSON, HISTORY_HTML, EntryRun, Run, Skipped, Tree, read_tree, slug,
)
from fp8bench.report.write import DATA_FILES, INDEX_HTML, page_names, write_reports
from fp8bench.report.html import PLOTLY_JS, write_plotly_js
from fp8bench.harness.results import METADATA_JSON, RESULTS_CSV
from fp8bench.harness.validate import MalformedFile

# The site's marker and manifest in one: publish writes only into a folder it created or one holding
# this file, and deletes only files this file says it wrote. A dot-name no site of another tool uses.
MANIFEST_JSON = ".fp8bench-site.json"
_MANIFEST_FORMAT = 2
# The code that renders pages: when it changes, every page is rebuilt, whatever the fingerprints say.
_RENDERING_MODULES = (
    compare, compare_output, hardware, publish_pages, publish_tree, report, report_html, report_cast, report_e2e, report_matmul,
    report_numerics, report_roofline, results,
)

Progress = Callable[[int, int, str], None]  # (steps done, steps in all, what is being built)
# A process of its own pays for itself from about this many run folders (it starts in a few seconds,
# importing pandas and plotly; a run folder's reports take from a fraction of a second to several).
_FOLDERS_PER_PROCESS = 8


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
    """Fingerprints of what was built, by site-relative path, valid for one version of the rendering
    code, and every file the site has written (site-relative): the only files it may delete."""

    code: str
    pages: dict[str, str] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)

    @classmethod
    def claim(cls, out: Path, code: str) -> "_Manifest":
        """The site's manifest, claiming `out` for the site first where it is new or empty. Refuses
        (ValueError) a folder that holds anything but a site: publishing there could overwrite or
        delete what the site did not write. A first build interrupted after the claim is a site."""
        path = out / MANIFEST_JSON
        if out.exists() and not out.is_dir():
            raise ValueError(f"{out} is a file, not a folder; give publish a new or empty folder")
        if not path.is_file():
            if out.exists() and any(out.iterdir()):
                raise ValueError(
                    f"{out} holds files and no {MANIFEST_JSON}, so fp8bench publish did not make it; "
                    "give publish a new or empty folder (nothing was written)"
                )
            out.mkdir(parents=True, exist_ok=True)
            manifest = cls(code)
            manifest.save(out)
            return manifest
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            files = {str(f) for f in data["files"]}
            same = data.get("format") == _MANIFEST_FORMAT and data.get("code") == code
            pages = {str(k): str(v) for k, v in data["pages"].items()} if same else {}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            # Without its list of files nothing may be deleted or trusted: the user decides.
            raise MalformedFile(path, f"not a manifest fp8bench publish wrote ({err}); delete the site and publish again") from None
        outside = [f for f in files if PurePosixPath(f).is_absolute() or ".." in PurePosixPath(f).parts or not f.strip()]
        if outside:  # a build deletes the files listed: never one outside the site
            raise MalformedFile(path, f"lists {outside[0]!r}, not a file inside the site; delete the site and publish again")
        return cls(code, pages, files)

    def save(self, out: Path) -> None:
        """Written whole to a temporary file and renamed: an interrupted build leaves the last one."""
        data = {"format": _MANIFEST_FORMAT, "code": self.code, "pages": dict(sorted(self.pages.items())), "files": sorted(self.files)}
        temporary = out / f"{MANIFEST_JSON}.tmp"
        temporary.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(temporary, out / MANIFEST_JSON)


@dataclass
class _Build:
    """Decides, page by page, whether the manifest of the last build still holds it, and records every
    file written (in the manifest, saved as the build goes, so an interrupted build knows its files)."""

    out: Path
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

    def target(self, relative: PurePosixPath) -> Path:
        """The path of a file the site is about to write, recorded as its own; `checkpoint` before
        writing it."""
        self.new.files.add(str(relative))
        self.old.files.add(str(relative))
        path = self.out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def checkpoint(self) -> None:
        """Save every file recorded so far as the site's, so that an interrupted build still knows them."""
        self.old.save(self.out)

    def keep(self, site_dir: PurePosixPath) -> None:
        """An unchanged run folder's files stay the site's (its compare page and gate result are decided anew)."""
        self.new.files |= {
            f for f in self.old.files
            if PurePosixPath(f).parent == site_dir and PurePosixPath(f).name not in (COMPARE_HTML, GATE_JSON)
        }  # fmt: skip


def publish(reports: Path, out: Path, progress: Progress | None = None, jobs: int | None = None) -> Published:
    """Build the site of a reports tree in `out`, or bring it up to date: a run folder is rebuilt
    only when its results.csv or metadata.json changed (or the rendering code did), a compare page
    only when one of its two runs did. Raises ValueError for a tree with no runs or an `out` that
    is not a site, MalformedFile for a malformed file in the tree; both before anything is written.

    Run folders' reports are rendered by `jobs` processes at once (default: one per CPU): building
    plotly figures is most of a build's time, and one process uses one core."""
    out = Path(out)
    tree = read_tree(reports, exclude=out)
    old = _Manifest.claim(out, _code_fingerprint())
    build = _Build(out, old, _Manifest(old.code, files=set()))
    steps = [(run, entry) for runs in tree.models.values() for run in runs for entry in run.entries]
    report = progress or (lambda done, total, what: None)
    build.target(PurePosixPath(PLOTLY_JS))
    build.checkpoint()
    write_plotly_js(out)
    stale = []
    for run, entry in steps:
        if build.stale(entry.site_dir, entry.fingerprint, out / entry.site_dir / INDEX_HTML):
            stale.append(_prepare_run_reports(entry, build))
        else:
            build.keep(entry.site_dir)
        _copy_gate_json(run, build)
    build.checkpoint()
    for done, site_dir in enumerate(_render(stale, out, jobs or os.cpu_count() or 1)):
        report(done + 1, len(stale), f"reports of {site_dir}")
    report(len(stale), len(stale), "compare and summary pages")
    for model in tree.models:
        for entries in tree.history(model).values():
            for previous, entry in zip(entries, entries[1:]):
                page = entry.site_dir / COMPARE_HTML
                path = build.target(page)
                if build.stale(page, f"{previous.fingerprint}:{entry.fingerprint}", path):
                    build.checkpoint()
                    path.write_text(publish_pages.compare_page(previous, entry), encoding="utf-8")
    _write_summaries(tree, build)
    _prune(build)
    build.new.save(out)
    return Published(out / INDEX_HTML, tuple(build.rebuilt), tuple(build.unchanged), tree.skipped)


def _prepare_run_reports(entry: EntryRun, build: _Build) -> PurePosixPath:
    """Copy the entry's results files into its folder of the site, recording them and the report pages
    `_render` will write there; return that folder."""
    copies = [name for name in (RESULTS_CSV, METADATA_JSON, *DATA_FILES) if (entry.source / name).is_file()]
    for name in (*copies, *page_names(entry.rows)):
        build.target(entry.site_dir / name)
    build.checkpoint()
    for name in copies:
        shutil.copyfile(entry.source / name, build.out / entry.site_dir / name)
    return entry.site_dir


def _write_run_reports(out: Path, site_dir: PurePosixPath) -> PurePosixPath:
    """The reports (fp8bench.report.write) of a prepared run folder, loading the site's plotly.js."""
    write_reports(out / site_dir, plotly_dir=posixpath.relpath(".", str(site_dir)) + "/")
    return site_dir


def _render(site_dirs: list[PurePosixPath], out: Path, jobs: int) -> Iterator[PurePosixPath]:
    """Write the reports of the prepared run folders, up to `jobs` at a time; yield each folder as it is done."""
    workers = min(jobs, len(site_dirs) // _FOLDERS_PER_PROCESS)
    if workers <= 1:
        yield from (_write_run_reports(out, site_dir) for site_dir in site_dirs)
        return
    # Spawned, not forked: the caller may hold threads (a progress display) that a fork would copy mid-way.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        pending = [pool.submit(_write_run_reports, out, site_dir) for site_dir in site_dirs]
        try:
            for future in as_completed(pending):
                yield future.result()
        finally:
            for future in pending:
                future.cancel()


def _copy_gate_json(run: Run, build: _Build) -> None:
    if run.gate is not None:
        target = build.target(run.site_dir / GATE_JSON)
        build.checkpoint()
        shutil.copyfile(run.source / GATE_JSON, target)


def _prune(build: _Build) -> None:
    """Delete the files earlier builds wrote that this one did not (runs, entries and compare pages gone
    from the tree), then the folders that left empty. Nothing the site did not write is touched."""
    for relative in sorted(build.old.files - build.new.files):
        path = build.out / relative
        path.unlink(missing_ok=True)
        for folder in PurePosixPath(relative).parents:
            if folder == PurePosixPath("."):
                break
            try:
                (build.out / folder).rmdir()  # only an empty folder goes
            except OSError:
                break


def _write_summaries(tree: Tree, build: _Build) -> None:
    """The pages over many runs: cheap to write, so written on every build."""
    pages = {PurePosixPath(INDEX_HTML): lambda: publish_pages.site_index(tree)}
    for model, runs in tree.models.items():
        model_dir = PurePosixPath(slug(model))
        pages[model_dir / INDEX_HTML] = lambda model=model: publish_pages.model_index(tree, model)
        pages[model_dir / HISTORY_HTML] = lambda model=model: publish_pages.history_page(tree, model)
        for series in tree.history(model):
            path = PurePosixPath(publish_pages.series_history_path(model, series))
            pages[path] = lambda model=model, series=series: publish_pages.series_history_page(tree, model, series)
        for run in runs:
            if run.is_suite:
                pages[run.site_dir / INDEX_HTML] = lambda run=run: publish_pages.suite_run_page(tree, run)
    paths = {page: build.target(page) for page in pages}
    build.checkpoint()
    for page, render in pages.items():
        paths[page].write_text(render(), encoding="utf-8")
