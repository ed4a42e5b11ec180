"""The one run loop: every benchmark's cases (fp8bench.harness.case) become result rows here.

`run_cases` groups the cases, allocates each group's inputs once, measures the group's reference first
(and, where the benchmark brackets it, again after the group's other cases), then every other case:
build, time `run` with the clock (or the case's own `measure`), `check`, judge it against the group's
reference row where the benchmark does, derive throughput, % of peak and speedup, and append the row to
the run's CSV. Errors become rows and the run goes on; Ctrl-C stops it with every written row kept.
`resume` narrows a run to the groups a run folder has not finished (`unfinished` says which, read-only);
`rerun` measures cases named by result rows again (the gate).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fp8bench.config import Status, TimingConfig
from fp8bench.harness.case import Benchmark, Built, Case, Failed, Unsupported
from fp8bench.harness.results import (
    CASE_KEY,
    Row,
    RunWriter,
    keep_rows,
    measurement_values,
    read_rows,
    status_text,
)
from fp8bench.harness.timing import Measurement, bracketed

OUT_OF_MEMORY = "out of memory"
REASON_CHARS = 200


class Clock(Protocol):
    """What times a case: fp8bench.harness.timing.TimerChoice, or OneTimer (one timer for every case; fakes on the CPU).
    `begin_group` comes before each group's cases, which are compared with each other (one timer for them)."""

    def begin_group(self) -> None: ...

    def measure(self, fn: Callable[[], object], config: TimingConfig) -> Measurement: ...


class Discard:
    """The writer of a process whose rows another records (the ranks but rank 0 of a torchrun launch: every
    rank runs every case, the collectives need them all)."""

    def append(self, row: Row) -> None:
        pass


def case_key(values: Mapping[str, Any]) -> tuple[str, ...]:
    """A case's identity as the CSV spells it (ints and strings alike as text, an id column a benchmark
    does not use as the empty cell), options left out."""
    return tuple(str(values.get(column, "")) for column in CASE_KEY)


def _options(case: Case) -> dict[str, Any]:
    return dict(getattr(case, "options", {}))  # optional in the protocol: none recorded


