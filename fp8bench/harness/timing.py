"""The timing harness: the one place that times GPU work.

A measurement is a number of independent *repeats*. Each repeat warms up (runs that are discarded),
then takes timed *samples*, each preceded by an L2 flush so every sample starts from cold cache; the
repeat is summarised by its median. Before the first repeat the work runs untimed for `settle_ms`, so
clocks and power reach the state they hold under load. Warm-up and settling run exactly what the samples
run, flush included: back-to-back calls without the flush draw more power than the timed sequence, push
a power-capped GPU into throttling, and the samples then catch its clock recovering (an H100 measured
4096^3 FP8 at 1400-1875 MHz that way, at a steady 1980 MHz when settled on flushed calls).

A repeat's samples run for `samples_ms` of wall time (kernel plus flush). When any of the SM clock reads
spread over the settle is below `throttled_below` of the GPU's maximum, the power cap is steering the clock, which swings with a
period near one second; a repeat then runs `throttled_samples_ms` so that it spans that swing instead of
sampling one phase of it (docs/timing.md has the trace). The case's time is the median of the repeat
medians; the spread is their interquartile range over that median (asv's statistic: one odd repeat does
not dominate it), and `repeat_ms` keeps every repeat for anyone who wants another statistic. Comparisons (fp8bench.gate.compare) treat the repeat as the unit.

A card that has just come under its cap keeps heating, and its clock keeps sinking, for seconds after
the settle: the first capped case of a run drifts from repeat to repeat. So the harness stops on a
stable window, as nvbench stops on convergence: while the last `repeats` repeats spread more than
`stable_spread_pct`, it takes another repeat and drops the oldest, at most `max_dropped_repeats` times.
The dropped count is stored (`dropped_repeats`), and a case that never settled keeps its wide spread.
It also stops early, as nvbench does on reaching its noise target: once `min_repeats` repeats spread at
most `converged_spread_pct`, the case ends there (the row's `repeats` says how many it took).

Timers:
- `cuda-events`: a CUDA event pair around each sample, all recorded before one synchronize
  (what triton.testing.do_bench does). Right for kernels well above launch overhead.
- `cupti`: kernel durations from torch.profiler (CUPTI), summed per sample. Launch gaps and host
  overhead vanish, so this is the kernel time of short or multi-kernel work.
`auto` takes events unless a first estimate is under `CUPTI_BELOW_MS` or the host's launches would
keep the GPU waiting (`LAUNCH_BOUND_FRACTION`). Within a group of cases compared side by side (one shape's
backends, begun with `begin_group`), the group's first case picks for all of them, with CUPTI under
`GROUP_CUPTI_BELOW_MS`: one timer per comparison, whichever backend launches slowly.
Wall time (host clock around one synchronized call) is measured beside either.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from fp8bench.config import TimingConfig

CUPTI_BELOW_MS = 0.05
# `auto` also takes CUPTI when enqueueing one flushed call costs the host at least this fraction of what the
# GPU spends on it: the GPU then waits on the launches and an event pair would time the wait (Triton's
# Python launcher made 1024^3 read 0.04 ms by events where its kernel runs 0.009 ms).
LAUNCH_BOUND_FRACTION = 0.5
# A group's first case (its reference: the BF16 product of a matmul shape) picks CUPTI for the group under
# this: its FP8 cases take about half as long, where our Triton launcher's 0.1-0.2 ms of host time a launch
# can keep the GPU waiting, and a timer picked per case gave one shape's cuBLAS and ours different timers.
GROUP_CUPTI_BELOW_MS = 1.0
# Clock reads spread over the settle, to tell a capped clock from one at its maximum.
SETTLE_CLOCK_READS = 4
# Wall time is a median of synchronized calls: at least 3, at most 20, as many as `wall_ms_budget` holds.
WALL_MIN_CALLS = 3
WALL_MAX_CALLS = 20
TIMER_CHOICES = ("auto", "cuda-events", "cupti")


@dataclass(frozen=True)
class Measurement:
    repeat_ms: tuple[float, ...]  # each repeat's median
    samples: int  # per repeat
    wall_ms: float
    timer: str
    sm_clock_mhz: tuple[float, ...]  # one sample per repeat; empty when unknown
    throttled: bool = False  # a clock read during the settle was below TimingConfig.throttled_below of the maximum
    dropped_repeats: int = 0  # earlier repeats dropped while the window was still drifting

    @property
    def median_ms(self) -> float:
        return statistics.median(self.repeat_ms)

    @property
    def spread_pct(self) -> float:
        return spread_pct(self.repeat_ms)

    @property
    def sm_clock_median(self) -> float | None:
        return statistics.median(self.sm_clock_mhz) if self.sm_clock_mhz else None

    @property
    def sm_clock_min(self) -> float | None:
        return min(self.sm_clock_mhz) if self.sm_clock_mhz else None


def bracketed(before: Measurement, after: Measurement) -> Measurement:
    """A reference measured before and after its group's other cases, as one measurement: repeat i is the
    geometric mean of both measurements' repeat i (as many as the shorter has), so that a comparison
    pairing repeats (fp8bench.gate.compare) sees what the speedup divides. A clock step between the
    reference and the group's cases moves the after half only: its effect on speedups halves, and a linear
    drift over the group cancels."""
    pairs = min(len(before.repeat_ms), len(after.repeat_ms))
    return Measurement(
        repeat_ms=tuple(math.sqrt(b * a) for b, a in zip(before.repeat_ms[:pairs], after.repeat_ms[:pairs])),
        samples=before.samples,
        wall_ms=math.sqrt(before.wall_ms * after.wall_ms),
        timer=before.timer,
        sm_clock_mhz=before.sm_clock_mhz + after.sm_clock_mhz,
        throttled=before.throttled or after.throttled,
        dropped_repeats=before.dropped_repeats + after.dropped_repeats,
    )


def spread_pct(repeat_ms: Sequence[float]) -> float:
    """Interquartile range of the repeat medians over their median, in %."""
    if len(repeat_ms) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(repeat_ms, n=4, method="inclusive")
    return 100.0 * (q3 - q1) / statistics.median(repeat_ms)


class Timer(Protocol):
    """What the harness needs from a clock; fakes implement it for CPU tests."""

    name: str
    sample_overhead_ms: float  # what each sample adds to `fn`'s own time: the L2 flush

    def run(self, fn: Callable[[], object], calls: int) -> None:
        """Run `fn` untimed (warm-up), each call preceded by the flush the samples have."""

    def samples(self, fn: Callable[[], object], count: int) -> list[float]:
        """`count` flushed, timed calls; milliseconds of GPU time each."""

    def estimate_ms(self, fn: Callable[[], object], count: int) -> float:
        """Median time of `count` flushed calls, to size warm-up and sample counts (may be coarser)."""

    def wall_ms(self, fn: Callable[[], object], count: int) -> float:
        """Median host time of a flushed, synchronized call."""

    def sm_clock_mhz(self) -> float | None:
        """The SM clock now, or None where it cannot be read."""

    def max_sm_clock_mhz(self) -> float | None:
        """The GPU's highest SM clock, or None where it cannot be read."""


