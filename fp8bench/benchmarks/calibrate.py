"""`fp8bench calibrate`: measure what this GPU actually reaches, through the harness, and turn the rows into
the profile the roofline model reads (fp8bench.model.calibration).

The cases: the BF16 GEMM and each FP8 granularity with and without fast accumulation (cuBLAS, through
torch._scaled_mm) on large shapes, whose best TFLOPS is the ceiling; a device-to-device copy far beyond L2
(bytes read + written: the bandwidth); and a kernel that does next to nothing (one element: the launch
floor; `auto` times a kernel this short with CUPTI's kernel timestamps, fp8bench.harness.timing). The rows
are a run like any other (benchmark `calibrate`), so the profile can be checked against them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fp8bench.benchmarks.matmul import GemmInputs, prepare, random_operands, recipe_name
from fp8bench.config import FastAccum, GemmShape, Granularity, MatmulCase
from fp8bench.harness.case import Built, Peak, Work
from fp8bench.model.calibration import REQUIRED_FP8, CalibrationProfile, fp8_key

BENCHMARK = "calibrate"
# Large enough that launch overhead and wave quantization are noise; the best of them is the ceiling.
CALIBRATION_SHAPES = (GemmShape(8192, 8192, 8192), GemmShape(16384, 16384, 16384))
COPY_BYTES = 2**30  # per direction: far beyond L2, so the copy runs at DRAM bandwidth
COPY, LAUNCH = "copy", "launch"  # the `recipe` of the copy and launch-floor rows
FP8_CONFIGURATIONS = tuple((g, f) for g in Granularity.fp8() for f in (FastAccum.ON, FastAccum.OFF))


@dataclass(frozen=True)
class CalibrationCase:
    """One ceiling measurement (fp8bench.harness.case.Case): a GEMM (`gemm` set), the copy or the launch floor."""

    kind: str  # gemm | copy | launch
    gemm: MatmulCase | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> dict[str, Any]:
        if self.gemm is not None:
            shape, gemm = self.gemm.shape, self.gemm
            return {"benchmark": BENCHMARK, "case": shape.name, "M": shape.M, "K": shape.K, "N": shape.N,
                    "granularity": gemm.granularity.value, "backend": gemm.backend,
                    "recipe": recipe_name(gemm.granularity), "fast_accum": gemm.fast_accum.value}  # fmt: skip
        elements = COPY_BYTES // 2 if self.kind == COPY else 1
        return {"benchmark": BENCHMARK, "case": f"{self.kind}-{elements}", "M": elements, "K": 1, "N": 1,
                "granularity": Granularity.NONE.value, "backend": "torch", "recipe": self.kind, "fast_accum": FastAccum.NA.value}  # fmt: skip

    @property
    def work(self) -> Work:
        if self.gemm is not None:
            return Work(flops=self.gemm.shape.flops)
        return Work(bytes=2 * COPY_BYTES) if self.kind == COPY else Work()

    @property
    def group(self) -> Hashable:
        return self.gemm.shape if self.gemm is not None else self.kind

    @property
    def is_reference(self) -> bool:
        return self.gemm is not None and self.gemm.granularity is Granularity.NONE

    def build(self, inputs) -> Built:
        if self.kind == COPY:
            source, destination = inputs
            return Built(lambda: destination.copy_(source))
        if self.kind == LAUNCH:
            return Built(lambda: inputs.add_(1))
        prepared = prepare(self.gemm, inputs.operands)
        return Built(prepared.run, dict(prepared.options))


@dataclass(frozen=True)
class CalibrationBenchmark:
    """The ceilings of this GPU (fp8bench.harness.case.Benchmark)."""

    shapes: tuple[GemmShape, ...] = CALIBRATION_SHAPES
    device: str = "cuda"
    name: str = BENCHMARK
    speedup_vs_reference: bool = False  # ceilings, not a comparison with BF16
    bracket_reference: bool = False

    def cases(self) -> list[CalibrationCase]:
        gemms = [
            MatmulCase(shape, backend, granularity, fast_accum)
            for shape in self.shapes
            for backend, granularity, fast_accum in (("bf16", Granularity.NONE, FastAccum.NA), *(("cublas", g, f) for g, f in FP8_CONFIGURATIONS))
        ]
        return [*(CalibrationCase("gemm", gemm) for gemm in gemms), CalibrationCase(COPY), CalibrationCase(LAUNCH)]

    def inputs(self, group: Hashable):
        import torch

        if group == COPY:
            source = torch.randn(COPY_BYTES // 2, device=self.device, dtype=torch.bfloat16)
            return source, torch.empty_like(source)
        if group == LAUNCH:
            return torch.ones(1, device=self.device)
        return GemmInputs(random_operands(group, device=self.device))

    def peak(self, case: CalibrationCase, reference: Mapping[str, Any] | None) -> Peak | None:
        return None

    def case_from_identity(self, identity: Mapping[str, Any]) -> CalibrationCase:
        for case in self.cases():
            if all(str(case.identity[k]) == str(identity.get(k)) for k in case.identity):
                return case
        raise ValueError(f"no calibration case has the identity {dict(identity)}")

    def reference_of(self, case: CalibrationCase) -> CalibrationCase:
        return case if case.gemm is None else CalibrationCase("gemm", MatmulCase(case.gemm.shape, "bf16", Granularity.NONE, FastAccum.NA))


def _line(what: str, result: str) -> str:
    return f"{what:>30}: {result}"


def profile_from_rows(
    rows: list[Mapping[str, Any]], gpu_key: str, device_name: str, shapes: tuple[GemmShape, ...] = CALIBRATION_SHAPES,
    environment: Mapping[str, Any] | None = None, on_result: Callable[[str], None] = lambda line: None,
) -> CalibrationProfile:
    """The profile a calibration run's rows give: each GEMM configuration's best TFLOPS over the shapes (an
    FP8 configuration that failed on any shape is left out), the copy's TB/s, the launch floor in us.
    ValueError if that leaves out tensorwise with fast accumulation, or the BF16 GEMM, copy or launch floor."""

    def ok(recipe: str, granularity: str = "none", fast_accum: str = "n/a") -> list[Mapping[str, Any]]:
        return [r for r in rows if (r["recipe"], r["granularity"], r["fast_accum"]) == (recipe, granularity, fast_accum)]

    def best_tflops(of: list[Mapping[str, Any]], what: str) -> float | None:
        failed = [r["status"] for r in of if r["status"] != "ok"]
        if failed or not of:
            on_result(_line(what, f"skipped: {failed[0] if failed else 'not measured'}"))
            return None
        best = max(float(r["tflops"]) for r in of)
        on_result(_line(what, f"{best:.1f} TFLOPS"))
        return best

    bf16 = best_tflops(ok("bf16"), "bf16 GEMM")
    fp8 = {}
    for granularity, fast_accum in FP8_CONFIGURATIONS:
        key = fp8_key(granularity, fast_accum)
        best = best_tflops(ok(recipe_name(granularity), granularity.value, fast_accum.value), f"fp8 {key} GEMM")
        if best is not None:
            fp8[key] = best
    copy = [r for r in ok(COPY) if r["status"] == "ok"]
    launch = [r for r in ok(LAUNCH) if r["status"] == "ok"]
    copy_tbps = float(copy[0]["gbps"]) / 1e3 if copy else None
    launch_us = float(launch[0]["median_ms"]) * 1e3 if launch else None
    on_result(_line("device copy (read + write)", f"{copy_tbps:.2f} TB/s" if copy_tbps else "not measured"))
    on_result(_line("trivial kernel (launch floor)", f"{launch_us:.2f} us" if launch_us else "not measured"))
    if REQUIRED_FP8 not in fp8:
        raise ValueError(f"could not measure the {REQUIRED_FP8} FP8 GEMM the roofline needs (see the lines above)")
    if bf16 is None or copy_tbps is None or launch_us is None:
        raise ValueError("could not measure the BF16 GEMM, the copy or the launch floor (see the lines above)")
    return CalibrationProfile(
        gpu_key=gpu_key,
        gpu_name=device_name,
        bf16_tflops=bf16,
        fp8_tflops=fp8,
        copy_tbps=copy_tbps,
        launch_us=launch_us,
        measured_utc=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        shapes=tuple(s.name for s in shapes),
        environment=environment or {},
    )
