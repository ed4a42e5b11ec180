"""`torchao`: torchao.float8's training conversion (convert_to_float8_training with
Float8LinearConfig.from_recipe_name), compiled, for the measured layer and the model level."""

from __future__ import annotations

from typing import Any

from fp8bench.backends.base import Backend, LayerStep, Level
from fp8bench.backends.torch_bf16 import compiled, torch_layer
from fp8bench.harness.case import Unsupported


def torchao_unavailable_reason() -> str | None:
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "torchao is not installed"
    return None


class TorchaoBackend(Backend):
    name = "torchao"
    description = "torchao.float8.convert_to_float8_training under torch.compile"
    levels = frozenset({Level.LAYER, Level.MODEL})

    def unavailable_reason(self, level: Level = Level.GEMM) -> str | None:
        return super().unavailable_reason(level) or torchao_unavailable_reason()

    def layer(self, case: Any, weight: Any, compile_backend: str) -> LayerStep:
        reason = torchao_unavailable_reason()
        if reason:
            raise Unsupported(reason)
        if case.recipe is None:
            raise Unsupported("torchao converts to FP8: the BF16 layer is bf16's")
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        layer = torch_layer(case.shape, weight)
        convert_to_float8_training(layer, config=Float8LinearConfig.from_recipe_name(case.recipe.name))
        step = compiled(layer, case.compiled, compile_backend)
        return LayerStep(step, layer[1].weight, (layer[1].weight,), {"recipe_name": case.recipe.name}, case.compiled)