def measure(fn: Callable[[], object], config: TimingConfig, timer: Timer, first_estimate_ms: float | None = None) -> Measurement:
    """Time `fn` by repeats of warm-up + flushed samples (see the module docstring). `first_estimate_ms`:
    an estimate made after `fn`'s first call (TimerChoice makes one to pick the timer), saving both here."""
    if first_estimate_ms is None:
        timer.run(fn, 1)  # first call: compilation, autotuning, handle creation
        first_estimate_ms = timer.estimate_ms(fn, 3)
    per_call = max(first_estimate_ms, 1e-3)
    settle_calls = max(1, math.ceil(config.settle_ms / (per_call + timer.sample_overhead_ms)))
    settle_clocks = []
    for chunk in _split(settle_calls, SETTLE_CLOCK_READS):
        timer.run(fn, chunk)
        settle_clocks.append(timer.sm_clock_mhz())
    # Estimated again once settled: the first estimate can still carry start-up costs, and warm-up and
    # sample counts sized from it would be too small.
    per_call = max(timer.estimate_ms(fn, 3), 1e-3)
    throttled = _throttled([c for c in settle_clocks if c is not None], timer.max_sm_clock_mhz(), config.throttled_below)
    window_ms = config.throttled_samples_ms if throttled else config.samples_ms
    per_sample = per_call + timer.sample_overhead_ms
    warmup_calls = max(1, math.ceil(config.warmup_ms / per_sample))
    count = min(config.max_samples, max(config.min_samples, math.ceil(window_ms / per_sample)))
    repeat_ms: list[float] = []
    clocks: list[float | None] = []
    dropped = 0
    while True:
        timer.run(fn, warmup_calls)
        repeat_ms.append(statistics.median(timer.samples(fn, count)))
        clocks.append(timer.sm_clock_mhz())
        if len(repeat_ms) > config.repeats:
            del repeat_ms[0], clocks[0]
            dropped += 1
        spread = spread_pct(repeat_ms)
        if len(repeat_ms) >= config.min_repeats and spread <= config.converged_spread_pct:
            break
        if len(repeat_ms) == config.repeats and (spread <= config.stable_spread_pct or dropped == config.max_dropped_repeats):
            break
    wall = timer.wall_ms(fn, max(WALL_MIN_CALLS, min(WALL_MAX_CALLS, math.ceil(config.wall_ms_budget / per_sample))))
    sampled_clocks = tuple(c for c in clocks if c is not None)
    return Measurement(tuple(repeat_ms), count, wall, timer.name, sampled_clocks, throttled, dropped)


