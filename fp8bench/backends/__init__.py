"""The backend registry: every backend, what it declares it supports, and lookup by name.

A backend that cannot run here (not installed, wrong GPU) is still listed, with its reason, so that
the run reports it instead of crashing on it.
"""

from __future__ import annotations

from fp8bench.backends.base import Backend, Level, Operands, PreparedGemm, Unsupported
from fp8bench.backends.cublas import CublasBackend
from fp8bench.backends.torch_bf16 import Bf16Backend
from fp8bench.backends.triton import TritonBackend

REGISTRY: dict[str, Backend] = {backend.name: backend for backend in (Bf16Backend(), CublasBackend(), TritonBackend())}


def backend_names(level: Level = Level.GEMM) -> list[str]:
    return [name for name, backend in REGISTRY.items() if level in backend.levels]


def get_backend(name: str) -> Backend:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of: {', '.join(REGISTRY)}") from None


__all__ = ["REGISTRY", "Backend", "Level", "Operands", "PreparedGemm", "Unsupported", "backend_names", "get_backend"]
