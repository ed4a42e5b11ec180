"""`fp8bench calibrate`: measure what this GPU actually reaches (fp8bench.model.calibration's profile)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from fp8bench.config import FastAccum, GemmShape, Granularity, TimingConfig
from fp8bench.model.calibration import REQUIRED_FP8, CalibrationProfile, fp8_key

# Large enough that launch overhead and wave quantization are noise; the best of them is the ceiling.
CALIBRATION_SHAPES = (GemmShape(8192, 8192, 8192), GemmShape(16384, 16384, 16384))
COPY_BYTES = 2**30  # per direction: far beyond L2, so the copy runs at DRAM bandwidth


def _line(what: str, result: str) -> str:
    return f"{what:>30}: {result}"


def measure_profile(
    gpu_key: str,
    device_name: str,
    timing: TimingConfig = TimingConfig(),
    environment: Mapping[str, Any] | None = None,
    on_result: Callable[[str], None] = lambda line: None,
) -> CalibrationProfile:
    """Measure this GPU's ceilings (needs CUDA). FP8 configurations this torch cannot run are left out;
    ValueError if that leaves out tensorwise with fast accumulation."""
    import torch

    from fp8bench.backends import Unsupported, get_backend
    from fp8bench.benchmarks.matmul import random_operands
    from fp8bench.harness.timing import TimerChoice

    timers = TimerChoice("auto", timing.flush_l2)

    def tflops(backend_name: str, granularity: Granularity, fast_accum: FastAccum) -> float:
        backend = get_backend(backend_name)
        best = 0.0
        for shape in CALIBRATION_SHAPES:
            reason = backend.unavailable_reason() or backend.unsupported_reason(shape, granularity, fast_accum)
            if reason:
                raise Unsupported(reason)
            prepared = backend.prepare_gemm(random_operands(shape), granularity, fast_accum)
            m = timers.measure(prepared.run, timing)
            best = max(best, shape.flops / (m.median_ms * 1e-3) / 1e12)
            del prepared
            torch.cuda.empty_cache()
        return best

    bf16 = tflops("bf16", Granularity.NONE, FastAccum.NA)
    on_result(_line("bf16 GEMM", f"{bf16:.1f} TFLOPS"))
    fp8: dict[str, float] = {}
    for granularity in Granularity.fp8():
        for fast_accum in (FastAccum.ON, FastAccum.OFF):
            key = fp8_key(granularity, fast_accum)
            try:
                fp8[key] = tflops("cublas", granularity, fast_accum)
            except (Unsupported, RuntimeError) as err:
                on_result(_line(f"fp8 {key} GEMM", f"skipped: {str(err).splitlines()[0][:120]}"))
                continue
            on_result(_line(f"fp8 {key} GEMM", f"{fp8[key]:.1f} TFLOPS"))

    src = torch.randn(COPY_BYTES // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)

    def copy_once():
        return dst.copy_(src)

    copy = timers.measure(copy_once, timing)
    copy_tbps = 2 * COPY_BYTES / (copy.median_ms * 1e-3) / 1e12
    on_result(_line("device copy (read + write)", f"{copy_tbps:.2f} TB/s"))
    del src, dst
    torch.cuda.empty_cache()

    # The launch floor: GPU time of a kernel that does next to nothing, from kernel timestamps (CUPTI).
    one = torch.ones(1, device="cuda")

    def trivial_kernel():
        return one.add_(1)

    floor = TimerChoice("cupti", timing.flush_l2).measure(trivial_kernel, timing)
    launch_us = floor.median_ms * 1e3
    on_result(_line("trivial kernel (launch floor)", f"{launch_us:.2f} us"))

    if REQUIRED_FP8 not in fp8:
        raise ValueError(f"could not measure the {REQUIRED_FP8} FP8 GEMM the roofline needs (see the lines above)")
    return CalibrationProfile(
        gpu_key=gpu_key,
        gpu_name=device_name,
        bf16_tflops=bf16,
        fp8_tflops=fp8,
        copy_tbps=copy_tbps,
        launch_us=launch_us,
        measured_utc=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        shapes=tuple(s.name for s in CALIBRATION_SHAPES),
        environment=environment or {},
    )
