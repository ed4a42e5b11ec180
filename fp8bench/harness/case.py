"""The one case protocol every benchmark follows (after NVIDIA nvbench and FBGEMM's quantize bench).

A benchmark declares cases. A case is its identity (the result schema's id columns, every one of them a
plain value, never NaN, nothing hidden in `options`), its work per timed call (flops, bytes, tokens) and a
build step that returns what to time, or raises `Unsupported(reason)`. The harness (fp8bench.harness.runner)
runs every case of every benchmark the same way: the group's BF16 reference first, rows appended as they
finish, errors turned into `unsupported:` / `failed:` rows, throughput and speedup derived from the work, and
resume and Ctrl-C handled once. The gate re-runs a case from its identity (`Benchmark.case_from_identity`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class Unsupported(Exception):
    """Raised by a build step: this case cannot run here (backend missing, shape or recipe it lacks).
    Becomes an `unsupported: <reason>` row; the run goes on."""


class Failed(Exception):
    """Raised by a check: the case ran but its result is wrong. Becomes a `failed: <reason>` row."""


@dataclass(frozen=True)
class Work:
    """What one timed call does; the harness derives TFLOPS, GB/s and tokens/s from it and the time."""

    flops: float = 0.0
    bytes: float = 0.0
    tokens: float = 0.0


@dataclass
class Built:
    """A case ready to time. `run` is the timed callable (one GEMM, one cast, one layer or training step).
    `options` are recorded in the row (the kernel config chosen: facts about the run, not identity).
    `check`, called once after timing, returns further columns (rel_err, SQNR, loss, memory) or raises
    Failed. `release` frees what the build allocated."""

    run: Callable[[], Any]
    options: dict[str, Any] = field(default_factory=dict)
    check: Callable[[], Mapping[str, Any]] | None = None
    release: Callable[[], None] | None = None


class Case(Protocol):
    identity: Mapping[str, Any]  # the schema's id columns (fp8bench.harness.results.ID_COLUMNS)
    work: Work
    group: Hashable  # cases of one group share their inputs and their BF16 reference
    is_reference: bool  # the BF16 reference of its group: measured first, divides every speedup

    def build(self, inputs: Any) -> Built: ...


class Benchmark(Protocol):
    name: str  # the `benchmark` column

    def inputs(self, group: Hashable) -> Any:
        """Allocate what a group's cases share (random inputs, never zeros); may raise out of memory."""

    def case_from_identity(self, identity: Mapping[str, Any]) -> Case:
        """The case a result row names, for re-running it (the gate); ValueError if it names none."""

