"""Kernel time against the SM clock: why repeats of a power-capped GPU disagree (docs/timing.md).

    python tools/clock_trace.py OUT_DIR [--cases clocks|training]
    python tools/clock_trace.py --windows TRACE_DIR CASE   # no GPU needed

For a few GEMMs it runs CUDA-event-timed samples back to back for 4 s while a thread polls NVML every 2 ms
(SM clock, power, temperature, clock-event reasons), and writes per case `<case>-samples.csv` (host time at
each batch's synchronize, GPU ms per sample) and `<case>-nvml.csv`, plus `summary.json`: for windows of
100 ms, 300 ms and 1 s the range and the coefficient of variation (%) of the window medians -- how far apart
repeats of that length would land -- and the median TFLOPS, SM clock and power, and the energy of one call
(median power x median time). Two sets of cases (CASE_SETS):
- `clocks` (the default): cuBLAS and BF16 GEMMs, each sample after an L2 flush;
- `training`: the largest products of a LLaMa-3 8B training step (fp8bench.benchmarks.shapes.training: w13's
  and w2's, the regimes the tensorwise recipe runs them in), ours and cuBLAS in turn, with no flush between
  samples, as a training step runs them: what each sustains under the power cap, where a flushed sample
  of a fraction of a second does not reach it. `--windows` reads a trace back and prints, per window
length, the spread (fp8bench.harness.timing.spread_pct) of three consecutive windows placed at every 50 ms from
0.2 s on: what a case of three repeats of that length would report (TimingConfig.throttled_samples_ms).
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path

import pynvml
import torch

from fp8bench.backends import REGISTRY
from fp8bench.config import FastAccum, GemmShape, Granularity
from fp8bench.benchmarks.matmul import random_operands
from fp8bench.harness.timing import GpuClock, elapsed_ms, recorded_calls

CASES = (
    ("bf16-4096", GemmShape(4096, 4096, 4096), "bf16", Granularity.NONE, FastAccum.NA),
    ("cublas-tw-fa-8192", GemmShape(8192, 8192, 8192), "cublas", Granularity.TENSORWISE, FastAccum.ON),
    ("cublas-tw-4096", GemmShape(4096, 4096, 4096), "cublas", Granularity.TENSORWISE, FastAccum.OFF),
)

def _training_cases() -> tuple:
    from fp8bench.benchmarks.shapes import training

    largest = ("w13.output", "w13.grad_input", "w13.grad_weight", "w2.grad_input")
    cases = []
    shapes = [(shape, name) for shape in training() for name in largest if f".{name}." in shape.name]
    for index, (shape, product) in enumerate(shapes):
        fast = FastAccum.ON if product.endswith("output") else FastAccum.OFF  # the tensorwise recipe's
        for backend in ("triton", "cublas")[:: 1 if index % 2 == 0 else -1]:  # either first in turn: the card warms
            cases.append((f"{backend}-tw-{product.replace('.', '-')}", shape, backend, Granularity.TENSORWISE, fast, False))
    return tuple(cases)


# (label, shape, backend, granularity, fast accumulation, L2 flushed before each sample)
CASE_SETS = {"clocks": lambda: tuple((*case, True) for case in CASES), "training": _training_cases}
TRACE_S = 4.0
POLL_S = 0.002
BATCH = 20  # samples between synchronizes


def _poll(handle, stop: threading.Event, rows: list) -> None:
    while not stop.is_set():
        rows.append((
            time.perf_counter(), pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3, pynvml.nvmlDeviceGetTemperature(handle, 0),
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
        ))  # fmt: skip
        time.sleep(POLL_S)


def _window_spread(samples: list[tuple[float, float]], t0: float, seconds: float) -> tuple[float, float]:
    """(range, coefficient of variation) of the medians of consecutive windows, % of their median."""
    windows: dict[int, list[float]] = {}
    for t, ms in samples:
        windows.setdefault(int((t - t0) / seconds), []).append(ms)
    medians = [statistics.median(v) for v in windows.values() if len(v) > 3]
    middle = statistics.median(medians)
    return round(100 * (max(medians) - min(medians)) / middle, 2), round(100 * statistics.pstdev(medians) / statistics.mean(medians), 2)


def trace(out: Path, case_set: str = "clocks") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    flush = GpuClock().flush_buffer  # the harness's own L2 flush
    summary = {}
    for label, shape, backend, granularity, fast_accum, flushed in CASE_SETS[case_set]():
        run = REGISTRY[backend].prepare_gemm(random_operands(shape), granularity, fast_accum).run
        for _ in range(20):
            run()
        torch.cuda.synchronize()
        time.sleep(1.0)  # every case starts from an idle card
        stop, polls = threading.Event(), []
        poller = threading.Thread(target=_poll, args=(handle, stop, polls))
        poller.start()
        samples: list[tuple[float, float]] = []
        end = time.perf_counter() + TRACE_S
        while time.perf_counter() < end:
            batch_ms = elapsed_ms(recorded_calls(run, BATCH, flush.bitwise_not_ if flushed else None))
            now = time.perf_counter()
            samples += [(now, ms) for ms in batch_ms]
        stop.set()
        poller.join()
        t0 = samples[0][0]
        with open(out / f"{label}-samples.csv", "w") as f:
            f.write("t_s,gpu_ms\n")
            f.writelines(f"{t - t0:.4f},{ms:.5f}\n" for t, ms in samples)
        with open(out / f"{label}-nvml.csv", "w") as f:
            f.write("t_s,sm_mhz,power_w,temp_c,throttle\n")
            f.writelines(f"{t - t0:.4f},{mhz},{watts:.1f},{celsius},{reasons}\n" for t, mhz, watts, celsius, reasons in polls)
        clocks = [mhz for _, mhz, *_ in polls]
        median_ms = statistics.median(ms for _, ms in samples)
        power_med = statistics.median(w for _, _, w, *_ in polls)
        reasons: dict[str, int] = {}
        for *_, reason in polls:
            reasons[hex(reason)] = reasons.get(hex(reason), 0) + 1
        summary[label] = dict(
            samples=len(samples), median_ms=median_ms, tflops_med=round(2 * shape.M * shape.K * shape.N / median_ms / 1e9, 1),
            joules_per_call=round(power_med * median_ms / 1e3, 4),
            w100ms_range_cv=_window_spread(samples, t0, 0.1), w300ms=_window_spread(samples, t0, 0.3),
            w1s=_window_spread(samples, t0, 1.0), clock_min=min(clocks), clock_med=statistics.median(clocks),
            clock_max=max(clocks), power_med=power_med,
            temp=(polls[0][3], polls[-1][3]), throttle_reasons=reasons, nvml_polls=len(polls),
        )  # fmt: skip
        print(label, json.dumps(summary[label]), flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


WINDOW_LENGTHS_S = (0.5, 0.6, 0.7, 0.8, 1.0)
REPEAT_GAP_S = 0.03  # the warm-up and clock read between two repeats


def consecutive_window_spreads(samples_csv: Path, window_s: float, repeats: int = 3) -> list[float]:
    """Spread of `repeats` consecutive windows' medians, for each placement of the first one."""
    from fp8bench.harness.timing import spread_pct

    rows = [line.split(",") for line in samples_csv.read_text().splitlines()[1:]]
    samples = [(float(t), float(ms)) for t, ms in rows]
    end = samples[-1][0]
    spreads = []
    start = 0.2  # past the first batch, which carries start-up costs
    while start + repeats * (window_s + REPEAT_GAP_S) <= end:
        medians = []
        for r in range(repeats):
            lo = start + r * (window_s + REPEAT_GAP_S)
            medians.append(statistics.median(ms for t, ms in samples if lo <= t < lo + window_s))
        spreads.append(spread_pct(medians))
        start += 0.05
    return spreads


def print_window_spreads(trace_dir: Path, case: str) -> None:
    print("| window | placements | spread of three: median | max |\n|---|---|---|---|")
    for window_s in WINDOW_LENGTHS_S:
        spreads = consecutive_window_spreads(trace_dir / f"{case}-samples.csv", window_s)
        print(f"| {window_s:g} s | {len(spreads)} | {statistics.median(spreads):.1f}% | {max(spreads):.1f}% |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--windows":
        print_window_spreads(Path(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 2 or (len(sys.argv) == 4 and sys.argv[2] == "--cases" and sys.argv[3] in CASE_SETS):
        trace(Path(sys.argv[1]), sys.argv[3] if len(sys.argv) == 4 else "clocks")
    else:
        sys.exit(f"usage: python tools/clock_trace.py OUT_DIR [--cases {'|'.join(CASE_SETS)}] | --windows TRACE_DIR CASE")
