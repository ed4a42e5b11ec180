"""The backend registry: every implementation, what it declares it supports per level, and lookup by name.

A backend that cannot run here (not installed, wrong GPU) is still listed, with its reason, so that
the run reports it as a row instead of crashing on it.
"""

from __future__ import annotations

from fp8bench.backends.base import Backend, LayerStep, Level, Operands, PreparedGemm
from fp8bench.backends.cublas import CublasBackend
from fp8bench.backends.te import TeBackend
from fp8bench.backends.torch_bf16 import Bf16Backend
from fp8bench.backends.torch_cast import TorchCompileBackend, TorchEagerBackend
from fp8bench.backends.torchao import TorchaoBackend
from fp8bench.backends.triton import TritonBackend
from fp8bench.harness.case import Unsupported

REGISTRY: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Bf16Backend(), CublasBackend(), TritonBackend(), TorchEagerBackend(), TorchCompileBackend(), TeBackend(), TorchaoBackend()
    )
}


def backend_names(level: Level = Level.GEMM) -> list[str]:
    return [name for name, backend in REGISTRY.items() if level in backend.levels]


def get_backend(name: str, level: Level | None = None) -> Backend:
    """The backend of that name; ValueError for an unknown one (or one without `level`, when given)."""
    choices = backend_names(level) if level else list(REGISTRY)
    if name not in choices:
        raise ValueError(f"unknown backend {name!r}; choose one of: {', '.join(choices)}")
    return REGISTRY[name]


__all__ = ["REGISTRY", "Backend", "LayerStep", "Level", "Operands", "PreparedGemm", "Unsupported", "backend_names", "get_backend"]
