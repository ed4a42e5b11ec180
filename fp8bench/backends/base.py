"""What a backend declares and provides. Every backend lives in the one registry (`backends/__init__.py`)."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fp8bench.config import BLOCK, FastAccum, GemmShape, Granularity, fp8_shape_problem


class Level(str, enum.Enum):
    GEMM = "gemm"
    LAYER = "layer"
    MODEL = "model"


class Unsupported(Exception):
    """A case the backend cannot run; becomes an `unsupported: <reason>` row."""


@dataclass(frozen=True)
class PreparedGemm:
    """A GEMM ready to time: operands already quantized and laid out; `run` does the product only."""

    run: Callable[[], Any]
    options: dict[str, Any] = field(default_factory=dict)  # recorded in the result row


@dataclass(frozen=True)
class Operands:
    """Random BF16 operands of one shape: a[M, K] and b[K, N] with b stored K-major (as b.T
    contiguous), the layout of a weight in nn.Linear and the one FP8 tensor cores read."""

    a: Any
    b: Any


class Backend(ABC):
    name: str
    description: str
    granularities: frozenset[Granularity]
    levels: frozenset[Level]
    # Whether the fast-accumulation switch changes this backend's GEMM for a granularity.
    fast_accum_granularities: frozenset[Granularity] = frozenset()

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here (not installed, no GPU, wrong GPU), or None."""
        return None

    def unsupported_reason(self, shape: GemmShape, granularity: Granularity, fast_accum: FastAccum) -> str | None:
        """Why this backend cannot run this case, or None. Checked before any GPU work."""
        if granularity not in self.granularities:
            return f"{self.name} has no {granularity.value} scaling"
        if fast_accum is FastAccum.ON and granularity not in self.fast_accum_granularities:
            return f"{self.name} has no fast-accumulation switch for {granularity.value} scaling"
        return fp8_shape_problem(shape, granularity)

    @abstractmethod
    def prepare_gemm(self, operands: Operands, granularity: Granularity, fast_accum: FastAccum) -> PreparedGemm:
        """Quantize (untimed) and return the timed product; raise Unsupported for what it cannot do."""


# FP8 tensor cores: Ada (8.9), Hopper (9.0) and later.
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)


def fp8_device_problem() -> str | None:
    """Why this machine cannot run FP8 GEMMs (no CUDA GPU, or one without FP8 tensor cores), or None."""
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    capability = torch.cuda.get_device_capability()
    if capability < FP8_MIN_COMPUTE_CAPABILITY:
        return f"needs FP8 tensor cores (compute capability >= 8.9), this GPU has {capability[0]}.{capability[1]}"
    return None


def quantize_operands(operands: Operands, granularity: Granularity) -> tuple[Any, Any, Any, Any]:
    """(qa, qb_t, scale_a, scale_b) by fp8kernels.reference (untimed), scales in their logical shapes:
    () / (M, 1) and (N, 1) / (M, K/128) and (N/128, K/128). Each backend lays them out as its GEMM reads."""
    from fp8kernels import reference as ref

    a, b_t = operands.a, operands.b
    if granularity is Granularity.TENSORWISE:
        (qa, sa), (qb_t, sb) = ref.quantize_tensorwise(a), ref.quantize_tensorwise(b_t)
    elif granularity is Granularity.AXISWISE:
        (qa, sa), (qb_t, sb) = ref.quantize_axiswise(a), ref.quantize_axiswise(b_t)
    else:
        (qa, sa), (qb_t, sb) = ref.quantize_blockwise(a, 1, BLOCK), ref.quantize_blockwise(b_t, BLOCK, BLOCK)
    return qa, qb_t, sa, sb
