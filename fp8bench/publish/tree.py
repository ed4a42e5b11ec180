"""The reports tree that `fp8bench publish` reads: runs by GPU model, each a results folder or a
folder of suite runs, with a gate result where the run was gated (layout in fp8bench.publish.site).

Everything here is read once and checked: a folder the reports could not show is skipped with the
reason, so page building never meets a broken run. A run's history is that of its benchmark identity
(series_of), not of its folder's name.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd

from fp8bench.gate.baseline import run_folders
from fp8bench.gate.compare import Outcome
from fp8bench.report.write import page_granularities
from fp8bench.harness.results import METADATA_JSON, RESULTS_CSV, load_results, read_metadata
from fp8bench.harness.validate import MalformedFile, json_type_name

# metadata key `purpose`: a run made to show or probe something, not a measurement of its series; the
# site keeps it in the series' history but never shows it as the series' latest result (docs/gating.md, the site)
PURPOSE_KEY = "purpose"
NOT_LATEST_PURPOSES = ("demo", "probe")
# metadata key naming the suite entry a run measured, where the command line does not say it
SUITE_ENTRY_KEY = "suite_entry"
# command-line options that say where a run was written or how it was resumed, not what it measured
_WHERE_OPTIONS = ("--out", "--json", "--markdown", "--baseline-dir")
_HOW_FLAGS = ("--resume",)

GATE_JSON = "gate.json"
# The site's layout (fp8bench.publish.site): site/<model>/{index,history}.html, site/<model>/runs/<run>/...
RUNS_DIR = "runs"  # run folders apart from the model's own pages
HISTORY_HTML = "history.html"
COMPARE_HTML = "compare.html"  # in an entry's folder: against the entry's previous run


def slug(name: str) -> str:
    """A path segment for a folder name: letters, digits, `_` and `-` only; a name that had other
    characters gets a hash of itself appended, so two names never share a segment."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")
    if cleaned == name:
        return name
    return f"{cleaned or 'run'}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Skipped:
    """A folder of the tree that was not published, and why."""

    path: Path
    reason: str


@dataclass(frozen=True)
class GateResult:
    """What the site shows of a `fp8bench gate --json` file: the verdict and each case's outcome."""

    verdict: Outcome
    exit_code: int
    case_outcomes: tuple[tuple[str, Outcome], ...]  # (suite entry, outcome); entry "" for a single run

    @classmethod
    def read(cls, path: Path) -> "GateResult":
        """Raises ValueError saying what is wrong with the file."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
                raise ValueError("no `cases` list: not the output of fp8bench gate --json")
            outcomes = tuple((str(case["run"]), Outcome(case["outcome"])) for case in data["cases"])
            return cls(Outcome(data["verdict"]), int(data["exit_code"]), outcomes)
        except (KeyError, TypeError) as err:
            raise ValueError(f"not the output of fp8bench gate --json (missing or malformed {err})") from None

    def summary(self) -> str:
        return f"{self.verdict.value} (exit {self.exit_code})"

    def entry_summary(self, entry: str) -> str:
        """Outcome counts of one entry's cases, e.g. `1 REGRESSION, 11 PASS`."""
        counts = {o: sum(1 for e, outcome in self.case_outcomes if e == entry and outcome is o) for o in Outcome}
        return ", ".join(f"{n} {o.value}" for o, n in counts.items() if n) or "no case of this entry was compared"


@dataclass(frozen=True, eq=False)
class EntryRun:
    """One suite entry's results in one run; a single run is an entry of its own."""

    model: str
    run: str
    entry: str
    in_suite: bool  # inside a folder of suite runs (else the run folder itself holds the results)
    source: Path
    rows: pd.DataFrame
    metadata: dict[str, Any]
    started: pd.Timestamp | None  # metadata's started_utc; None when missing or unreadable
    fingerprint: str  # hash of results.csv and metadata.json: what decides whether to rebuild
    series: str  # the benchmark identity whose history this run extends (series_of)
    purpose: str  # metadata's `purpose` ("demo", "probe"), "" for a measurement

    @property
    def can_be_latest(self) -> bool:
        return self.purpose not in NOT_LATEST_PURPOSES

    @property
    def site_dir(self) -> PurePosixPath:
        run_dir = PurePosixPath(slug(self.model), RUNS_DIR, slug(self.run))
        return run_dir / slug(self.entry) if self.in_suite else run_dir

    @property
    def gate_key(self) -> str:
        """The `run` field of this entry's cases in a gate JSON."""
        return self.entry if self.in_suite else ""

    @property
    def order(self) -> tuple[pd.Timestamp, str]:
        """Oldest first; runs that record no start time count as oldest."""
        return (self.started if self.started is not None else pd.Timestamp.min.tz_localize("UTC"), self.run)


