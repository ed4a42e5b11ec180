"""Which GPU time of a profiled stretch of work overlaps which, across CUDA streams: the compute stream's
idle time, and the collectives' time that no compute overlaps (exposed communication).

The compute stream is the stream with the most kernel time other than the collectives'. Its idle time is
the span from the first kernel's start to the last one's end, less the time it has a kernel running;
exposed communication is the time a collective runs (their union) while it has none. On several GPUs a
step grows by its kernels running slower beside the collectives and by this idle time, of which exposed
communication is the part a collective accounts for (the rest: the host launching too slowly, or waits).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from fp8bench.harness.timing import KernelRecord

Interval = tuple[float, float]


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of `intervals` as sorted, disjoint intervals."""
    union: list[Interval] = []
    for start, end in sorted(intervals):
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((start, end))
    return union


def length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def outside(intervals: Iterable[Interval], cover: Sequence[Interval]) -> float:
    """Length of the union of `intervals` not covered by `cover` (sorted and disjoint, as merged gives)."""
    starts = [start for start, _ in cover]
    total = 0.0
    for start, end in merged(intervals):
        covered = 0.0
        for c_start, c_end in cover[max(0, bisect.bisect_right(starts, start) - 1) : bisect.bisect_left(starts, end)]:
            covered += max(0.0, min(end, c_end) - max(start, c_start))
        total += end - start - covered
    return total


@dataclass(frozen=True)
class StreamOverlap:
    """The kernels of `steps` steps seen from their compute stream: which stream that is, the union of its
    kernels' intervals (ns), and per step, ms, its kernel time, its idle time over the span and the
    collectives' time while it was idle."""

    compute_stream: int
    busy: tuple[Interval, ...]
    steps: int
    compute_busy_ms: float
    compute_idle_ms: float
    exposed_comm_ms: float

    def exposed_ms(self, intervals: Iterable[Interval]) -> float:
        """Per step, ms: the union of `intervals` (ns) while the compute stream had no kernel running."""
        return outside(intervals, self.busy) * 1e-6 / self.steps


def compute_stream(records: Sequence[KernelRecord], is_collective: Callable[[str], bool]) -> int:
    """The stream with the most kernel time other than the collectives'."""
    per_stream: dict[int, int] = {}
    for record in records:
        if not is_collective(record.name):
            per_stream[record.stream] = per_stream.get(record.stream, 0) + record.duration_ns
    if not per_stream:
        raise ValueError("no kernel other than collectives': no compute stream")
    return max(per_stream, key=per_stream.get)


def stream_overlap(records: Sequence[KernelRecord], is_collective: Callable[[str], bool], steps: int = 1) -> StreamOverlap:
    """The overlap of `steps` steps' kernels (see the module docstring), per step."""
    stream = compute_stream(records, is_collective)
    busy = tuple(merged(record.span for record in records if record.stream == stream))
    collectives = [record.span for record in records if is_collective(record.name)]
    whole = max(record.span[1] for record in records) - min(record.start_ns for record in records)
    per_step_ms = 1e-6 / steps
    return StreamOverlap(stream, busy, steps, length(busy) * per_step_ms, (whole - length(busy)) * per_step_ms,
                         outside(collectives, busy) * per_step_ms)
