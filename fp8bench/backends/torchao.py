"""`torchao`: torchao.float8's training conversion (convert_to_float8_training with
Float8LinearConfig.from_recipe_name), compiled, for the measured layer and the model level."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fp8bench.backends.base import Backend, Converted, LayerStep, Level
from fp8bench.backends.torch_bf16 import compiled, torch_layer
from fp8bench.harness.case import Unsupported


TORCHAO_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")  # Float8LinearConfig.from_recipe_name's presets


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

    def convert_model(self, model: Any, recipe: Any, keep: Callable[[str], bool], fp8_all_gather: bool, process_group: Any) -> Converted:
        """convert_to_float8_training with torchao's preset of our recipe's name; under FSDP2 with tensorwise
        scaling `enable_fsdp_float8_all_gather`, every weight's scale computed in one pass after each
        optimizer step."""
        reason = torchao_unavailable_reason()
        if reason:
            raise Unsupported(reason)
        if recipe.name not in TORCHAO_RECIPES:
            raise Unsupported(f"torchao has no {recipe.name} recipe (its presets: {', '.join(TORCHAO_RECIPES)})")
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp

        config = Float8LinearConfig.from_recipe_name(recipe.name)
        all_gather = fp8_all_gather and recipe.name == "tensorwise"
        if all_gather:
            config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
        convert_to_float8_training(model, config=config, module_filter_fn=lambda module, name: keep(name))
        options = {"torchao_recipe": recipe.name, "fp8_all_gather": all_gather}
        after = (lambda: precompute_float8_dynamic_scale_for_fsdp(model)) if all_gather else (lambda: None)
        return Converted(model, after_optimizer_step=after, options=options)
