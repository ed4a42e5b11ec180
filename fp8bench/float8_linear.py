"""Our Float8Linear: an nn.Linear whose forward and backward run on fp8kernels (quantize + GEMM),
driven by an fp8bench.recipes recipe, eagerly or under torch.compile.

The three products of a training step (fp8bench.recipes) take their operands as the recipe's cast
configs say, each GEMM with the recipe's fast-accumulation setting:

    output      = input @ weight.T          a = input (first use),        b = weight (first use)
    grad_input  = grad_output @ weight      a = grad_output (first use),  b = weight (second use)
    grad_weight = grad_output.T @ input     a = grad_output (second use), b = input (second use)

A use kept in original precision makes its product a BF16 torch.mm. The second use of a tensor is its
transposed copy, scaled along the other dimension; when both uses have the same cast config the
quantize kernel writes both copies from one read (fp8kernels.quantize), else each use is its own cast.
The weight is cast once per step, in the forward, and its second form is kept for the backward; so is
the input's. Delayed scaling keeps an amax history per tensor in the module's buffers
(`amax_history_<tensor>`), updated by every cast (the grad_output's in the backward).

Which scalings the kernels multiply: tensorwise x tensorwise, and any mix of tensorwise and axiswise
(a tensor scale is broadcast to one per row, in the axiswise GEMM); blockwise with 1 x 128 left
operands and 128 x 128 or 1 x 128 right operands (the latter not in fp8kernels.gemm: see _float8_ops).

`convert_to_float8` swaps the nn.Linear modules of a model, leaving in BF16 those whose dimensions the
recipe's products cannot run at, and says which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from fp8bench import _float8_ops as ops
from fp8bench.config import BLOCK, GemmShape, Granularity
from fp8bench.recipes import CastConfig, GemmRole, Recipe, ScalingType, TensorRole
from fp8bench.roofline import layer_shape_problem


class Fp8Operand(NamedTuple):
    """One FP8 form of a tensor as a product reads it: data[rows, K] (K-major) and its scales."""

    data: torch.Tensor
    scale: torch.Tensor
    cast: CastConfig


# A product's operand: FP8, or a BF16 tensor [rows, K] (possibly a transposed view) for torch.mm.
Operand = Fp8Operand | torch.Tensor


def recipe_problem(recipe: Recipe) -> str | None:
    """Why our kernels cannot run one of the recipe's FP8 products, or None."""
    for gemm in GemmRole:
        a, b = recipe.operand_casts(gemm)
        if not a.is_fp8:
            continue
        blockwise = [c.granularity is Granularity.BLOCKWISE for c in (a, b)]
        if any(blockwise) and not all(blockwise):
            return f"the {gemm.value} product mixes blockwise with other scaling, which no kernel of ours multiplies"
        if all(blockwise) and a.block != (1, BLOCK):
            return f"the {gemm.value} product's left operand has {a.block[0]}x{a.block[1]} blocks; our GEMMs take 1x{BLOCK}"
    for role in _delayed_roles(recipe):
        first, second = recipe.casts(role)
        if first.is_fp8 and second.is_fp8 and first != second:
            return f"{role.value} is scaled with delay in one use and otherwise in the other; one amax history needs one cast"
    return None


def shape_problem(M: int, K: int, N: int, recipe: Recipe) -> str | None:
    """Why the recipe cannot run a linear of K -> N features on M rows (fp8bench.roofline's rule)."""
    return layer_shape_problem(GemmShape(M, K, N), recipe)


def _delayed_roles(recipe: Recipe) -> list[TensorRole]:
    return [role for role in TensorRole if any(c.scaling_type is ScalingType.DELAYED for c in recipe.casts(role))]


def _quantize(x: torch.Tensor, cast: CastConfig, rowwise: bool, columnwise: bool, history: torch.Tensor | None):
    """(data, scale, data_t, scale_t) of one quantize kernel; a tensorwise scale serves both copies."""
    if cast.scaling_type is ScalingType.DELAYED:
        data, scale, data_t, scale_t = ops.quantize_delayed(
            x, history, cast.dtype.value, cast.power_of_two_scale, rowwise, columnwise
        )
    else:
        block_rows = cast.block[0] if cast.block else 0
        data, scale, data_t, scale_t = ops.quantize(
            x, cast.granularity.value, block_rows, cast.dtype.value, cast.power_of_two_scale, rowwise, columnwise
        )
    if cast.granularity is Granularity.TENSORWISE and rowwise:
        scale_t = scale
    return data, scale, data_t, scale_t


