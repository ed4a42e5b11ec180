"""`te`: NVIDIA TransformerEngine: its quantizers (no per-row scaling there; `Float8Quantizer` for delayed
scaling, which records the amax too) and te.LayerNormLinear for the measured layer."""

from __future__ import annotations

from typing import Any

from fp8bench.backends.base import Backend, LayerStep, Level
from fp8bench.backends.quantize import CastRecipe, Quantizer
from fp8bench.config import Granularity
from fp8bench.harness.case import Unsupported


def te_unavailable_reason() -> str | None:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except ImportError:
        return "transformer_engine not installed"
    except Exception as err:  # noqa: BLE001 - a broken install is reported, not crashed on
        return f"transformer_engine does not load: {(str(err).strip().splitlines() or [type(err).__name__])[0][:200]}"
    return None


def _te_recipe(name: str):
    from transformer_engine.common import recipe as te_recipe

    return {
        "tensorwise-delayed": lambda: te_recipe.DelayedScaling(fp8_format=te_recipe.Format.HYBRID, amax_history_len=16, amax_compute_algo="max"),
        "tensorwise": lambda: te_recipe.Float8CurrentScaling(fp8_format=te_recipe.Format.HYBRID),
        "blockwise": lambda: te_recipe.Float8BlockScaling(fp8_format=te_recipe.Format.E4M3),
    }[name]()


class TeBackend(Backend):
    name = "te"
    description = "NVIDIA TransformerEngine: quantizers, te.LayerNormLinear under te.autocast"
    levels = frozenset({Level.CAST, Level.LAYER, Level.MODEL})

    def unavailable_reason(self, level: Level = Level.GEMM) -> str | None:
        return super().unavailable_reason(level) or te_unavailable_reason()

    def quantizer(self, recipe: CastRecipe, spec: Any, history_amax: Any) -> Quantizer:
        if recipe.granularity is Granularity.AXISWISE:
            raise Unsupported("transformer_engine has no per-row (axiswise) scaling")
        import torch
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
        from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer

        from fp8kernels import reference as ref

        te_dtype = tex.DType.kFloat8E4M3 if spec.dtype == ref.E4M3 else tex.DType.kFloat8E5M2
        usage = dict(rowwise=spec.rowwise, columnwise=spec.columnwise, force_pow_2_scales=spec.power_of_two)
        if recipe.delayed:  # TE's scale is our multiplier; its amax buffer takes x's amax as the cast runs
            multiplier = ref.scales_from_amax(history_amax, spec.dtype, spec.power_of_two)[0].reshape(1)
            quantizer = Float8Quantizer(multiplier, torch.zeros_like(multiplier), te_dtype, rowwise=spec.rowwise, columnwise=spec.columnwise)
        elif recipe.granularity is Granularity.TENSORWISE:
            quantizer = Float8CurrentScalingQuantizer(te_dtype, torch.device("cuda"), **usage)
        else:
            quantizer = Float8BlockQuantizer(te_dtype, block_scaling_dim=1 if recipe.block_rows == 1 else 2, **usage)
        return Quantizer(quantizer.quantize, lambda out: out.dequantize(dtype=torch.float32))

    def layer(self, case: Any, weight: Any, compile_backend: str) -> LayerStep:
        """te.LayerNormLinear + torch.sigmoid, eager, under te.autocast (no FP8 for recipe None)."""
        reason = te_unavailable_reason()
        if reason:
            raise Unsupported(reason)
        import torch
        import transformer_engine.pytorch as te

        available, why = (
            te.is_fp8_block_scaling_available(return_reason=True)
            if case.recipe and case.recipe.name == "blockwise"
            else te.is_fp8_available(return_reason=True)
        )
        if case.recipe and not available:
            raise Unsupported(f"transformer_engine: {why}")
        layer = te.LayerNormLinear(
            case.shape.K, case.shape.N, eps=1e-5, bias=False, params_dtype=weight.dtype, device=weight.device
        )
        with torch.no_grad():
            layer.weight.copy_(weight)
        recipe = _te_recipe(case.recipe.name) if case.recipe else None

        def forward(x):
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                y = layer(x)
            return torch.sigmoid(y)

        options = {"te_recipe": type(recipe).__name__ if recipe else "none", "layernorm": "affine (gamma 1, beta 0), grads computed"}
        return LayerStep(forward, layer.weight, tuple(layer.parameters()), options)
