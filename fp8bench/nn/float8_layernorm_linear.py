"""Our Float8LayerNormLinear: LayerNorm (or RMSNorm: `normalization`, as TransformerEngine's
LayerNormLinear takes it) -> Float8Linear as one module, as TransformerEngine's LayerNormLinear is, so
that the norm can write the linear's FP8 input itself (fp8kernels.layernorm_cast). LLaMa's
RMSNorm -> wqkv and RMSNorm -> w13 pairs become these modules by fp8bench.nn.norm_fusion. Two recipes'
input casts fuse:
- delayed scaling (tensorwise-delayed): the scale is known before the LayerNorm runs, so from the
  module's second training step one kernel reads x and writes the fp8 copy, recording the output's amax
  for the history; the transposed copy the grad_weight product reads is the fp8 transpose of it. Under
  torch.compile inductor fused this cast into its LayerNorm kernel (Float8Linear's `in_producer` casts)
  but computed the LayerNorm's Welford reduction twice there (reports/h100-sxm/ln-delayed-cast-probe):
  0.58 ms at 16384 x 16384 against 0.28 for ours (reports/h100-sxm/layernorm-cast-probe). RMSNorm's
  statistic is one sum of squares, which inductor does not compute twice: there its fused kernel and
  ours do the same work.
- blockwise with 1 x 128 groups in both uses (the blockwise preset's input): each row group is scaled as
  the LayerNorm writes it, from the first step; the transposed copy's groups span 128 rows, so a second
  kernel normalizes x again from the saved statistics and writes it. x is read twice, but the bf16
  output is neither written nor read back (6 bytes an element moved, not 8).
The bf16 norm output never exists.

The backward is the linear's (float8_linear.backward_products), then the norm's from the statistics the
forward kernel saved: aten.native_layer_norm_backward, which inductor compiles as it does for
nn.LayerNorm; RMSNorm's in torch ops (rms_norm_backward: aten's fused one has no CPU kernel), which
inductor fuses into one kernel. Every other recipe, and delayed scaling's first step, run
nn.functional.layer_norm (rms_norm) then Float8Linear: there the cast needs the output's own amax
(tensor-wide, or per column), or the history has none yet; under torch.compile inductor fuses that
amax, and tensorwise-delayed's cast, into its norm kernel (float8_linear's module docstring).
"""

from __future__ import annotations

from enum import Enum

import torch
import torch.nn.functional as F
from torch import nn

from fp8bench.nn import _float8_ops as ops
from fp8bench.config import Activation, Granularity
from fp8bench.nn.float8_linear import (
    Float8Linear,
    Forms,
    _Float8LinearFunction,
    _Plan,
    backward_products,
    forward_products,
    in_input_dtype,
)
from fp8bench.nn.llama import RMSNorm
from fp8bench.nn.recipes import Recipe


class Normalization(Enum):
    """The norm before the linear (TransformerEngine's names)."""

    LAYER_NORM = "LayerNorm"
    RMS_NORM = "RMSNorm"


DELAYED_FUSION = "delayed"
BLOCKWISE_FUSION = "blockwise"


def layer_norm_fusion(how: _Plan) -> str | None:
    """How the LayerNorm writes the input's fp8 copies (module docstring): one cast makes both uses, delayed
    or in 1 x 128 groups; None where it does not."""
    calls = how.quantize.input
    if len(calls) != 1 or not (calls[0].rowwise and calls[0].columnwise):
        return None
    call = calls[0]
    if call.in_producer:
        return DELAYED_FUSION
    if call.granularity == Granularity.BLOCKWISE.value and call.block_rows == 1:
        return BLOCKWISE_FUSION
    return None


def rms_norm_backward(grad_y: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None, needs: tuple[bool, bool]):
    """The gradients of x[R, C] and of the weight (None where not needed or absent) of
    y = x * rstd * weight, given rstd = 1 / sqrt(mean(x^2) + eps) of shape (R, 1), in float32:
    dx = rstd * (g - x * rstd^2 * mean(g * x)) with g = grad_y * weight; dweight = sum over rows of grad_y * x * rstd."""
    grad_y32, x32, rstd = grad_y.float(), x.float(), rstd.float()
    g = grad_y32 if weight is None else grad_y32 * weight.float()
    grad_x = grad_weight = None
    if needs[0]:
        grad_x = (rstd * (g - x32 * rstd.square() * (g * x32).mean(dim=1, keepdim=True))).to(x.dtype)
    if needs[1] and weight is not None:
        grad_weight = (grad_y32 * x32 * rstd).sum(dim=0).to(weight.dtype)
    return grad_x, grad_weight


