"""The backend registry: every implementation, what it declares it supports per level, and lookup by name.

A backend that cannot run here (not installed, wrong GPU) is still listed, with its reason, so that
the run reports it as a row instead of crashing on it.
"""

from __future__ import annotations

from typing import Any

from fp8bench.backends.base import Backend, Converted, LayerStep, Level, Operands, PreparedGemm, linear_filter
from fp8bench.backends.cublas import CublasBackend
from fp8bench.backends.te import TeBackend, TeLayerBackend
from fp8bench.backends.torch_bf16 import Bf16Backend
from fp8bench.backends.torch_cast import TorchCompileBackend, TorchEagerBackend
from fp8bench.backends.torchao import TorchaoBackend
from fp8bench.backends.triton import TritonBackend, TunedTritonBackend
from fp8bench.harness.case import Unsupported

REGISTRY: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Bf16Backend(), CublasBackend(), TritonBackend(), TunedTritonBackend(), TorchEagerBackend(), TorchCompileBackend(), TorchaoBackend(), TeBackend(),
        TeLayerBackend(),
    )
}


def backend_names(level: Level = Level.GEMM) -> list[str]:
    return [name for name, backend in REGISTRY.items() if level in backend.levels]


def default_backend_names(level: Level = Level.GEMM) -> list[str]:
    """What a command runs when no backend is named: every backend of `level` but the opt-in ones."""
    return [name for name in backend_names(level) if not REGISTRY[name].opt_in]


def get_backend(name: str, level: Level | None = None) -> Backend:
    """The backend of that name; ValueError for an unknown one (or one without `level`, when given)."""
    choices = backend_names(level) if level else list(REGISTRY)
    if name not in choices:
        raise ValueError(f"unknown backend {name!r}; choose one of: {', '.join(choices)}")
    return REGISTRY[name]


def convert(
    model: Any, implementation: str, recipe: Any, *, lm_head_fp8: bool = False, fp8_all_gather: bool = False, process_group: Any = None
) -> Converted:
    """Convert `model` (fp8bench.nn.llama.Llama) in place for the MODEL-level backend `implementation` running
    `recipe` (None: BF16), each linear but the LM head unless `lm_head_fp8` (Backend.convert_model).
    ValueError for an unknown implementation or a recipe it cannot take (recipe_problem); Unsupported
    for a conversion the backend cannot do."""
    problem = recipe_problem(implementation, recipe)
    if problem:
        raise ValueError(problem)
    return get_backend(implementation, Level.MODEL).convert_model(model, recipe, linear_filter(lm_head_fp8), fp8_all_gather, process_group)


def recipe_problem(implementation: str, recipe: Any) -> str | None:
    """Why the MODEL-level backend `implementation` cannot take `recipe` (None: no FP8), or None: bf16 takes
    no recipe, an FP8 implementation needs one unless it also runs in BF16 (Backend.runs_bf16).
    ValueError for an unknown implementation."""
    if implementation == "bf16":
        return None if recipe is None else "bf16 takes no recipe"
    if recipe is None and not get_backend(implementation, Level.MODEL).runs_bf16:
        return f"{implementation} is an FP8 implementation: it needs a recipe"
    return None


__all__ = [
    "REGISTRY", "Backend", "Converted", "LayerStep", "Level", "Operands", "PreparedGemm", "Unsupported", "backend_names", "convert", "default_backend_names",
    "get_backend", "recipe_problem",
]  # fmt: skip
