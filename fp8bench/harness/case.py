"""The one case protocol every benchmark follows (after NVIDIA nvbench and FBGEMM's quantize bench).

A benchmark declares cases. A case is its identity (the result schema's id columns but `options`, every
one of them a plain value, never NaN), the options its rows record whatever happens to it, its work per
timed call (flops, bytes, tokens) and a build step that returns what to time, or raises
`Unsupported(reason)`. The harness (fp8bench.harness.runner.run_cases) runs every case of every benchmark
the same way:

- cases are grouped (`Case.group`); a group's inputs are allocated once (`Benchmark.inputs`);
- the group's reference (`Case.is_reference`, e.g. the BF16 product) is measured first and, when the
  benchmark brackets it, once more after the group's other cases: the speedup divides the geometric mean
  of the two, so a clock step between the reference and the FP8 cases cancels;
- each case: `build(inputs)` -> `Built`; its `run` is timed by the run's clock, or its `measure()`
  measures it where the case times itself (training steps: warm-up, timed steps, a profiled step); then
  `check()` gives further columns or raises `Failed`; then, where the benchmark judges a case against its
  group's reference row (`Benchmark.against_reference`: e2e's mean loss against BF16's), further columns
  or `Failed`; `release()` frees what the build made;
- the harness derives tflops (work.flops), gbps (work.bytes), tokens_per_s (work.tokens), pct_peak
  (`Benchmark.peak`) and speedup_vs_bf16 (reference time / this time, same group, same run) and turns
  errors into rows: `unsupported: <reason>`, `failed: <reason>`, `failed: out of memory`,
  `failed: <Type>: <first line>`;
- rows are appended as they finish; Ctrl-C keeps them; a resumed run keeps finished groups.

The gate re-runs a case from its identity: `Benchmark.case_from_identity(identity)`, with the reference
of its group (`Benchmark.reference_of(case)`) measured beside it (fp8bench.harness.runner.rerun).

What a benchmark provides, in full (fp8bench.benchmarks.matmul is the shortest example):
- each case: `identity` (dict of the id columns but `options`: benchmark, case, M, K, N, granularity,
  backend, recipe, fast_accum and any the benchmark adds), `options` (dict; optional: none recorded),
  `work` (Work), `group` (hashable), `is_reference` (bool), `build(inputs) -> Built` (raises Unsupported);
- `Built(run, options={}, check=None, release=None, measure=None)`; `check()` returns columns or raises
  `Failed(reason, columns={})`; `measure()` returns the case's Measurement (then no clock times it);
- the benchmark: `name`, `inputs(group)`, `case_from_identity(identity)`, `reference_of(case)` (for
  re-runs); optional, with these defaults: `speedup_vs_reference` (True), `bracket_reference` (False),
  `peak(case, reference_row_values) -> Peak | None` (none), `against_reference(case, values,
  reference_row_values) -> columns` (none; may raise Failed);
- running it: `run_cases(benchmark, cases, writer, clock, timing, on_row)` (fp8bench.harness.runner).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fp8bench.harness.timing import Measurement


class Unsupported(Exception):
    """Raised by a build step: this case cannot run here (backend missing, shape or recipe it lacks).
    Becomes an `unsupported: <reason>` row; the run goes on."""


class Failed(Exception):
    """Raised by a check: the case ran but its result is wrong. Becomes a `failed: <reason>` row with
    `columns` (e.g. the error that condemned it) and no time: a wrong result's time measures nothing."""

    def __init__(self, reason: str, columns: Mapping[str, Any] | None = None):
        super().__init__(reason)
        self.columns = dict(columns or {})


@dataclass(frozen=True)
class Work:
    """What one timed call does; the harness derives TFLOPS, GB/s and tokens/s from it and the time.
    Zero: the column stays empty."""

    flops: float = 0.0
    bytes: float = 0.0
    tokens: float = 0.0

    def __post_init__(self) -> None:
        if min(self.flops, self.bytes, self.tokens) < 0:
            raise ValueError(f"work cannot be negative: {self}")


@dataclass
class Built:
    """A case ready to time. `run` is the timed callable (one GEMM, one cast, one layer or training step).
    `options` are recorded in the row beside the case's own (the kernel config chosen: facts about the
    run, not identity); `check` may add to them. `check`, called once after timing, returns further
    columns (rel_err, SQNR, loss, memory) or raises Failed. `release` frees what the build allocated.
    `measure`, where set, measures `run` in place of the run's clock: for a case whose measurement is more
    than repeated calls (warm-up steps, timed steps, a wall-time and a profiled step)."""

    run: Callable[[], Any]
    options: dict[str, Any] = field(default_factory=dict)
    check: Callable[[], Mapping[str, Any]] | None = None
    release: Callable[[], None] | None = None
    measure: Callable[[], "Measurement"] | None = None


class Case(Protocol):
    identity: Mapping[str, Any]  # the schema's id columns (fp8bench.harness.results.ID_COLUMNS) but `options`
    options: Mapping[str, Any]  # recorded in every row of the case, whatever its status (optional)
    work: Work
    group: Hashable  # cases of one group share their inputs and their reference
    is_reference: bool  # the reference of its group: measured first, divides every speedup

    def build(self, inputs: Any) -> Built: ...


@dataclass(frozen=True)
class Peak:
    """What a case's pct_peak divides: its `column` (tflops or gbps) at 100%."""

    column: str
    value: float

    def __post_init__(self) -> None:
        if self.column not in ("tflops", "gbps") or not self.value > 0:
            raise ValueError(f"a peak is a positive tflops or gbps, got {self.column}={self.value}")


class Benchmark(Protocol):
    name: str  # the `benchmark` column
    # Whether rows carry speedup_vs_bf16 against the group's reference (False where the reference is a
    # ceiling, not a BF16 step: the cast benchmark's copy). Optional: True.
    speedup_vs_reference: bool
    # Whether the reference is measured again after the group's other cases (the speedup divides the
    # geometric mean of both): where building the reference again costs little. Optional: False.
    bracket_reference: bool

    def inputs(self, group: Hashable) -> Any:
        """Allocate what a group's cases share (random inputs, never zeros); may raise out of memory."""

    def peak(self, case: Case, reference: Mapping[str, Any] | None) -> Peak | None:
        """What the case's pct_peak divides (the GPU's dense peak, or the reference row's throughput), or
        None. Optional: no pct_peak."""

    def against_reference(self, case: Case, values: Mapping[str, Any], reference: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """Columns of a measured case that come from its group's reference row (`reference`: that row's
        values; None for the reference itself, or where the reference has no time), or Failed where the
        case's result disagrees with the reference's. Optional: none."""

    def case_from_identity(self, identity: Mapping[str, Any]) -> Case:
        """The case a result row names, for re-running it (the gate); ValueError if it names none."""

    def reference_of(self, case: Case) -> Case:
        """The reference case of `case`'s group (for a re-run: its speedup needs it)."""
