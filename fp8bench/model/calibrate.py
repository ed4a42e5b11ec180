"""`fp8bench calibrate`: what this GPU actually reaches, stored as a profile the roofline model reads.

A profile holds the achievable ceilings measured with fp8bench.harness.timing on large problems: BF16 and FP8
GEMM throughput (each FP8 granularity, with and without fast accumulation, through torch._scaled_mm),
device-to-device copy bandwidth (bytes read + written), and the duration of a trivial kernel (the
launch floor). The datasheet's peaks are what the hardware table has; these are what the software on
this machine gets, and the roofline shows predictions under both.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fp8bench.config import FastAccum, GemmShape, Granularity, TimingConfig

PROFILE_FORMAT = 1
CALIBRATION_DIR = Path("calibration")
# Large enough that launch overhead and wave quantization are noise; the best of them is the ceiling.
CALIBRATION_SHAPES = (GemmShape(8192, 8192, 8192), GemmShape(16384, 16384, 16384))
COPY_BYTES = 2**30  # per direction: far beyond L2, so the copy runs at DRAM bandwidth


def fp8_key(granularity: Granularity, fast_accum: FastAccum) -> str:
    """How an FP8 GEMM configuration is named in a profile, e.g. `tensorwise/on`."""
    return f"{granularity.value}/{fast_accum.value}"


# The one FP8 measurement a profile cannot do without; the roofline scales the others from it.
REQUIRED_FP8 = fp8_key(Granularity.TENSORWISE, FastAccum.ON)


def default_profile_path(gpu_key: str) -> Path:
    return CALIBRATION_DIR / f"{gpu_key}.json"


@dataclass(frozen=True)
class CalibrationProfile:
    """Measured ceilings of one GPU. Throughputs in TFLOPS, bandwidth in TB/s, launch floor in us."""

    gpu_key: str  # hardware-table key (fp8bench.model.hardware.GPUS)
    gpu_name: str  # as CUDA reports it
    bf16_tflops: float
    fp8_tflops: Mapping[str, float]  # fp8_key(...) -> TFLOPS; at least REQUIRED_FP8
    copy_tbps: float
    launch_us: float
    measured_utc: str
    shapes: tuple[str, ...] = ()  # the GEMM shapes the throughputs are the best of
    environment: Mapping[str, Any] = field(default_factory=dict)  # versions, driver, clocks, git revision

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp8_tflops", MappingProxyType(dict(self.fp8_tflops)))
        object.__setattr__(self, "environment", MappingProxyType(dict(self.environment)))
        object.__setattr__(self, "shapes", tuple(self.shapes))
        if REQUIRED_FP8 not in self.fp8_tflops:
            raise ValueError(f"a calibration profile needs the {REQUIRED_FP8} FP8 GEMM throughput")
        valid_keys = {fp8_key(g, f) for g in Granularity.fp8() for f in (FastAccum.ON, FastAccum.OFF)}
        unknown = set(self.fp8_tflops) - valid_keys
        if unknown:
            raise ValueError(f"unknown FP8 GEMM configurations {sorted(unknown)}; known: {sorted(valid_keys)}")
        values = {"bf16_tflops": self.bf16_tflops, "copy_tbps": self.copy_tbps, "launch_us": self.launch_us}
        values.update({f"fp8_tflops[{k}]": v for k, v in self.fp8_tflops.items()})
        for name, value in values.items():
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PROFILE_FORMAT,
            "gpu_key": self.gpu_key,
            "gpu_name": self.gpu_name,
            "measured_utc": self.measured_utc,
            "bf16_tflops": self.bf16_tflops,
            "fp8_tflops": dict(self.fp8_tflops),
            "copy_tbps": self.copy_tbps,
            "launch_us": self.launch_us,
            "shapes": list(self.shapes),
            "environment": dict(self.environment),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CalibrationProfile":
        if data.get("format") != PROFILE_FORMAT:
            raise ValueError(f"not a calibration profile of format {PROFILE_FORMAT} (format={data.get('format')!r})")
        missing = [k for k in ("gpu_key", "gpu_name", "bf16_tflops", "fp8_tflops", "copy_tbps", "launch_us") if k not in data]
        if missing:
            raise ValueError(f"calibration profile lacks {', '.join(missing)}")
        return cls(
            gpu_key=data["gpu_key"],
            gpu_name=data["gpu_name"],
            bf16_tflops=data["bf16_tflops"],
            fp8_tflops=data["fp8_tflops"],
            copy_tbps=data["copy_tbps"],
            launch_us=data["launch_us"],
            measured_utc=data.get("measured_utc", ""),
            shapes=tuple(data.get("shapes", ())),
            environment=data.get("environment", {}),
        )


def save_profile(profile: CalibrationProfile, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_json(), indent=2, sort_keys=True, default=str) + "\n")
    return path


def load_profile(path: Path) -> CalibrationProfile:
    """The profile in `path`, or ValueError saying what is wrong with the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"cannot read calibration file {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"calibration file {path} is not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"calibration file {path} does not hold a profile object")
    try:
        return CalibrationProfile.from_json(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"calibration file {path}: {err}") from None


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