def cast_tensor(
    x: torch.Tensor, first: CastConfig, second: CastConfig, history: torch.Tensor | None
) -> tuple[Fp8Operand | None, Fp8Operand | None]:
    """The FP8 forms of x[R, C] its two uses need: first (R, C) scaled along rows, second (C, R) = x.T
    scaled along x's columns; None for a use kept in original precision."""
    if first.is_fp8 and first == second:
        data, scale, data_t, scale_t = _quantize(x, first, True, True, history)
        return Fp8Operand(data, scale, first), Fp8Operand(data_t, scale_t, second)
    forms: list[Fp8Operand | None] = [None, None]
    if first.is_fp8:
        data, scale, _, _ = _quantize(x, first, True, False, history)
        forms[0] = Fp8Operand(data, scale, first)
    if second.is_fp8:
        _, _, data_t, scale_t = _quantize(x, second, False, True, history)
        forms[1] = Fp8Operand(data_t, scale_t, second)
    return forms[0], forms[1]


def _broadcast_scale(operand: Fp8Operand) -> torch.Tensor:
    """A tensorwise scale as one per row, so that it multiplies an axiswise operand in the axiswise GEMM."""
    if operand.cast.granularity is Granularity.TENSORWISE:
        return operand.scale.expand(operand.data.shape[0], 1)
    return operand.scale


def product(gemm: GemmRole, a: Operand, b_t: Operand, recipe: Recipe) -> torch.Tensor:
    """a[m, k] @ b_t[n, k].T in BF16 out: a BF16 torch.mm, or the FP8 GEMM the operands' scalings need."""
    if not isinstance(a, Fp8Operand):
        return torch.mm(a, b_t.t())
    granularity = recipe.gemm_granularity(gemm)
    if granularity is Granularity.BLOCKWISE and b_t.cast.block[0] == 1:
        return ops.fp8_gemm_1x128_1x128(a.data, b_t.data, a.scale, b_t.scale)
    scale_a, scale_b = a.scale, b_t.scale
    if granularity is Granularity.AXISWISE:
        scale_a, scale_b = _broadcast_scale(a), _broadcast_scale(b_t)
    return ops.fp8_gemm(a.data, b_t.data, scale_a, scale_b, granularity.value, recipe.gemm_config(gemm).use_fast_accum)


def _or_bf16(form: Fp8Operand | None, original: torch.Tensor) -> Operand:
    """The FP8 form of a use, or the tensor itself where the use keeps its original precision."""
    return original if form is None else form


def _save(form: Operand) -> tuple[torch.Tensor, ...]:
    return (form.data, form.scale) if isinstance(form, Fp8Operand) else (form,)


def _restore(cast: CastConfig, saved: list[torch.Tensor]) -> Operand:
    """Take one saved form (see _save) off the front of `saved`."""
    if cast.is_fp8:
        data, scale = saved.pop(0), saved.pop(0)
        return Fp8Operand(data, scale, cast)
    return saved.pop(0)