def _split(calls: int, parts: int) -> list[int]:
    """`calls` in at most `parts` non-empty chunks."""
    parts = min(parts, calls)
    return [calls // parts + (i < calls % parts) for i in range(parts)]


def _throttled(clocks: Sequence[float], max_clock: float | None, below: float) -> bool:
    """Whether the power cap steers the clock: any read during the settle under `below` of the maximum.
    One read is not enough: the capped clock swings up to the maximum for part of each period."""
    return bool(clocks) and bool(max_clock) and min(clocks) < below * max_clock


class _Nvml:
    """SM clock reads through NVML; absent NVML means no clock column, not a failure."""

    def __init__(self, device_index: int):
        try:
            import pynvml

            pynvml.nvmlInit()
            self._pynvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:  # noqa: BLE001 - any NVML problem just disables clock sampling
            self._pynvml = None

    def sm_clock_mhz(self) -> float | None:
        if self._pynvml is None:
            return None
        return float(self._pynvml.nvmlDeviceGetClockInfo(self._handle, self._pynvml.NVML_CLOCK_SM))

    def max_sm_clock_mhz(self) -> float | None:
        if self._pynvml is None:
            return None
        return float(self._pynvml.nvmlDeviceGetMaxClockInfo(self._handle, self._pynvml.NVML_CLOCK_SM))


def recorded_calls(fn: Callable[[], object], count: int, before: Callable[[], object] | None = None) -> list[tuple]:
    """`count` calls of `fn` on the current CUDA stream, each between a (start, end) pair of CUDA events, with
    `before` (an L2 flush) run ahead of each pair; not waited for (elapsed_ms reads them)."""
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    for start, end in events:
        if before is not None:
            before()
        start.record()
        fn()
        end.record()
    return events


def elapsed_ms(events: Sequence[tuple]) -> list[float]:
    """The ms between each (start, end) pair of recorded_calls, once the GPU has passed them."""
    import torch

    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


class GpuClock:
    """What both CUDA timers share: the L2-flush buffer (several times L2) and the NVML handle."""

    def __init__(self, flush_l2: bool = True):
        import torch

        self.torch = torch
        device = torch.cuda.current_device()
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        words = max(256 * 2**20, 4 * l2_bytes) // 4 if flush_l2 else 0
        self.flush_buffer = torch.empty(words, dtype=torch.int32, device="cuda") if words else None
        self.nvml = _Nvml(device)
        self.flush_ms = self._time_flush() if words else 0.0

    def _time_flush(self) -> float:
        cuda = self.torch.cuda
        self.flush_buffer.bitwise_not_()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            self.flush_buffer.bitwise_not_()
        end.record()
        cuda.synchronize()
        return start.elapsed_time(end) / 10


class CudaEventTimer:
    """CUDA-event sample timing, plus the L2 flush, warm-up, wall time and clock both timers share."""

    name = "cuda-events"
    # The flush is a bitwise_not over a buffer several times L2: its kernel name is one that
    # benchmarked code does not launch, so the CUPTI timer can tell flushes from work.
    FLUSH_KERNEL_TAG = "bitwise_not"

    def __init__(self, gpu: GpuClock):
        self._torch = gpu.torch
        self._flush_buffer = gpu.flush_buffer
        self._nvml = gpu.nvml
        self.sample_overhead_ms = gpu.flush_ms

    def _flush(self) -> None:
        if self._flush_buffer is not None:
            self._flush_buffer.bitwise_not_()

    def run(self, fn: Callable[[], object], calls: int) -> None:
        for _ in range(calls):
            self._flush()
            fn()
        self._torch.cuda.synchronize()

    def samples(self, fn: Callable[[], object], count: int) -> list[float]:
        return elapsed_ms(recorded_calls(fn, count, self._flush))

    def estimate_ms(self, fn: Callable[[], object], count: int) -> float:
        # Events for both timers: starting a profiler costs the CUPTI timer ~0.1 s of set-up and parsing, and
        # an estimate only sizes counts (events read a tiny kernel a little long, so its counts come out lower).
        return statistics.median(CudaEventTimer.samples(self, fn, count))

    def enqueue_ms(self, fn: Callable[[], object], count: int) -> float:
        """Median host time to enqueue one flushed call, without waiting for the GPU."""
        times = []
        self._torch.cuda.synchronize()
        for _ in range(count):
            start = time.perf_counter()
            self._flush()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        self._torch.cuda.synchronize()
        return statistics.median(times)

    def wall_ms(self, fn: Callable[[], object], count: int) -> float:
        times = []
        for _ in range(count):
            self._flush()
            self._torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            self._torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    def sm_clock_mhz(self) -> float | None:
        return self._nvml.sm_clock_mhz()

    def max_sm_clock_mhz(self) -> float | None:
        return self._nvml.max_sm_clock_mhz()


class KernelRecord(NamedTuple):
    """A GPU activity CUPTI recorded: its name, start and duration (ns) and the CUDA stream it ran on."""

    name: str
    start_ns: int
    duration_ns: int
    stream: int

    @property
    def ms(self) -> float:
        return self.duration_ns / 1e6

    @property
    def span(self) -> tuple[int, int]:
        """(start, end), ns."""
        return self.start_ns, self.start_ns + self.duration_ns


def kernel_ms_by_name(kernels: Iterable[KernelRecord], calls: int = 1) -> dict[str, float]:
    """GPU time per call of each kernel name, ms: the kernels of `calls` calls summed by name over `calls`."""
    totals: dict[str, float] = {}
    for kernel in kernels:
        totals[kernel.name] = totals.get(kernel.name, 0.0) + kernel.ms / calls
    return totals


class CuptiTimer(CudaEventTimer):
    """Kernel durations from torch.profiler, summed between consecutive flush kernels."""

    name = "cupti"

    def samples(self, fn: Callable[[], object], count: int) -> list[float]:
        return [sum(kernel.ms for kernel in kernels) for kernels in self.kernel_records(fn, count)]

    def kernel_ms(self, fn: Callable[[], object], count: int) -> dict[str, float]:
        """GPU time per call of each kernel name, ms: the mean over `count` flushed calls."""
        return kernel_ms_by_name(itertools.chain.from_iterable(self.kernel_records(fn, count)), count)

    def kernel_records(self, fn: Callable[[], object], count: int) -> list[list[KernelRecord]]:
        """Every kernel of each of `count` flushed calls, in start order (the flushes left out)."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(count):
                self._flush()
                fn()
            self._torch.cuda.synchronize()
        # The raw CUPTI records, not prof.events(): building its event tree costs ~10x more host time
        # (tens of ms per repeat of a few hundred samples), and only names, times and streams are needed here.
        cuda = self._torch.autograd.DeviceType.CUDA
        kernels = sorted(
            (KernelRecord(e.name(), e.start_ns(), e.duration_ns(), e.device_resource_id())
             for e in prof.profiler.kineto_results.events() if e.device_type() == cuda),
            key=lambda kernel: kernel.start_ns,
        )  # fmt: skip
        per_sample: list[list[KernelRecord]] = []
        for kernel in kernels:
            if self.FLUSH_KERNEL_TAG in kernel.name:
                per_sample.append([])
            elif per_sample:
                per_sample[-1].append(kernel)
        if len(per_sample) != count:
            raise RuntimeError(f"CUPTI saw {len(per_sample)} flushes for {count} samples")
        return per_sample


class TimerChoice:
    """Picks the timer for each case, or once for a group of cases (`begin_group`); the CUDA timers (and their
    flush buffer) are made once."""

    def __init__(self, choice: str, flush_l2: bool = True):
        if choice not in TIMER_CHOICES:
            raise ValueError(f"unknown timer {choice!r}; choose one of: {', '.join(TIMER_CHOICES)}")
        if choice != "cuda-events" and not flush_l2:
            raise ValueError("the CUPTI timer separates samples by their L2 flush; it needs flush_l2")
        self.choice = choice
        gpu = GpuClock(flush_l2)
        self._events = CudaEventTimer(gpu)
        self._cupti = CuptiTimer(gpu)
        self._grouped = False
        self._group_timer: Timer | None = None

    def begin_group(self) -> None:
        """The cases measured from here to the next begin_group are compared with each other: `auto` picks one
        timer for them all, at the first."""
        self._grouped = True
        self._group_timer = None

    def measure(self, fn: Callable[[], object], config: TimingConfig) -> Measurement:
        """`measure(fn)` with this case's (or its group's) timer; `auto`'s estimate is also the measurement's first."""
        if self._group_timer is not None:
            return measure(fn, config, self._group_timer)
        timer, estimate_ms = self._pick(fn)
        if self._grouped:
            self._group_timer = timer
        return measure(fn, config, timer, first_estimate_ms=estimate_ms)

    def _pick(self, fn: Callable[[], object]) -> tuple[Timer, float | None]:
        """The case's timer, and the estimate `auto` made after the first call to pick it (None otherwise)."""
        if self.choice != "auto":
            return (self._cupti if self.choice == "cupti" else self._events), None
        self._events.run(fn, 1)
        gpu_ms = self._events.estimate_ms(fn, 3)
        host_ms = self._events.enqueue_ms(fn, 3)
        launch_bound = host_ms >= LAUNCH_BOUND_FRACTION * (gpu_ms + self._events.sample_overhead_ms)
        below = GROUP_CUPTI_BELOW_MS if self._grouped else CUPTI_BELOW_MS
        return (self._cupti if gpu_ms < below or launch_bound else self._events), gpu_ms


class OneTimer:
    """Times every case with one timer (the measured layer's CUPTI timer, whose kernel breakdown it also
    reads; fakes in tests): the `measure` of TimerChoice without the choice."""

    def __init__(self, timer: Timer):
        self.timer = timer

    def begin_group(self) -> None:
        pass  # one timer already

    def measure(self, fn: Callable[[], object], config: TimingConfig) -> Measurement:
        return measure(fn, config, self.timer)