def normalized_forms(x: torch.Tensor, ln_weight, ln_bias, eps: float, how: _Plan, input_history, rms_norm: bool):
    """The FP8 forms of Norm(x[M, K]) as the plan's input cast makes them, written by the norm's kernel
    (layer_norm_fusion), and the norm's statistics for norm_backward: (Forms, mean, rstd)."""
    (call,) = how.quantize.input  # one call makes both forms (layer_norm_fusion)
    if call.delayed:
        data, scale, data_t, mean, rstd = ops.layernorm_quantize_delayed(
            x, ln_weight, ln_bias, eps, input_history, call.fp8_dtype, call.power_of_two, True, rms_norm
        )
        scale_t = scale
    else:
        data, scale, data_t, scale_t, mean, rstd = ops.layernorm_quantize_blockwise(
            x, ln_weight, ln_bias, eps, call.fp8_dtype, call.power_of_two, rms_norm
        )
    return Forms((data, scale), (data_t, scale_t)), mean, rstd


def norm_backward(grad_ln_out, x, mean, rstd, ln_weight, ln_bias, needs: tuple[bool, bool, bool], rms_norm: bool):
    """The gradients of x, the norm's weight and its bias (None where not needed or absent) from that of
    the norm's output and the statistics normalized_forms returned."""
    if not any(needs):
        return None, None, None
    if rms_norm:
        return *rms_norm_backward(grad_ln_out, x, rstd, ln_weight, needs[:2]), None
    if not x.is_cuda:  # CPU's LayerNorm keeps its statistics in x's dtype (CUDA's, in float32)
        mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
    return torch.ops.aten.native_layer_norm_backward(grad_ln_out, x, [x.shape[1]], mean, rstd, ln_weight, ln_bias, list(needs))


class _Float8LayerNormLinearFunction(torch.autograd.Function):
    """Norm(x[M, K]) @ weight[N, K].T, the LayerNorm (RMSNorm where `rms_norm`, ln_bias None) fused with
    the input's cast (layer_norm_fusion)."""

    @staticmethod
    def forward(
        ctx, x, ln_weight, ln_bias, weight, input_history, weight_history, grad_output_history, how: _Plan, eps: float,
        rms_norm: bool,
    ):  # fmt: skip
        forms, mean, rstd = normalized_forms(x, ln_weight, ln_bias, eps, how, input_history, rms_norm)
        # Histories filled (True): this runs where delayed scaling's histories hold amaxes, or where the
        # recipe has none (blockwise mixes with no tensorwise scaling: float8_linear.recipe_problem).
        out, saved, ctx.weight_tensors = forward_products(None, forms, weight, weight_history, how, True)
        ctx.save_for_backward(*saved, grad_output_history, x, mean, rstd, ln_weight, ln_bias)
        ctx.plan, ctx.rms_norm = how, rms_norm
        return in_input_dtype(out, x)

    @staticmethod
    def backward(ctx, grad_output):
        *saved, grad_output_history, x, mean, rstd, ln_weight, ln_bias = ctx.saved_tensors
        needs_x, needs_ln_weight, needs_ln_bias, needs_weight = ctx.needs_input_grad[:4]
        needs_ln = (needs_x, needs_ln_weight, needs_ln_bias)
        grad_ln_out, grad_weight = backward_products(
            ctx.plan, saved, ctx.weight_tensors, grad_output, grad_output_history, True, any(needs_ln), needs_weight
        )
        grad_x, grad_ln_weight, grad_ln_bias = norm_backward(grad_ln_out, x, mean, rstd, ln_weight, ln_bias, needs_ln, ctx.rms_norm)
        return grad_x, grad_ln_weight, grad_ln_bias, grad_weight, None, None, None, None, None, None