class _Float8LinearFunction(torch.autograd.Function):
    """x[M, K] @ weight[N, K].T with the recipe's casts and GEMMs in both passes (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, input_history, weight_history, grad_output_history, recipe: Recipe):
        x_first, x_second = cast_tensor(x, *recipe.casts(TensorRole.INPUT), input_history)
        w_first, w_second = cast_tensor(weight, *recipe.casts(TensorRole.WEIGHT), weight_history)
        out = product(GemmRole.OUTPUT, _or_bf16(x_first, x), _or_bf16(w_first, weight), recipe)
        # Second uses, read transposed: [K, N] of the weight for grad_input, [K, M] of x for grad_weight.
        ctx.save_for_backward(*_save(_or_bf16(w_second, weight.t())), *_save(_or_bf16(x_second, x.t())), grad_output_history)
        ctx.recipe = recipe
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        recipe: Recipe = ctx.recipe
        saved = list(ctx.saved_tensors)
        w_second = _restore(recipe.cast(TensorRole.WEIGHT, True), saved)
        x_second = _restore(recipe.cast(TensorRole.INPUT, True), saved)
        (grad_output_history,) = saved
        grad_output = grad_output.contiguous()
        g_first, g_second = cast_tensor(grad_output, *recipe.casts(TensorRole.GRAD_OUTPUT), grad_output_history)
        grad_input = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_input = product(GemmRole.GRAD_INPUT, _or_bf16(g_first, grad_output), w_second, recipe)
        if ctx.needs_input_grad[1]:
            grad_weight = product(GemmRole.GRAD_WEIGHT, _or_bf16(g_second, grad_output.t()), x_second, recipe)
        return grad_input, grad_weight, None, None, None, None


class Float8Linear(nn.Linear):
    """nn.Linear with FP8 products on our kernels, as `recipe` configures them (module docstring).

    Inputs may have any leading dimensions; their product M must suit the recipe too (shape_problem),
    which is checked on every call."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *, recipe: Recipe):
        problem = recipe_problem(recipe) or shape_problem(BLOCK, in_features, out_features, recipe)
        if problem:
            raise ValueError(f"Float8Linear({in_features} -> {out_features}) cannot run recipe {recipe.name!r}: {problem}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.recipe = recipe
        self._register_histories(device)

    def _register_histories(self, device) -> None:
        for role in _delayed_roles(self.recipe):
            length = max(c.amax_history_len for c in self.recipe.casts(role) if c.is_fp8)
            self.register_buffer(f"amax_history_{role.value}", torch.zeros(length, dtype=torch.float32, device=device))

    def amax_history(self, role: TensorRole) -> torch.Tensor | None:
        """The delayed-scaling amax history of a tensor, newest first; None unless the recipe delays it."""
        return getattr(self, f"amax_history_{role.value}", None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Recipe) -> "Float8Linear":
        """A Float8Linear sharing `linear`'s parameters (no copy)."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=False, recipe=recipe)
        new.weight, new.bias = linear.weight, linear.bias
        new._register_histories(linear.weight.device)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        problem = shape_problem(x2d.shape[0], self.in_features, self.out_features, self.recipe)
        if problem:
            raise ValueError(f"Float8Linear with recipe {self.recipe.name!r} cannot take {x2d.shape[0]} rows: {problem}")
        out = _Float8LinearFunction.apply(
            x2d.contiguous(), self.weight, *(self.amax_history(role) for role in TensorRole), self.recipe
        )
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias.to(out.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}"


@dataclass(frozen=True)
class Float8Conversion:
    """What convert_to_float8 did: the names of the swapped modules, and of those left in BF16 with why."""

    converted: tuple[str, ...]
    left_in_bf16: dict[str, str]


ModuleFilter = Callable[[nn.Module, str], bool]


def convert_to_float8(model: nn.Module, recipe: Recipe, module_filter: ModuleFilter | None = None) -> Float8Conversion:
    """Swap, in place, every nn.Linear of `model` (torchao's convert_to_float8_training) for a
    Float8Linear running `recipe`. `module_filter(module, name)` returning False keeps a linear as it is;
    a linear whose dimensions the recipe cannot run stays in BF16 and is listed with the reason."""
    problem = recipe_problem(recipe)
    if problem:
        raise ValueError(f"recipe {recipe.name!r} cannot run on our kernels: {problem}")
    if type(model) is nn.Linear:
        raise ValueError("convert_to_float8 swaps the linears inside a model; wrap a lone nn.Linear in a container first")
    converted: list[str] = []
    left: dict[str, str] = {}
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or (module_filter is not None and not module_filter(module, name)):
            continue
        problem = shape_problem(BLOCK, module.in_features, module.out_features, recipe)
        if problem:
            left[name] = problem
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, Float8Linear.from_linear(module, recipe))
        converted.append(name)
    return Float8Conversion(tuple(converted), left)
