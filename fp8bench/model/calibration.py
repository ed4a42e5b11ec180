"""Calibration profiles: what a GPU actually reaches, stored as a file the roofline model reads
(measured by `fp8bench calibrate`, fp8bench.benchmarks.calibrate).

A profile holds the achievable ceilings measured with fp8bench.harness.timing on large problems: BF16 and FP8
GEMM throughput (each FP8 granularity, with and without fast accumulation, through torch._scaled_mm),
device-to-device copy bandwidth (bytes read + written), and the duration of a trivial kernel (the
launch floor). The datasheet's peaks are what the hardware table has; these are what the software on
this machine gets, and the roofline shows predictions under both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fp8bench.config import FastAccum, Granularity

PROFILE_FORMAT = 1
# The repository's calibration/ folder, found from where this package is installed (an editable
# install: the checkout), so that a profile is found whatever the current folder is.
CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "calibration"


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