class Float8LayerNormLinear(Float8Linear):
    """LayerNorm (or RMSNorm: `normalization`) over in_features, then a Float8Linear running `recipe` with
    `activation` applied to its output (module docstring). The norm's affine parameters are
    `layer_norm_weight` and `layer_norm_bias` (TransformerEngine's names; RMSNorm has no bias), or None
    with `elementwise_affine=False`."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *, recipe: Recipe,
        activation: Activation = Activation.NONE, eps: float = 1e-5, elementwise_affine: bool = True,
        normalization: Normalization = Normalization.LAYER_NORM,
    ):  # fmt: skip
        super().__init__(in_features, out_features, bias, device, dtype, recipe=recipe, activation=activation)
        self.eps = eps
        self.normalization = Normalization(normalization)
        has_bias = self.normalization is Normalization.LAYER_NORM
        for name, fill, present in (("layer_norm_weight", 1.0, True), ("layer_norm_bias", 0.0, has_bias)):
            param = nn.Parameter(torch.full((in_features,), fill, device=device, dtype=dtype)) if elementwise_affine and present else None
            self.register_parameter(name, param)
        self._fusion = layer_norm_fusion(self._plan)

    @classmethod
    def from_modules(
        cls, norm: nn.Module, linear: nn.Linear, recipe: Recipe, activation: Activation = Activation.NONE
    ) -> "Float8LayerNormLinear":
        """A Float8LayerNormLinear sharing the parameters of `norm` (an nn.LayerNorm, nn.RMSNorm or
        fp8bench.nn.llama.RMSNorm over linear.in_features) and `linear` (no copy), `activation` applied to
        the linear's output."""
        normalization, normalized, eps = _norm_of(norm, linear)
        if normalized != (linear.in_features,):
            raise ValueError(f"the {normalization.value} normalizes over {normalized}; the linear takes {linear.in_features} features")
        with torch.device("meta"):
            new = cls(
                linear.in_features, linear.out_features, bias=False, recipe=recipe, activation=activation,
                eps=eps, elementwise_affine=norm.weight is not None, normalization=normalization,
            )  # fmt: skip
        new.weight, new.bias = linear.weight, linear.bias
        new.layer_norm_weight = norm.weight
        if normalization is Normalization.LAYER_NORM:
            new.layer_norm_bias = norm.bias
        new._register_histories(linear.weight.device)
        return new

    def norm_writes_input(self, histories_filled: bool) -> bool:
        """Whether the norm writes the linear's FP8 input in a call (layer_norm_fusion): with delayed scaling
        from the module's second training step (`histories_filled`), blockwise from the first."""
        return self._fusion == BLOCKWISE_FUSION or (self._fusion == DELAYED_FUSION and histories_filled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = self.rows_of(x)
        histories, histories_filled = self.step_state()
        how = self.call_plan()
        rms_norm = self.normalization is Normalization.RMS_NORM
        if self.norm_writes_input(histories_filled):
            out = _Float8LayerNormLinearFunction.apply(
                x2d, self.layer_norm_weight, self.layer_norm_bias, self.weight, *histories, how, self.eps, rms_norm
            )
        else:
            if rms_norm:
                normalized = F.rms_norm(x2d, (self.in_features,), self.layer_norm_weight, self.eps)
            else:
                normalized = F.layer_norm(x2d, (self.in_features,), self.layer_norm_weight, self.layer_norm_bias, self.eps)
            out = _Float8LinearFunction.apply(normalized, self.weight, *histories, how, histories_filled)
        return self.finish(out, x)

    def extra_repr(self) -> str:
        affine = self.layer_norm_weight is not None
        return f"{super().extra_repr()}, normalization={self.normalization.value}, eps={self.eps}, elementwise_affine={affine}"


def _norm_of(norm: nn.Module, linear: nn.Linear) -> tuple[Normalization, tuple[int, ...], float]:
    """(which norm, the shape it normalizes over, its eps) of a norm module."""
    if isinstance(norm, nn.LayerNorm):
        return Normalization.LAYER_NORM, tuple(norm.normalized_shape), norm.eps
    if isinstance(norm, nn.RMSNorm):
        # eps None: F.rms_norm's default for the input's dtype, the linear's
        eps = norm.eps if norm.eps is not None else torch.finfo(linear.weight.dtype).eps
        return Normalization.RMS_NORM, tuple(norm.normalized_shape), eps
    if isinstance(norm, RMSNorm):
        return Normalization.RMS_NORM, tuple(norm.weight.shape), norm.eps
    raise TypeError(f"{type(norm).__name__} is not a norm Float8LayerNormLinear fuses (nn.LayerNorm, nn.RMSNorm, llama's RMSNorm)")
