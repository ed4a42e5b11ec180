"""`fp8bench compare` and `fp8bench gate`: read run trees, refuse baselines from another GPU model,
compare entry by entry (statistics in fp8bench.gate.compare), re-run flagged cases once, write the outputs.

A gate measures each suite entry into <out>/<entry>/, compares it with <baseline>/<entry>/, and
measures every REGRESSION or INCONCLUSIVE case once more, whatever its benchmark, from its identity and with
the entry's settings (`remeasure`, beside its group's reference, into <out>/_reruns/<entry>/<case>/); the
fresh repeats join the first run's before the case is decided again. Exit codes: fp8bench.gate.compare.ExitCode, documented in docs/gating.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from fp8bench.gate import baseline as baselines
from fp8bench.gate.compare import (
    CaseComparison,
    CaseId,
    Comparison,
    EnvironmentPolicy,
    GateConfig,
    Metric,
    MetricGate,
    Outcome,
    RunSamples,
    compare_case,
    compare_runs,
    needs_rerun,
    run_samples,
)
from fp8bench.gate.output import Outputs, print_comparison, write_outputs
from fp8bench.harness.results import load_results
from fp8bench.harness.suite import SuiteEntry, load_suite
from fp8bench.harness.validate import MalformedFile, UsageError, usage_errors

Invoke = Callable[[list[str]], object]  # runs an fp8bench command line (argv without `fp8bench`)
Rerun = Callable[[str, CaseId], "Path | None"]  # measures one case again; its run folder, or None if it cannot
# Measures one case of a suite entry again from its identity, with the entry's own settings, into a fresh run
# folder; returns it, or None where the case cannot be re-run. The CLI gives it (fp8bench.harness.runner.rerun
# with the entry's benchmark): the gate imports no benchmark.
Remeasure = Callable[[SuiteEntry, CaseId, Path], "Path | None"]


# What a case compared across a timer, timing policy or library change says beside its outcome.
TIMED_DIFFERENTLY = "timed differently from the baseline"


def resolve_config(suite: Path | None, metric: str | None, fail_on_inconclusive: bool | None) -> GateConfig:
    """The suite's [gate] table (or the defaults), with the command line's choices on top."""
    config = GateConfig()
    with usage_errors():
        if suite is not None:
            table = load_suite(suite).raw.get("gate", {})
            try:
                config = GateConfig.from_table(table)
            except ValueError as err:
                raise MalformedFile(suite, str(err)) from None
        if metric is not None:
            try:
                config = replace(config, metric=Metric(metric.strip().lower()))
            except ValueError:
                raise ValueError(f"unknown metric {metric!r}; choose one of: {', '.join(m.value for m in Metric)}") from None
    if fail_on_inconclusive is not None:
        config = replace(config, fail_on_inconclusive=fail_on_inconclusive)
    return config


@dataclass(frozen=True)
class _Side:
    """One side of an entry's comparison: its samples, its metadata and the timers of its measured rows."""

    samples: RunSamples
    metadata: dict
    timers: frozenset[str]


def _side(run: Path | None, metric: Metric) -> _Side:
    if run is None:
        return _Side(RunSamples(metric, {}, {}), {}, frozenset())
    with usage_errors():
        frame = load_results(run)
        samples = run_samples(frame, metric)
        metadata = baselines.run_metadata_of(run)
    return _Side(samples, metadata, frozenset(frame.loc[frame["repeat_ms"] != "", "timer"]))


def _samples(run: Path, metric: Metric) -> RunSamples:
    return _side(run, metric).samples


def compare_trees(base: Path, new: Path, config: GateConfig, rerun: Rerun | None = None) -> Comparison:
    """Compare two runs, or two folders of suite runs entry by entry (see baseline.run_folders).

    Every file is read and checked before any is judged, so a malformed run is an error (exit 2), not
    a GPU mismatch or a comparison of what was left.
    """
    metric = config.metric
    gate = config.for_metric(metric)
    with usage_errors():
        base_runs, new_runs = baselines.run_folders(base), baselines.run_folders(new)
    if ("" in base_runs) != ("" in new_runs):
        raise UsageError(f"{base} and {new}: one is a single run and the other a folder of suite runs")
    entries = list(dict.fromkeys([*base_runs, *new_runs]))
    sides = {entry: (_side(base_runs.get(entry), metric), _side(new_runs.get(entry), metric)) for entry in entries}
    cases: list[CaseComparison] = []
    skipped = []
    notes: list[str] = []
    for entry in entries:
        where = f"run {entry!r}" if entry else str(new)
        base_side, new_side = sides[entry]
        differences = []
        if entry in base_runs and entry in new_runs:
            notes += baselines.check_same_gpu(base_side.metadata, new_side.metadata, where)
            differences = baselines.environment_differences(base_side.metadata, new_side.metadata, base_side.timers, new_side.timers)
        else:
            notes.append(f"{where} is only in the {'baseline' if entry in base_runs else 'new runs'}")
        if differences and config.environment_change is EnvironmentPolicy.REFUSE:
            raise baselines.IncompatibleBaseline(
                f"{where}: timed differently from the baseline ({'; '.join(differences)}); the gate table refuses "
                "such comparisons (environment_change = \"refuse\"): save a baseline timed as this run is"
            )
        entry_cases, entry_skipped = compare_runs(entry, base_side.samples, new_side.samples, gate)
        if rerun is not None:
            entry_cases = [
                _confirm(case, base_side.samples, new_side.samples, gate, rerun, notes) if needs_rerun(case.outcome) else case
                for case in entry_cases
            ]
        if differences:
            notes.append(f"{where}: timed differently from the baseline: {'; '.join(differences)}")
            entry_cases = [replace(case, note="; ".join(filter(None, (case.note, TIMED_DIFFERENTLY)))) for case in entry_cases]
        cases += entry_cases
        skipped += entry_skipped
    baseline_cases = sum(len(base_side.samples.samples) for base_side, _ in sides.values())
    return Comparison.build(metric, config, cases, skipped, baseline_cases, notes)