@dataclass(frozen=True, eq=False)
class Run:
    """A run folder: a single run, or a folder of suite runs, with its gate result if it has one."""

    model: str
    name: str
    source: Path
    entries: tuple[EntryRun, ...]
    is_suite: bool
    gate: GateResult | None
    gate_problem: str = ""  # why gate.json could not be read

    @property
    def site_dir(self) -> PurePosixPath:
        return PurePosixPath(slug(self.model), RUNS_DIR, slug(self.name))

    def gate_status(self, entry: EntryRun | None = None) -> str:
        if self.gate_problem:
            return f"{GATE_JSON} unreadable: {self.gate_problem}"
        if self.gate is None:
            return "not gated"
        if entry is None:
            return self.gate.summary()
        return f"{self.gate.summary()}: {self.gate.entry_summary(entry.gate_key)}"

    @property
    def started(self) -> pd.Timestamp | None:
        """When its first entry started."""
        times = [e.started for e in self.entries if e.started is not None]
        return min(times) if times else None

    @property
    def order(self) -> tuple[pd.Timestamp, str]:
        return min(entry.order for entry in self.entries)


@dataclass(frozen=True)
class Tree:
    """Every run found under a reports root, by GPU model, and what was skipped."""

    root: Path
    models: dict[str, tuple[Run, ...]]
    skipped: tuple[Skipped, ...]

    def history(self, model: str) -> dict[str, list[EntryRun]]:
        """Each series' runs on one GPU model (EntryRun.series), oldest first, series by name."""
        by_series: dict[str, list[EntryRun]] = {}
        for run in self.models[model]:
            for entry in run.entries:
                by_series.setdefault(entry.series, []).append(entry)
        return {name: sorted(runs, key=lambda e: e.order) for name, runs in sorted(by_series.items())}


def latest(entries: list[EntryRun]) -> EntryRun | None:
    """A series' latest result (entries oldest first): its newest run that is not a demo or probe."""
    return next((entry for entry in reversed(entries) if entry.can_be_latest), None)


def _measured_options(arguments: list[str]) -> list[str]:
    """The arguments of a command that change what it measures: positional arguments (less absolute
    paths), then options in name order (a repeated option keeps its order), less _WHERE_OPTIONS and
    _HOW_FLAGS."""
    positional: list[str] = []
    options: list[tuple[str, str]] = []  # (name, value); value "" for a flag
    i = 0
    while i < len(arguments):
        token = arguments[i]
        if not token.startswith("--"):
            positional.append(token)
        elif "=" in token:
            options.append(tuple(token.split("=", 1)))  # type: ignore[arg-type]
        elif i + 1 < len(arguments) and not arguments[i + 1].startswith("--"):
            options.append((token, arguments[i + 1]))
            i += 1
        else:
            options.append((token, ""))
        i += 1
    kept = [word for word in positional if not word.startswith("/")]
    for name, value in sorted(options, key=lambda option: option[0]):
        if name not in _WHERE_OPTIONS + _HOW_FLAGS:
            kept.append(f"{name} {value}".rstrip())
    return kept


def series_of(run: str, entry: str, in_suite: bool, metadata: dict[str, Any]) -> str:
    """A run's benchmark identity: the suite entry it measured (metadata's suite_entry, its folder in a
    `fp8bench run` or `gate` of a suite, or `fp8bench run ... --only ENTRY`), else its command with the
    options that change what is measured (an entry of another folder of runs, such as a sweep's, after
    a colon); its folder's name (the entry's, in a folder of runs) where the run records no command."""
    if isinstance(metadata.get(SUITE_ENTRY_KEY), str) and metadata[SUITE_ENTRY_KEY]:
        return metadata[SUITE_ENTRY_KEY]
    command = metadata.get("command")
    try:
        words = shlex.split(command) if isinstance(command, str) else []
    except ValueError:  # unbalanced quotes: the words as written
        words = command.split()
    if not words:
        return entry
    program = next((i for i, word in enumerate(words) if PurePosixPath(word).name == "fp8bench"), None)
    arguments = words[program + 1 :] if program is not None else words  # a script: its name and arguments
    if program is not None and arguments[:1] in (["run"], ["gate"]):
        only = [value for name, value in zip(arguments, arguments[1:]) if name == "--only"]
        if in_suite:
            return entry
        if len(only) == 1:
            return only[0]
    identity = " ".join(_measured_options(arguments)) or run
    return f"{identity}: {entry}" if in_suite else identity


