"""GPU models as data: dense peaks, memory bandwidth and L2, detected from the device name.

Peaks are the vendor's dense (no sparsity) figures; `fp8bench calibrate` measures what the GPU at hand
actually reaches and the roofline shows both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    bf16_tflops: float  # dense
    fp8_tflops: float  # dense
    mem_bw_tbps: float  # TB/s
    l2_mib: int
    sms: int
    # Substrings of torch.cuda.get_device_name() that identify this model, most specific first.
    name_patterns: tuple[str, ...] = ()

    def peak_tflops(self, fp8: bool) -> float:
        return self.fp8_tflops if fp8 else self.bf16_tflops


GPUS: dict[str, GpuSpec] = {
    spec.key: spec
    for spec in (
        GpuSpec("h100-sxm", "NVIDIA H100 SXM5 80GB", 989.4, 1978.9, 3.35, 50, 132, ("H100 80GB HBM3", "H100 SXM")),
        GpuSpec("h100-pcie", "NVIDIA H100 PCIe 80GB", 756.0, 1513.0, 2.0, 50, 114, ("H100 PCIe",)),
        GpuSpec("h100-nvl", "NVIDIA H100 NVL 94GB", 835.0, 1670.0, 3.9, 50, 132, ("H100 NVL",)),
        GpuSpec("h200", "NVIDIA H200 SXM 141GB", 989.4, 1978.9, 4.8, 60, 132, ("H200",)),
        GpuSpec("h800", "NVIDIA H800 SXM5 80GB", 989.4, 1978.9, 3.35, 50, 132, ("H800",)),
    )
}


def gpu_choices() -> list[str]:
    return ["auto", *GPUS]


def spec_for_device_name(device_name: str) -> GpuSpec | None:
    """The table entry whose pattern occurs in a CUDA device name, or None for an unknown GPU."""
    for spec in GPUS.values():
        if any(pattern.lower() in device_name.lower() for pattern in spec.name_patterns):
            return spec
    return None


def gpu_key(device_name: str) -> str:
    """A folder-safe key for a GPU: its table key, or a slug of its name for a GPU the table lacks.
    Reports and baselines are filed under it."""
    spec = spec_for_device_name(device_name)
    return spec.key if spec else re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")


def resolve_gpu(choice: str, device_name: str | None) -> GpuSpec:
    """`auto` detects from the device name; anything else must be a table key."""
    if choice != "auto":
        if choice not in GPUS:
            raise ValueError(f"unknown GPU {choice!r}; choose one of: {', '.join(gpu_choices())}")
        return GPUS[choice]
    if device_name is None:
        raise ValueError(f"no CUDA GPU to detect; name one with --gpu ({', '.join(GPUS)})")
    spec = spec_for_device_name(device_name)
    if spec is None:
        raise ValueError(f"GPU {device_name!r} is not in the hardware table; name one with --gpu ({', '.join(GPUS)})")
    return spec