def _confirm(
    case: CaseComparison, base: RunSamples, new: RunSamples, gate: MetricGate, rerun: Rerun, notes: list[str]
) -> CaseComparison:
    """Measure a flagged case again and decide it anew (compare.judge_rerun)."""
    where = case.where
    fresh_run = rerun(case.run, case.case_id)
    if fresh_run is None:
        notes.append(f"{where}: {case.case_id.benchmark} cases cannot be re-run; decided on the first run")
        return case
    fresh = _samples(fresh_run, new.metric)
    # The re-run names its one shape by its dimensions (custom shape), whatever the suite called it.
    matches = [values for fresh_id, values in fresh.samples.items() if replace(fresh_id, case=case.case_id.case) == case.case_id]
    if len(matches) != 1:
        why = "; ".join(fresh.problems.values()) or "the case is missing"
        notes.append(f"{where}: the re-run in {fresh_run} gave no comparable measurement ({why}); decided on the first run")
        return case
    return compare_case(
        case.run, case.case_id, new.metric, base.samples[case.case_id], new.samples[case.case_id],
        gate.thresholds_for(case.label), fresh=matches[0],
    )


def gate(
    suite_path: Path,
    baseline: str,
    baseline_dir: Path,
    out: Path,
    config: GateConfig,
    device: Mapping[str, Any] | None,
    invoke: Invoke,
    runs: Path | None = None,
    rerun: bool = True,
    console: Console | None = None,
    remeasure: Remeasure | None = None,
) -> Comparison:
    """Run the suite into `out` (or take its runs from `runs`), then compare with the baseline.

    `device` is the CUDA device measuring here as run metadata records it (gpu_name, gpu_memory_gib:
    fp8bench.harness.env.gpu_metadata), None where there is none: then `runs` must be given and
    `rerun` off. The baseline is looked up for its GPU model before anything is measured.
    """
    with usage_errors():
        suite = load_suite(suite_path)
        if device is not None:
            model = baselines.gpu_model(device)
        elif runs is not None:
            model = baselines.tree_gpu_model(runs)
        else:
            raise ValueError("the gate needs a GPU to run the suite on, or --runs with the suite's runs")
    with usage_errors():
        base = baselines.resolve(baseline, baseline_dir, model)
    if runs is None:
        taken = [entry.name for entry in suite.entries if (out / entry.name).exists()]
        if taken:
            raise UsageError(f"{out} already holds {', '.join(taken)}; the gate measures into fresh folders (pass another --out)")
        for entry in suite.entries:
            if console is not None:
                console.rule(f"{suite.name}: {entry.name}")
            invoke(entry.argv(out))
    entries = {entry.name: entry for entry in suite.entries}

    def rerun_case(run: str, case_id: CaseId) -> Path | None:
        entry = entries.get(run)
        if entry is None or remeasure is None:
            return None
        if console is not None:
            console.rule(f"re-run: {run}/{case_id.label}")
        return remeasure(entry, case_id, out / "_reruns" / run / re.sub(r"[^A-Za-z0-9._-]+", "-", case_id.label))

    return compare_trees(base, runs or out, config, rerun_case if rerun else None)


def conclude(body: Callable[[], Comparison], outputs: Outputs, console: Console) -> int:
    """Run a comparison, print and write it, and return its exit code. Errors (UsageError,
    baseline.IncompatibleBaseline, MalformedFile) go to the command line's error adapter."""
    comparison = body()
    print_comparison(console, comparison)
    with usage_errors():
        for path in write_outputs(comparison, outputs):
            console.print(f"wrote {escape(str(path))}")
    if comparison.verdict is Outcome.INCONCLUSIVE and not comparison.fail_on_inconclusive:
        console.print("inconclusive cases do not fail the comparison; pass --fail-on-inconclusive to exit 3 on them")
    if comparison.verdict is Outcome.IMPROVEMENT:
        console.print("faster than the baseline: consider saving this run as the new one (fp8bench baseline save)")
    return int(comparison.exit_code)
