"""GPU performance tests for pytest-benchmark, the second way to gate (docs/gating.md):

    pytest -m gpu tests/test_gpu_benchmarks.py --benchmark-storage=.benchmarks/h100-sxm --benchmark-autosave
    pytest -m gpu tests/test_gpu_benchmarks.py --benchmark-storage=.benchmarks/h100-sxm \
        --benchmark-compare --benchmark-compare-fail=median:5%

A few GEMMs (BF16; cuBLAS and, where registered, our Triton kernels at each granularity) are measured
by the harness, fp8bench.harness.timing, as `fp8bench matmul` measures them: clocks settled first, independent
repeats each with its own warm-up, an L2 flush before every sample, kernel time from CUDA events.
pytest-benchmark then records one round per repeat. Its timer is `HarnessClock`, a clock that only the
GPU time the harness measured moves: a round lasts exactly one repeat's median kernel time, with no
host time in it, and pytest-benchmark's median is the harness's median of repeat medians.
"""

from __future__ import annotations

import statistics

import pytest

from fp8bench.backends import REGISTRY, Unsupported
from fp8bench.config import FastAccum, GemmShape, Granularity, TimingConfig
from fp8bench.model.hardware import spec_for_device_name
from fp8bench.benchmarks.matmul import random_operands
from fp8bench.harness.timing import Measurement, TimerChoice, measure
from test_cast import FakeTimer

REPEATS = 10  # the rounds pytest-benchmark sees: the harness's unit of comparison, the repeat
SHAPES = (GemmShape(4096, 4096, 4096), GemmShape(8192, 14336, 4096, "llama3-8b.w2.M8192"))
FP8_BACKENDS = tuple(name for name in ("cublas", "triton") if name in REGISTRY)


class HarnessClock:
    """pytest-benchmark's timer: seconds of GPU time measured by fp8bench.harness.timing, advanced one repeat
    median per round by `replay`; nothing else moves it."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds

    def replay(self, repeat_ms: float) -> None:
        self.seconds += repeat_ms / 1e3

    def __repr__(self) -> str:  # how pytest-benchmark names the timer in its saved runs
        return "fp8bench.harness.timing repeat medians"


CLOCK = HarnessClock()


def record_repeats(benchmark, measurement: Measurement) -> None:
    """Hand the harness's repeats to pytest-benchmark, one round each."""
    repeats = iter(measurement.repeat_ms)
    benchmark.pedantic(lambda: CLOCK.replay(next(repeats)), rounds=len(measurement.repeat_ms))


def gemm_cases():
    for shape in SHAPES:
        yield pytest.param(shape, "bf16", Granularity.NONE, FastAccum.NA, id=f"{shape.name}-bf16")
        for backend in FP8_BACKENDS:
            for granularity in Granularity.fp8():
                # fast accumulation where the backend has the switch: the setting training uses
                fast_accum = FastAccum.ON if granularity in REGISTRY[backend].fast_accum_granularities else FastAccum.OFF
                case_id = f"{shape.name}-{backend}-{granularity.value}-accum-{fast_accum.value}"
                yield pytest.param(shape, backend, granularity, fast_accum, id=case_id)


@pytest.mark.gpu
@pytest.mark.benchmark(timer=CLOCK)
@pytest.mark.parametrize(("shape", "backend_name", "granularity", "fast_accum"), list(gemm_cases()))
def test_gemm_gpu_time(benchmark, shape, backend_name, granularity, fast_accum):
    import torch

    backend = REGISTRY[backend_name]
    reason = backend.unavailable_reason() or backend.unsupported_reason(shape, granularity, fast_accum)
    if reason:
        pytest.skip(reason)
    try:
        prepared = backend.prepare_gemm(random_operands(shape), granularity, fast_accum)
    except Unsupported as err:
        pytest.skip(str(err))
    measurement = TimerChoice("cuda-events").measure(prepared.run, TimingConfig(repeats=REPEATS))
    tflops = shape.flops / (measurement.median_ms * 1e-3) / 1e12
    device = torch.cuda.get_device_name()
    benchmark.group = shape.name  # pytest-benchmark's table: each shape's BF16 beside its FP8 products
    benchmark.extra_info.update(
        gpu=device, timer=measurement.timer, tflops=tflops, spread_pct=measurement.spread_pct,
        sm_clock_mhz=measurement.sm_clock_median, options=prepared.options,
    )  # fmt: skip
    record_repeats(benchmark, measurement)
    spec = spec_for_device_name(device)
    if spec is not None:  # faster than the hardware's dense peak: the timer missed the kernel
        assert tflops < 1.05 * spec.peak_tflops(granularity is not Granularity.NONE), f"{tflops:.0f} TFLOPS on {spec.name}"


@pytest.mark.benchmark(timer=CLOCK)
def test_pytest_benchmark_records_the_harness_repeats(benchmark):
    """On the CPU, with the fake timer of the tests: the rounds pytest-benchmark stores, and the median
    its --benchmark-compare-fail=median:5% gates, are the harness's repeats and their median."""
    if benchmark.disabled:
        pytest.skip("pytest-benchmark records nothing under --benchmark-disable")
    measurement = measure(lambda: None, TimingConfig(repeats=7, settle_ms=1.0, warmup_ms=1.0), FakeTimer(seed=11))
    record_repeats(benchmark, measurement)
    stats = benchmark.stats.stats
    assert stats.rounds == 7
    assert stats.data == pytest.approx([ms / 1e3 for ms in measurement.repeat_ms])
    assert stats.median == pytest.approx(statistics.median(measurement.repeat_ms) / 1e3)
    assert stats.median == pytest.approx(measurement.median_ms / 1e3)