def _first_line(err: BaseException) -> str:
    """The error's first line, with the next where the first only introduces it (torch.compile's
    `BackendCompilerFailed: backend='inductor' raised:` names its cause on the second)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


def _failure(err: BaseException) -> str:
    return f"{type(err).__name__}: {_first_line(err)}"[:REASON_CHARS]


def _is_out_of_memory(err: BaseException) -> bool:
    import torch

    return isinstance(err, torch.cuda.OutOfMemoryError)


def _free_memory(collect: bool = False) -> None:
    """Give the allocator's cached blocks back; `collect`: first collect what a broken case left in reference
    cycles (a build that failed half-way, e.g. a model FSDP2 had begun to shard, frees nothing by itself)."""
    import gc

    import torch

    if collect:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def case_row(benchmark: Benchmark, case: Case, status: str, options: Mapping[str, Any] | None = None, values: Mapping[str, Any] = {}) -> Row:
    """A row of `case`: its identity, options (the case's when not given), status and further values."""
    options = _options(case) if options is None else options
    return Row({**case.identity, "benchmark": benchmark.name, "options": json.dumps(dict(options), sort_keys=True),
                "status": status, **values})  # fmt: skip


def measured_values(case: Case, measurement: Measurement) -> dict[str, Any]:
    """The measured columns and the throughputs the case's work gives."""
    values: dict[str, Any] = measurement_values(measurement)
    seconds = measurement.median_ms * 1e-3
    for column, amount, unit in (("tflops", case.work.flops, 1e12), ("gbps", case.work.bytes, 1e9), ("tokens_per_s", case.work.tokens, 1.0)):
        values[column] = amount / seconds / unit if amount else None
    return values


def measured_row(
    benchmark: Benchmark, case: Case, measurement: Measurement, reference: Mapping[str, Any] | None = None,
    reference_ms: float | None = None, options: Mapping[str, Any] | None = None, columns: Mapping[str, Any] = {},
) -> Row:  # fmt: skip
    """The `ok` row of a measured case (also what synthetic runs in tests are made of): `reference` is the
    group's reference row's values (for a peak the benchmark takes from it), `reference_ms` its time."""
    row = case_row(benchmark, case, status_text(Status.OK), options, {**measured_values(case, measurement), **columns})
    return _finish(benchmark, case, _Measured(row, measurement), reference, reference_ms)


@dataclass
class _Measured:
    """A case's outcome before its reference is known: the row, and its measurement (None: no time)."""

    row: Row
    measurement: Measurement | None = None

    @property
    def median_ms(self) -> float | None:
        return self.measurement.median_ms if self.measurement else None


def _measure(built: Built, clock: Clock | None, timing: TimingConfig) -> Measurement:
    if built.measure is not None:
        return built.measure()
    if clock is None:
        raise ValueError("this run has no clock and the case does not measure itself")
    return clock.measure(built.run, timing)


def _measure_case(
    benchmark: Benchmark, case: Case, inputs: Any, clock: Clock | None, timing: TimingConfig, reference: Mapping[str, Any] | None = None
) -> _Measured:
    """`reference`: the values of the group's measured reference row (None for the reference itself)."""
    options = _options(case)
    built = None
    broken = False
    try:
        built = case.build(inputs)
        measurement = _measure(built, clock, timing)
        values = measured_values(case, measurement)
        try:
            values.update(built.check() if built.check else {})
            if hasattr(benchmark, "against_reference"):
                values.update(benchmark.against_reference(case, values, reference))
        except Failed as failed:  # the time of a wrong result is no measurement of the case: none is published
            options.update(built.options)
            return _Measured(case_row(benchmark, case, status_text(Status.FAILED, str(failed)), options, failed.columns))
        options.update(built.options)
        return _Measured(case_row(benchmark, case, status_text(Status.OK), options, values), measurement)
    except Unsupported as err:
        return _Measured(case_row(benchmark, case, status_text(Status.UNSUPPORTED, str(err)), options))
    except Exception as err:  # noqa: BLE001 - one broken case must not end the run; its row says why
        broken = True
        if built is not None:
            options.update(built.options)
        reason = OUT_OF_MEMORY if _is_out_of_memory(err) else _failure(err)
        return _Measured(case_row(benchmark, case, status_text(Status.FAILED, reason), options))
    finally:
        if built is not None and built.release is not None:
            built.release()
        del built
        _free_memory(collect=broken)


def _finish(benchmark: Benchmark, case: Case, measured: _Measured, reference: Mapping[str, Any] | None, reference_ms: float | None) -> Row:
    """The derived columns that need the group's reference: pct_peak and speedup_vs_bf16."""
    values = measured.row.values
    if measured.median_ms is None:
        return measured.row
    peak = benchmark.peak(case, reference) if hasattr(benchmark, "peak") else None
    if peak is not None and values.get(peak.column) is not None:
        values["pct_peak"] = 100.0 * values[peak.column] / peak.value
    if getattr(benchmark, "speedup_vs_reference", True) and reference_ms:
        values["speedup_vs_bf16"] = reference_ms / measured.median_ms
        if values.get("predicted_speedup"):  # a row beside the roofline model's prediction
            values["measured_vs_predicted"] = values["speedup_vs_bf16"] / values["predicted_speedup"]
    return measured.row


def _groups(cases: Iterable[Case]) -> dict[Hashable, list[Case]]:
    """Cases by group, in the order given, each group's reference first."""
    groups: dict[Hashable, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.group, []).append(case)
    for members in groups.values():
        references = [case for case in members if case.is_reference]
        if len(references) > 1:
            raise ValueError(f"group {members[0].group!r} has {len(references)} reference cases; it needs at most one")
        members.sort(key=lambda case: not case.is_reference)
    return groups


def run_cases(
    benchmark: Benchmark,
    cases: Iterable[Case],
    writer: RunWriter | Discard,
    clock: Clock | None,
    timing: TimingConfig,
    on_row: Callable[[Row], None] = lambda row: None,
) -> list[Row]:
    """Measure `cases`, group by group, appending each row to `writer` (flushed) as it finishes.

    A group's inputs are allocated once (out of memory there: every case of the group is a
    `failed: out of memory allocating the inputs` row). Where the benchmark brackets its reference, a
    group's rows are written together once the reference's second measurement ends: their speedups
    divide the geometric mean of both (reference_before_ms, reference_after_ms). KeyboardInterrupt
    propagates after the finished rows are written.
    """
    rows: list[Row] = []

    def emit(row: Row) -> None:
        writer.append(row)
        rows.append(row)
        on_row(row)

    for members in _groups(cases).values():
        try:
            inputs = benchmark.inputs(members[0].group)
        except Exception as err:  # noqa: BLE001 - a group that cannot start fails its rows, the run goes on
            reason = f"{OUT_OF_MEMORY} allocating the inputs" if _is_out_of_memory(err) else _failure(err)
            for case in members:
                emit(case_row(benchmark, case, status_text(Status.FAILED, reason)))
            _free_memory()
            continue
        try:
            _run_group(benchmark, members, inputs, clock, timing, emit)
        finally:
            del inputs
            _free_memory()
    return rows


def _run_group(benchmark: Benchmark, members: Sequence[Case], inputs: Any, clock: Clock | None, timing: TimingConfig, emit) -> None:
    if clock is not None:
        clock.begin_group()
    reference_case = members[0] if members[0].is_reference else None
    others = members[1:] if reference_case else members
    reference = _measure_case(benchmark, reference_case, inputs, clock, timing) if reference_case else None
    measured_reference = reference.row.values if reference is not None and reference.median_ms is not None else None
    bracket = measured_reference is not None and getattr(benchmark, "bracket_reference", False) and others
    if not bracket:
        reference_values = reference.row.values if reference else None
        reference_ms = reference.median_ms if reference else None
        if reference:
            emit(_finish(benchmark, reference_case, reference, None, None))
        for case in others:
            outcome = _measure_case(benchmark, case, inputs, clock, timing, measured_reference)
            emit(_finish(benchmark, case, outcome, reference_values, reference_ms))
        return
    measured = [(case, _measure_case(benchmark, case, inputs, clock, timing, measured_reference)) for case in others]
    after = _measure_case(benchmark, reference_case, inputs, clock, timing)
    brackets = {"reference_before_ms": reference.median_ms, "reference_after_ms": after.median_ms}
    if after.measurement is not None:  # the reference's row and every speedup: both measurements as one
        reference.measurement = bracketed(reference.measurement, after.measurement)
        reference.row.values.update(measured_values(reference_case, reference.measurement))
    reference.row.values.update(brackets)
    emit(_finish(benchmark, reference_case, reference, None, None))
    for case, outcome in measured:
        outcome.row.values.update(brackets)
        emit(_finish(benchmark, case, outcome, reference.row.values, reference.median_ms))


def resume(cases: Sequence[Case], run_dir: Path, keep: Callable[[Mapping[str, str]], bool] = lambda row: False) -> list[Case]:
    """The cases of `cases` a run in `run_dir` has not finished, a group at a time (a group's reference and
    other cases are measured together, so a half-done group is measured again). Its CSV is rewritten
    atomically with the rows of the finished groups and those `keep` accepts (e.g. predictions)."""
    left = unfinished(cases, run_dir)
    left_groups = {case.group for case in left}
    finished_keys = {case_key(c.identity) for c in cases if c.group not in left_groups}
    keep_rows(run_dir, lambda row: case_key(row) in finished_keys or keep(row))
    return left


def unfinished(cases: Sequence[Case], run_dir: Path) -> list[Case]:
    """The cases of `cases` whose group the run in `run_dir` has not finished (every case of it a row);
    reads the run, writes nothing."""
    present = {case_key(row) for row in read_rows(run_dir)}
    finished = {group for group, members in _groups(cases).items() if all(case_key(c.identity) in present for c in members)}
    return [case for case in cases if case.group not in finished]


def rerun(
    identities: Iterable[Mapping[str, Any]],
    writer: RunWriter | Discard,
    benchmarks: Mapping[str, Benchmark],
    clock: Clock | None,
    timing: TimingConfig,
    on_row: Callable[[Row], None] = lambda row: None,
) -> list[Row]:
    """Measure again the cases result rows name (`identities`: their id columns), each beside the reference
    of its group, through the same loop; `benchmarks` by name (the caller builds them: the harness knows no
    benchmark). ValueError for a row of a benchmark not given or naming no case."""
    by_benchmark: dict[str, list[Case]] = {}
    for identity in identities:
        name = str(identity["benchmark"])
        if name not in benchmarks:
            raise ValueError(f"cannot re-run {name} cases here; re-runnable: {', '.join(benchmarks) or 'none'}")
        case = benchmarks[name].case_from_identity(identity)
        chosen = by_benchmark.setdefault(name, [])
        for needed in (benchmarks[name].reference_of(case), case):
            if case_key(needed.identity) not in {case_key(c.identity) for c in chosen}:
                chosen.append(needed)
    rows: list[Row] = []
    for name, cases in by_benchmark.items():
        rows += run_cases(benchmarks[name], cases, writer, clock, timing, on_row)
    return rows