def _purpose(source: Path, metadata: dict[str, Any]) -> str:
    purpose = metadata.get(PURPOSE_KEY, "")
    if purpose != "" and purpose not in NOT_LATEST_PURPOSES:
        raise MalformedFile(
            source / METADATA_JSON,
            f"{PURPOSE_KEY} is {json_type_name(purpose)} ({purpose!r}); expected one of {', '.join(NOT_LATEST_PURPOSES)}",
        )
    return purpose


def _subfolders(folder: Path, exclude: Path | None) -> Iterator[Path]:
    for path in sorted(folder.iterdir()):
        if path.is_dir() and not path.name.startswith((".", "_")) and path.resolve() != exclude:
            yield path


def _fingerprint(source: Path) -> str:
    digest = hashlib.sha256((source / RESULTS_CSV).read_bytes())
    metadata = source / METADATA_JSON
    digest.update(b"\0" + (metadata.read_bytes() if metadata.is_file() else b""))
    return digest.hexdigest()


def _started(metadata: dict[str, Any]) -> pd.Timestamp | None:
    try:
        started = pd.Timestamp(metadata.get("started_utc"))
    except (TypeError, ValueError):
        return None
    if pd.isna(started):
        return None
    return started.tz_localize("UTC") if started.tz is None else started.tz_convert("UTC")


def _read_entry(model: str, run: str, entry: str, in_suite: bool, source: Path) -> EntryRun:
    """Raises ValueError or OSError for results the reports could not show."""
    rows = load_results(source)
    page_granularities(rows)  # an unknown granularity is this run's problem, found before any page is built
    metadata = read_metadata(source)
    return EntryRun(
        model, run, entry, in_suite, source, rows, metadata, _started(metadata), _fingerprint(source),
        series_of(run, entry, in_suite, metadata), _purpose(source, metadata),
    )  # fmt: skip


def _read_run(model: str, folder: Path, exclude: Path | None) -> tuple[Run | None, list[Skipped]]:
    try:
        sources = run_folders(folder)
    except FileNotFoundError:
        return None, [Skipped(folder, "holds no results.csv, nor entry folders with one")]
    is_suite = "" not in sources
    skipped = [
        Skipped(sub, "holds no results.csv")
        for sub in (_subfolders(folder, exclude) if is_suite else ())
        if sub.name not in sources
    ]
    entries = []
    for entry, source in sources.items():
        try:
            entries.append(_read_entry(model, folder.name, entry or folder.name, is_suite, source))
        except MalformedFile:
            raise  # an error, never a page: publish builds nothing from a tree holding one
        except (OSError, ValueError) as err:
            skipped.append(Skipped(source, str(err)))
    if not entries:
        return None, skipped
    gate, problem = None, ""
    if (folder / GATE_JSON).is_file():
        try:
            gate = GateResult.read(folder / GATE_JSON)
        except (OSError, ValueError) as err:
            problem = str(err)
    return Run(model, folder.name, folder, tuple(entries), is_suite, gate, problem), skipped


def read_tree(root: Path, exclude: Path | None = None) -> Tree:
    """Every run under root/<gpu-model>/ (`exclude`: a folder to leave out, such as the site being
    built). Raises ValueError for a root that is not a reports tree or holds no run at all."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder; publish takes a reports tree, <gpu-model>/<run>/results.csv")
    if (root / RESULTS_CSV).is_file():
        raise ValueError(f"{root} is a single run; publish takes the tree above it, <gpu-model>/<run>/results.csv")
    exclude = exclude.resolve() if exclude is not None else None
    models: dict[str, tuple[Run, ...]] = {}
    skipped: list[Skipped] = []
    for model_dir in _subfolders(root, exclude):
        if (model_dir / RESULTS_CSV).is_file():
            skipped.append(Skipped(model_dir, "holds a results.csv itself; runs go one level down, <gpu-model>/<run>/"))
        runs = []
        for folder in _subfolders(model_dir, exclude):
            run, problems = _read_run(model_dir.name, folder, exclude)
            skipped += problems
            if run is not None:
                runs.append(run)
        if runs:
            models[model_dir.name] = tuple(sorted(runs, key=lambda r: r.order, reverse=True))  # newest first
        elif not any(s.path.is_relative_to(model_dir) for s in skipped):
            skipped.append(Skipped(model_dir, "holds no run folders"))
    if not models:
        found = "".join(f"; skipped {s.path}: {s.reason}" for s in skipped)
        raise ValueError(f"no runs under {root}: expected {root}/<gpu-model>/<run>/results.csv{found}")
    return Tree(root, models, tuple(skipped))
