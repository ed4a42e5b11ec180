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
    # torch.cuda.get_device_name() of this model, exactly (case aside). Substrings would not do:
    # "NVIDIA H200" is in "NVIDIA H200 NVL" and "NVIDIA GH200 480GB", three models with other timings.
    device_names: tuple[str, ...] = ()
    memory_gib: float = 0.0  # as CUDA reports it (total_memory / 2**30): tells memory variants apart

    def peak_tflops(self, fp8: bool) -> float:
        return self.fp8_tflops if fp8 else self.bf16_tflops


GPUS: dict[str, GpuSpec] = {
    spec.key: spec
    for spec in (
        GpuSpec("h100-sxm", "NVIDIA H100 SXM5 80GB", 989.4, 1978.9, 3.35, 50, 132, ("NVIDIA H100 80GB HBM3",), 79.2),
        GpuSpec("h100-pcie", "NVIDIA H100 PCIe 80GB", 756.0, 1513.0, 2.0, 50, 114, ("NVIDIA H100 PCIe",), 79.2),
        GpuSpec("h100-nvl", "NVIDIA H100 NVL 94GB", 835.0, 1670.0, 3.9, 50, 132, ("NVIDIA H100 NVL",), 93.1),
        GpuSpec("h200", "NVIDIA H200 SXM 141GB", 989.4, 1978.9, 4.8, 60, 132, ("NVIDIA H200",), 139.8),
        GpuSpec("h800", "NVIDIA H800 SXM5 80GB", 989.4, 1978.9, 3.35, 50, 132, ("NVIDIA H800",), 79.2),
    )
}
# Reported memory within this of the table's is the same model (drivers reserve slightly different amounts).
_MEMORY_TOLERANCE_GIB = 2.0


def gpu_choices() -> list[str]:
    return ["auto", *GPUS]


def _normal(name: str) -> str:
    return " ".join(name.split()).lower()


def spec_for_device_name(device_name: str, memory_gib: float | None = None) -> GpuSpec | None:
    """The table entry whose device name is exactly `device_name` (and, where given, whose memory
    matches), or None for a GPU the table lacks."""
    for spec in GPUS.values():
        if _normal(device_name) in (_normal(name) for name in spec.device_names):
            if memory_gib is None or abs(memory_gib - spec.memory_gib) <= _MEMORY_TOLERANCE_GIB:
                return spec
    return None


def gpu_key(device_name: str, memory_gib: float | None = None) -> str:
    """A folder-safe key for a GPU model: its table key, or for a GPU the table lacks a slug of its full
    name and memory size (e.g. nvidia-gh200-480gb-94gib), so that no two models share a key.
    Reports and baselines are filed under it."""
    spec = spec_for_device_name(device_name, memory_gib)
    if spec:
        return spec.key
    memory = f"-{round(memory_gib)}gib" if memory_gib else ""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") + memory


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
