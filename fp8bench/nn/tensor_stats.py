"""What FP8 casting does to the tensors of a model's Float8Linear layers, step by step.

`TensorStats(model)` registers hooks on every Float8Linear of a model (a forward pre-hook for the input
and weight, a forward hook for the output, a backward pre-hook for grad_output) and removes them on
`close()`: with no TensorStats open a model runs exactly as without (no hook, no check). A layer whose
norm is fused with it (Float8LayerNormLinear) is seen with its normalized input. Each hook casts
its tensor as the layer's recipe casts its first use (fp8kernels.reference's formulas, the kernels'
values) and records per layer and tensor role:

- `underflow_pct`: of the nonzero values, the % that become zero in FP8;
- `saturate_pct`: the % whose scaled magnitude exceeds the FP8 maximum and is clamped (delayed scaling
  whose history's amax is below the current one);
- `amax`: the tensor's current max |x|; `history_amax`: what a delayed cast scales by (the largest amax
  of its history before this step's is recorded; empty for dynamic scaling); `scale`: the dequantization
  scale used (tensorwise; for finer granularities the median over groups);
- for role `output`: `sqnr_db` of the layer's output against the same product in BF16 from the
  same input and weight (empty where they are identical).

Rows are plain dicts (`rows`), one per layer, role and step, with the `step` the caller sets.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fp8bench.config import Granularity
from fp8bench.nn._float8_ops import FP8_DTYPES
from fp8bench.nn.float8_layernorm_linear import Float8LayerNormLinear, Normalization
from fp8bench.nn.float8_linear import Float8Linear
from fp8bench.nn.llama import SwiGLU
from fp8bench.nn.recipes import CastConfig, ScalingType, TensorRole
from fp8bench.nn.swiglu_fusion import Float8SwiGLULinear
from fp8kernels import reference

OUTPUT_ROLE = "output"


def _history_amax(history: torch.Tensor | None) -> float | None:
    """What a delayed cast scales by: its history's largest amax; None for an empty history (the cast
    then scales by the tensor's own amax, fp8bench.nn._float8_ops.quantize_delayed) or none at all."""
    if history is None or not bool((history > 0).any()):
        return None
    return float(history.max())


def quantize_as_cast(x: torch.Tensor, cast: CastConfig, history_amax: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x[R, C] cast as `cast` casts a first use: (fp8 values, dequantization scales), reference formulas."""
    dtype = FP8_DTYPES[cast.dtype.value]
    x = x.float()
    if cast.granularity is Granularity.TENSORWISE:
        amax = x.abs().amax() if history_amax is None else torch.tensor(history_amax)
        return reference.quantize_with_amax(x, amax, dtype, cast.power_of_two_scale)
    if cast.granularity is Granularity.AXISWISE:
        return reference.quantize_axiswise(x, dtype, cast.power_of_two_scale)
    return reference.quantize_blockwise(x, *cast.block, dtype, cast.power_of_two_scale)


def cast_stats(x: torch.Tensor, cast: CastConfig, history_amax: float | None = None) -> dict[str, float | None]:
    """underflow_pct, saturate_pct, amax, history_amax and scale of casting x[R, C] as `cast` does."""
    x = x.detach().float()
    q, scale = quantize_as_cast(x, cast, history_amax)
    nonzero = x != 0
    underflow = (nonzero & (q.float() == 0)).sum().item()
    fp8_max = reference.fp8_max(q.dtype)
    multiplier = 1.0 / reference.dequantize(torch.ones_like(q), scale)
    saturated = ((x * multiplier).abs() > fp8_max).sum().item()
    return {
        "underflow_pct": 100.0 * underflow / max(int(nonzero.sum()), 1),
        "saturate_pct": 100.0 * saturated / x.numel(),
        "amax": float(x.abs().max()),
        "history_amax": history_amax,
        "scale": float(scale.float().median()),
    }


def sqnr_db(signal: torch.Tensor, approximation: torch.Tensor) -> float | None:
    """10 log10(||signal||^2 / ||signal - approximation||^2); None where they are identical."""
    signal, approximation = signal.detach().float(), approximation.detach().float()
    noise = (signal - approximation).pow(2).sum().item()
    if noise == 0:
        return None
    return 10 * math.log10(signal.pow(2).sum().item() / noise)


def linear_input(module: Float8Linear, x: torch.Tensor) -> torch.Tensor:
    """What the layer's GEMM takes as input: x; for a Float8LayerNormLinear (a norm fused with its
    linear, fp8bench.nn.norm_fusion) x normalized by its norm; for a Float8SwiGLULinear (the SwiGLU
    fused into the down projection, fp8bench.nn.swiglu_fusion) silu(gate) * up of the gate+up x."""
    if isinstance(module, Float8SwiGLULinear):
        return SwiGLU()(x)
    if not isinstance(module, Float8LayerNormLinear):
        return x
    if module.normalization is Normalization.RMS_NORM:
        return F.rms_norm(x, (module.in_features,), module.layer_norm_weight, module.eps)
    return F.layer_norm(x, (module.in_features,), module.layer_norm_weight, module.layer_norm_bias, module.eps)


class TensorStats:
    """Hooks on every Float8Linear of `model` that record cast statistics per step (module docstring).
    Use as a context manager, or call close(); set `step` before each training step."""

    def __init__(self, model: nn.Module):
        self.rows: list[dict[str, Any]] = []
        self.step = 0
        self._handles = []
        layers = [(name, m) for name, m in model.named_modules() if isinstance(m, Float8Linear)]
        if not layers:
            raise ValueError("the model has no Float8Linear layer to take statistics of; convert it first (convert_to_float8)")
        for name, module in layers:
            self._handles += [
                module.register_forward_pre_hook(self._pre_forward(name)),
                module.register_forward_hook(self._post_forward(name)),
                module.register_full_backward_pre_hook(self._pre_backward(name)),
            ]

    def _record(self, name: str, module: Float8Linear, role: str, values: dict[str, Any]) -> None:
        self.rows.append({"step": self.step, "layer": name, "role": role, "recipe": module.recipe.name, **values})

    def _role(self, name: str, module: Float8Linear, role: TensorRole, x: torch.Tensor) -> None:
        cast = module.recipe.cast(role, second_use=False)
        if not cast.is_fp8:
            return
        history = module.amax_history(role) if cast.scaling_type is ScalingType.DELAYED else None
        self._record(name, module, role.value, cast_stats(x.reshape(-1, x.shape[-1]), cast, _history_amax(history)))

    def _pre_forward(self, name: str):
        def hook(module: Float8Linear, args) -> None:
            if torch.is_grad_enabled():  # training steps only, not validation
                with torch.no_grad():
                    self._role(name, module, TensorRole.INPUT, linear_input(module, args[0]))
                self._role(name, module, TensorRole.WEIGHT, module.weight)

        return hook

    def _post_forward(self, name: str):
        def hook(module: Float8Linear, args, output) -> None:
            if torch.is_grad_enabled():
                with torch.no_grad():
                    bias = None if module.bias is None else module.bias.to(torch.bfloat16)
                    bf16 = F.linear(linear_input(module, args[0]).to(torch.bfloat16), module.weight.to(torch.bfloat16), bias)
                    if module.activation.value != "none":
                        bf16 = getattr(torch, module.activation.value)(bf16)
                self._record(name, module, OUTPUT_ROLE, {"sqnr_db": sqnr_db(bf16, output)})

        return hook

    def _pre_backward(self, name: str):
        def hook(module: Float8Linear, grad_output) -> None:
            self._role(name, module, TensorRole.GRAD_OUTPUT, grad_output[0])

        return hook

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> "TensorStats":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
