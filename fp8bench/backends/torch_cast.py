"""`torch` and `torch-compile`: the reference quantize formulas (fp8kernels.reference) in PyTorch, eager and
under torch.compile, writing the layouts our kernels write (the cast benchmark's references)."""

from __future__ import annotations

from typing import Any

from fp8bench.backends.base import Backend, Level
from fp8bench.backends.quantize import CastRecipe, Quantizer, reference_function, with_reference_layouts


class TorchEagerBackend(Backend):
    name = "torch"
    description = "the reference quantize formulas (fp8kernels.reference) in PyTorch eager"
    levels = frozenset({Level.CAST})

    def quantizer(self, recipe: CastRecipe, spec: Any, history_amax: Any) -> Quantizer:
        return with_reference_layouts(reference_function(recipe, spec, history_amax))


class TorchCompileBackend(Backend):
    name = "torch-compile"
    description = "the reference quantize formulas under torch.compile (compiled afresh per case, static shapes)"
    levels = frozenset({Level.CAST})

    def quantizer(self, recipe: CastRecipe, spec: Any, history_amax: Any) -> Quantizer:
        import torch

        torch._dynamo.reset()  # a fresh compile per case: no recompile limit, no shape generalisation
        return with_reference_layouts(torch.compile(reference_function(recipe, spec, history_amax), dynamic=False))
