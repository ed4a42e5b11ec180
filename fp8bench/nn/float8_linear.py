"""Our Float8Linear: an nn.Linear whose forward and backward run on fp8kernels (quantize + GEMM),
driven by an fp8bench.nn.recipes recipe, eagerly or under torch.compile.

The three products of a training step (fp8bench.nn.recipes) take their operands as the recipe's cast
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

Under torch.compile the activations' casts are written so that inductor fuses them into the kernel
producing the tensor (LayerNorm forward, sigmoid backward; fp8bench.nn._float8_ops):
- a dynamic tensorwise cast takes its amax from torch ops (fused into the producer) and runs only our
  cast pass; eager, our amax kernel is faster than torch's;
- a delayed cast of the input or grad_output knows its scale before the producer runs, so from the
  module's second training step it is torch ops (fp8kernels.reference's formula): the producer writes
  the rowwise fp8 copy instead of BF16 and records the amax, and our fp8 transpose makes the other copy
  from half the bytes a cast pass reads. The first step keeps our kernel, which scales an empty history
  by the tensor's own amax; should a backward still find its history empty later (a module called twice
  in one step), that cast scales by 1, as TransformerEngine's first step does. The weight has no producer
  and keeps our cast+transpose kernel.

Which scalings the kernels multiply: tensorwise x tensorwise, and any mix of tensorwise and axiswise
(a tensor scale is broadcast to one per row, in the axiswise GEMM); blockwise with 1 x 128 left
operands and 128 x 128 or 1 x 128 right operands (the latter not in fp8kernels.gemm: see _float8_ops).

An `activation` (fp8bench.config.Activation) is applied to the output: by the output product's epilogue
where the module has no bias (no extra pass over the output; the backward computes the activation's
gradient from that saved output before grad_output's casts, so under torch.compile inductor fuses it
into the same kernel as the delayed cast), else after the bias, with torch.

`fuse_swiglu` makes a module without either return silu(gate) * up of its gate+up product instead (LLaMa's
w13 with the SwiGLU after it): the forward in torch ops after the product; the backward in one kernel of
ours that reads the SwiGLU's inputs once and writes grad_output's tensorwise casts, or the gradient and its
amax for them (swiglu_grad_forms). Inductor's kernel for the plain ops reads gate, up and grad_h once for
each half of the gate+up gradient it writes.

`convert_to_float8` swaps the nn.Linear modules of a model, leaving in BF16 those whose dimensions the
recipe's products cannot run at, and says which.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from fp8bench.nn import _float8_ops as ops
from fp8bench.nn.llama import swiglu
from fp8bench.config import BLOCK, FP8_DIM_MULTIPLE, Activation, GemmShape, Granularity
from fp8bench.nn.recipes import (
    CastConfig,
    GemmRole,
    LinearGemms,
    LinearTensors,
    Recipe,
    ScalingType,
    TensorRole,
    layer_shape_problem,
)
from fp8kernels import reference


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
    for role in recipe.delayed_roles():
        first, second = recipe.casts(role)
        if first.is_fp8 and second.is_fp8 and first != second:
            return f"{role.value} is scaled with delay in one use and otherwise in the other; one amax history needs one cast"
    return None


def shape_problem(M: int, K: int, N: int, recipe: Recipe) -> str | None:
    """Why the recipe cannot run a linear of K -> N features on M rows (fp8bench.nn.recipes.layer_shape_problem)."""
    return layer_shape_problem(GemmShape(M, K, N), recipe)


# ---- the plan: a recipe turned into constants, once per module --------------------------------------
# What runs inside the autograd function is decided when the module is built: the traced code only
# reads frozen dataclasses and named tuples of strings, ints and bools, which torch.compile treats as
# constants.


class _QuantizeCall(NamedTuple):
    """One quantize kernel call (fp8bench.nn._float8_ops)."""

    delayed: bool
    in_producer: bool  # delayed, of a tensor with a producer: torch ops under torch.compile (docstring)
    granularity: str
    block_rows: int
    fp8_dtype: str
    power_of_two: bool
    rowwise: bool  # makes the first use's form, x[R, C] scaled along rows
    columnwise: bool  # makes the second use's form, x.T scaled along x's columns
    shared_scale: bool  # tensorwise with both forms: one scale, returned once (fp8bench.nn._float8_ops)


class _GemmCall(NamedTuple):
    """How one product runs: `kernel` is BF16_GEMM (torch.mm), a granularity of fp8kernels.gemm, or
    BLOCKWISE_1D; `broadcast` says which operand's tensorwise scale becomes one per row."""

    kernel: str
    fast_accum: bool
    broadcast: tuple[bool, bool]


@dataclass(frozen=True)
class _Plan:
    quantize: LinearTensors[tuple[_QuantizeCall, ...]]  # per tensor: its quantize kernel calls
    gemms: LinearGemms[_GemmCall]
    activation: str  # applied to the output product's result (Activation's value; "none")
    swiglu: bool  # the module returns silu(gate) * up of its gate+up product (Float8Linear.fuse_swiglu)


BF16_GEMM = "bf16"
BLOCKWISE_1D = "blockwise-1x128-1x128"  # both operands in 1 x 128 groups: fp8_gemm_1x128_1x128


def _quantize_call(role: TensorRole, cast: CastConfig, rowwise: bool, columnwise: bool) -> _QuantizeCall:
    delayed = cast.scaling_type is ScalingType.DELAYED
    return _QuantizeCall(
        delayed, delayed and rowwise and role is not TensorRole.WEIGHT, cast.granularity.value, cast.block[0] if cast.block else 0,
        cast.dtype.value, cast.power_of_two_scale, rowwise, columnwise,
        cast.granularity is Granularity.TENSORWISE and rowwise and columnwise,
    )  # fmt: skip


def _quantize_calls(recipe: Recipe, role: TensorRole) -> tuple[_QuantizeCall, ...]:
    """One kernel for both forms where both uses share a cast config (one read), else one per FP8 use."""
    first, second = recipe.casts(role)
    if first.is_fp8 and first == second:
        return (_quantize_call(role, first, True, True),)
    return tuple(_quantize_call(role, c, use == 0, use == 1) for use, c in enumerate((first, second)) if c.is_fp8)


def _gemm_call(recipe: Recipe, gemm: GemmRole) -> _GemmCall:
    granularity = recipe.gemm_granularity(gemm)
    a, b = recipe.operand_casts(gemm)
    if granularity is Granularity.NONE:
        return _GemmCall(BF16_GEMM, False, (False, False))
    if granularity is Granularity.BLOCKWISE and b.block[0] == 1:
        return _GemmCall(BLOCKWISE_1D, False, (False, False))
    broadcast = tuple(granularity is Granularity.AXISWISE and c.granularity is Granularity.TENSORWISE for c in (a, b))
    return _GemmCall(granularity.value, recipe.gemms[gemm].use_fast_accum, broadcast)


def plan(recipe: Recipe, activation: Activation = Activation.NONE, swiglu: bool = False) -> _Plan:
    """The kernel calls of one training step under `recipe`, `activation` applied to the output product, or
    the SwiGLU after it (module docstring)."""
    return _Plan(
        LinearTensors.build(lambda role: _quantize_calls(recipe, role)),
        LinearGemms.build(lambda gemm: _gemm_call(recipe, gemm)),
        Activation(activation).value,
        swiglu,
    )


# The activations in torch: where no GEMM epilogue applies them (a BF16 or cuBLAS product, a bias to add
# first), and their gradients from the activation's output.
_ACTIVATION = {Activation.SIGMOID.value: torch.sigmoid}
_ACTIVATION_BACKWARD = {Activation.SIGMOID.value: torch.ops.aten.sigmoid_backward}


def _activated(out: torch.Tensor, activation: str) -> torch.Tensor:
    """`activation` (an Activation's value) applied to `out` with torch; `out` itself for "none"."""
    return out if activation == Activation.NONE.value else _ACTIVATION[activation](out)


# A form of a tensor as a product reads it: FP8 (data[rows, K], scale), or a BF16 [rows, K] tensor.
Form = tuple[torch.Tensor, torch.Tensor] | torch.Tensor


class Forms(NamedTuple):
    """The FP8 forms of one tensor x[R, C] for its two uses: `first` (R, C) scaled along rows, `second`
    (C, R) = x.T scaled along x's columns; None for a use kept in original precision."""

    first: tuple[torch.Tensor, torch.Tensor] | None
    second: tuple[torch.Tensor, torch.Tensor] | None


def _row_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as 0-d float32 (exact in any dtype), per row first: inductor fuses that into a pointwise
    producer too (sigmoid backward), a whole-tensor amax it does not (torch 2.11). The last reduction is
    torch.max, whose output torchtitan's per-op checkpointing policy keeps (fp8bench.benchmarks.e2e): the
    recompute in the backward then casts without reading x for its amax again."""
    return x.abs().amax(dim=1).max().to(torch.float32)


def _delayed_in_producer(x: torch.Tensor, call: _QuantizeCall, history: torch.Tensor):
    """A delayed cast as torch ops that inductor fuses into x's producer (module docstring); the same
    values and scale as quantize_delayed once the history holds an amax."""
    fp8 = ops.FP8_DTYPES[call.fp8_dtype]
    data, scale = reference.quantize_with_amax(x, ops.history_amax(history, reference.fp8_max(fp8)), fp8, call.power_of_two)
    ops.record_amax(history, _row_amax(x))
    return data, scale, ops.transpose_fp8(data) if call.columnwise else None, None


def cast_tensor(x: torch.Tensor, calls: tuple[_QuantizeCall, ...], history: torch.Tensor | None, histories_filled: bool) -> Forms:
    """x's forms made by `calls`. `histories_filled`: the module has run a training step, so its
    delayed-scaling histories hold amaxes."""
    first = second = None
    for call in calls:
        tensorwise_args = (call.fp8_dtype, call.power_of_two, call.rowwise, call.columnwise)
        if call.in_producer and histories_filled and torch.compiler.is_compiling():
            data, scale, data_t, scale_t = _delayed_in_producer(x, call, history)
        elif call.delayed:
            data, scale, data_t, scale_t = ops.quantize_delayed(x, history, *tensorwise_args)
        elif call.granularity == Granularity.TENSORWISE.value and torch.compiler.is_compiling():
            data, scale, data_t, scale_t = ops.quantize_tensorwise_scaled(x, _row_amax(x), *tensorwise_args)
        else:
            data, scale, data_t, scale_t = ops.quantize(
                x, call.granularity, call.block_rows, call.fp8_dtype, call.power_of_two, call.rowwise, call.columnwise
            )
        if call.rowwise:
            first = (data, scale)
        if call.columnwise:
            second = (data_t, scale if call.shared_scale else scale_t)
    return Forms(first, second)


def swiglu_grad_forms(grad_h: torch.Tensor, gate_up: torch.Tensor, calls: tuple[_QuantizeCall, ...], history: torch.Tensor | None,
                      histories_filled: bool) -> tuple[torch.Tensor | None, Forms]:  # fmt: skip
    """The gradient of the gate+up product from grad_h, that of silu(gate) * up, in the forms `calls` make
    (as cast_tensor's): (the gradient itself, None where both uses take FP8 forms the SwiGLU's kernel
    wrote; its forms). One kernel reads grad_h and gate_up once (fp8bench.nn._float8_ops):
    - one delayed tensorwise cast of both uses with an amax in the history: that kernel writes the forms;
    - one axiswise cast of both uses: the cast pass follows, scaled by the row and column amaxes the
      kernel returns (swiglu_backward_quantize_axiswise);
    - dynamic tensorwise of both uses: the cast pass follows, scaled by the amax the kernel returns;
    - any other cast follows it as cast_tensor makes it (1 x 128 groups: fp8kernels.swiglu_backward's
      docstring says why not in the kernel)."""
    call = calls[0] if len(calls) == 1 else None
    both = call is not None and call.rowwise and call.columnwise
    both_tensorwise = both and call.granularity == Granularity.TENSORWISE.value
    if both_tensorwise and call.delayed and histories_filled:
        data, scale, data_t = ops.swiglu_backward_quantize_delayed(grad_h, gate_up, history, call.fp8_dtype, call.power_of_two)
        return None, Forms((data, scale), (data_t, scale))
    if both and call.granularity == Granularity.AXISWISE.value:
        data, scale, data_t, scale_t = ops.swiglu_backward_quantize_axiswise(grad_h, gate_up, call.fp8_dtype, call.power_of_two)
        return None, Forms((data, scale), (data_t, scale_t))
    grad, amax = ops.swiglu_backward_amax(grad_h, gate_up)
    if both_tensorwise and not call.delayed:
        data, scale, data_t, _ = ops.quantize_tensorwise_scaled(grad, amax, call.fp8_dtype, call.power_of_two, True, True)
        return grad, Forms((data, scale), (data_t, scale))
    return grad, cast_tensor(grad, calls, history, histories_filled)


def run_gemm(call: _GemmCall, a: Form, b_t: Form, activation: str = Activation.NONE.value) -> torch.Tensor:
    """activation(a[m, k] @ b_t[n, k].T), bf16 out: in our GEMM's epilogue, or after a product without one."""
    if call.kernel == BF16_GEMM:
        return _activated(torch.mm(a, b_t.t()), activation)
    (a_data, a_scale), (b_data, b_scale) = a, b_t
    if call.kernel == BLOCKWISE_1D:
        return _activated(ops.fp8_gemm_1x128_1x128(a_data, b_data, a_scale, b_scale), activation)
    if call.broadcast[0]:
        a_scale = a_scale.expand(a_data.shape[0], 1)
    if call.broadcast[1]:
        b_scale = b_scale.expand(b_data.shape[0], 1)
    return ops.fp8_gemm(a_data, b_data, a_scale, b_scale, call.kernel, call.fast_accum, activation)


def _or_original(form, original: torch.Tensor) -> Form:
    """The FP8 form of a use, or the tensor itself where the use keeps its original precision."""
    return original if form is None else form


def _flat(form: Form) -> tuple[torch.Tensor, ...]:
    return form if isinstance(form, tuple) else (form,)


def forward_products(x: torch.Tensor | None, x_forms: Forms, weight: torch.Tensor, weight_history, how: _Plan, histories_filled: bool):
    """The weight's casts and the output product, given x's forms (cast_tensor); x itself is needed only
    where a use keeps its original precision. Returns the output, what the backward reads as a flat
    tuple of tensors (the activated output where there is an activation, then the weight's and x's
    second forms), and how many of those tensors are the weight's (for backward_products)."""
    w_first, w_second = cast_tensor(weight, how.quantize.weight, weight_history, histories_filled)
    out = run_gemm(how.gemms.output, _or_original(x_forms.first, x), _or_original(w_first, weight), how.activation)
    # Second uses, read transposed: [K, N] of the weight for grad_input, [K, M] of x for grad_weight.
    x_second = _flat(x_forms.second if x_forms.second is not None else x.t())  # x is None where both are FP8
    w_second = _flat(_or_original(w_second, weight.t()))
    out, kept = output_and_kept(out, how)
    return out, (*kept, *w_second, *x_second), len(w_second)


def output_and_kept(product: torch.Tensor, how: _Plan) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The module's output from the output product, and what the backward keeps of it first: the activated
    output (the activation's gradient is taken from it), or the gate+up product the SwiGLU's gradient reads."""
    kept = (product,) if how.activation != Activation.NONE.value or how.swiglu else ()
    return (swiglu(product) if how.swiglu else product), kept


def backward_products(how: _Plan, saved, weight_tensors: int, grad_output, grad_output_history, histories_filled: bool,
                      needs_grad_input: bool, needs_grad_weight: bool):  # fmt: skip
    """grad_input and grad_weight (None where not needed) from what forward_products saved (`saved`, of
    which `weight_tensors` are the weight's)."""
    if how.activation != Activation.NONE.value:
        activated, saved = saved[0], saved[1:]
        grad_output = _ACTIVATION_BACKWARD[how.activation](grad_output, in_input_dtype(activated, grad_output))
    if how.swiglu:
        gate_up, saved = saved[0], saved[1:]
    w_saved, x_saved = saved[:weight_tensors], saved[weight_tensors:]
    w_second = w_saved if len(w_saved) == 2 else w_saved[0]
    x_second = x_saved if len(x_saved) == 2 else x_saved[0]
    grad_output = grad_output.contiguous()
    if how.swiglu:
        grad_output, (g_first, g_second) = swiglu_grad_forms(
            grad_output, gate_up, how.quantize.grad_output, grad_output_history, histories_filled
        )
    else:
        g_first, g_second = cast_tensor(grad_output, how.quantize.grad_output, grad_output_history, histories_filled)
    grad_input = grad_weight = None
    if needs_grad_input:
        grad_input = run_gemm(how.gemms.grad_input, _or_original(g_first, grad_output), w_second)
    if needs_grad_weight:
        grad_weight = run_gemm(how.gemms.grad_weight, g_second if g_second is not None else grad_output.t(), x_second)
    return grad_input, grad_weight


def in_input_dtype(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # Not `out.to(x.dtype)` when the dtypes already agree: torch 2.11's dynamo then traces the backward
    # with a zero gradient for this output, silently (torch 2.13 does not).
    return out if out.dtype == x.dtype else out.to(x.dtype)


class _Float8LinearFunction(torch.autograd.Function):
    """x[M, K] @ weight[N, K].T with the plan's casts and products in both passes (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, input_history, weight_history, grad_output_history, how: _Plan, histories_filled: bool):
        x_forms = cast_tensor(x, how.quantize.input, input_history, histories_filled)
        out, saved, ctx.weight_tensors = forward_products(x, x_forms, weight, weight_history, how, histories_filled)
        ctx.save_for_backward(*saved, grad_output_history)
        ctx.plan, ctx.histories_filled = how, histories_filled
        return in_input_dtype(out, x)

    @staticmethod
    def backward(ctx, grad_output):
        *saved, grad_output_history = ctx.saved_tensors
        needs_grad_input, needs_grad_weight = ctx.needs_input_grad[:2]  # x, weight
        grads = backward_products(
            ctx.plan, saved, ctx.weight_tensors, grad_output, grad_output_history, ctx.histories_filled,
            needs_grad_input, needs_grad_weight,
        )  # fmt: skip
        return *grads, None, None, None, None, None


class Float8Linear(nn.Linear):
    """nn.Linear with FP8 products on our kernels, as `recipe` configures them, and `activation` applied to
    its output (module docstring).

    Inputs may have any leading dimensions; their product M must suit the recipe too (shape_problem),
    which is checked on every call."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *, recipe: Recipe,
        activation: Activation = Activation.NONE,
    ):  # fmt: skip
        problem = recipe_problem(recipe) or shape_problem(BLOCK, in_features, out_features, recipe)
        if problem:
            raise ValueError(f"Float8Linear({in_features} -> {out_features}) cannot run recipe {recipe.name!r}: {problem}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.recipe = recipe
        self.activation = Activation(activation)
        # With a bias the activation comes after it, in torch (finish); without, in the output's epilogue.
        self._plan = plan(recipe)
        self._epilogue_plan = plan(recipe, self.activation)
        # The row counts the recipe takes are the multiples of this (1, 16 or 128): a cheap check per call.
        self._rows_multiple = next(m for m in (1, FP8_DIM_MULTIPLE, BLOCK) if not shape_problem(m, in_features, out_features, recipe))
        self._history_names = tuple(f"amax_history_{role.value}" if role in recipe.delayed_roles() else None for role in TensorRole)
        # Set by the first forward that records gradients (or, once fill_histories_by_step has handed it to
        # the training loop, after the first optimizer step): from the next one on, every history it uses has
        # been written (the input's and weight's in that forward, grad_output's in its backward). Only a plan
        # with casts in the producer reads it (no recompile for the others).
        self._histories_filled = not any(call.in_producer for _, calls in self._plan.quantize.items() for call in calls)
        self._filled_in_forward = True
        self._register_histories(device)

    def _register_histories(self, device) -> None:
        for role in self.recipe.delayed_roles():
            length = max(c.amax_history_len for c in self.recipe.casts(role) if c.is_fp8)
            self.register_buffer(f"amax_history_{role.value}", torch.zeros(length, dtype=torch.float32, device=device))

    def amax_history(self, role: TensorRole) -> torch.Tensor | None:
        """The delayed-scaling amax history of a tensor, newest first; None unless the recipe delays it."""
        return getattr(self, f"amax_history_{role.value}", None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Recipe, activation: Activation = Activation.NONE) -> "Float8Linear":
        """A Float8Linear sharing `linear`'s parameters (no copy)."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=False, recipe=recipe, activation=activation)
        new.weight, new.bias = linear.weight, linear.bias
        new._register_histories(linear.weight.device)
        return new

    def rows_of(self, x: torch.Tensor) -> torch.Tensor:
        """x as [M, in_features], contiguous; ValueError where the recipe cannot take M rows."""
        x2d = x.reshape(-1, self.in_features)
        if x2d.shape[0] % self._rows_multiple:
            problem = shape_problem(x2d.shape[0], self.in_features, self.out_features, self.recipe)
            raise ValueError(f"{type(self).__name__} with recipe {self.recipe.name!r} cannot take {x2d.shape[0]} rows: {problem}")
        return x2d.contiguous()

    def step_state(self) -> tuple[list[torch.Tensor | None], bool]:
        """The amax histories (input, weight, grad_output; None where not delayed), and whether they have
        been filled by an earlier training step (the constructor's comment)."""
        histories = [None if name is None else getattr(self, name) for name in self._history_names]
        histories_filled = self._histories_filled
        if not histories_filled and self._filled_in_forward and torch.is_grad_enabled():
            self._histories_filled = True  # a Python bool: torch.compile guards on it, compiling once more
        return histories, histories_filled

    def call_plan(self) -> _Plan:
        """The plan of this call: the activation in the output product's epilogue unless a bias comes first."""
        return self._epilogue_plan if self.bias is None else self._plan

    @property
    def swiglu(self) -> bool:
        """Whether the module returns the SwiGLU of its product (fuse_swiglu)."""
        return self._plan.swiglu

    def fuse_swiglu(self) -> None:
        """From now on return silu(gate) * up of the product, out_features being the gate+up product's (gate
        first) and the output half as wide: the SwiGLU's backward then makes grad_output's casts itself
        (swiglu_grad_forms). ValueError for a module with a bias or an activation, or an odd out_features."""
        if self.bias is not None or self.activation is not Activation.NONE or self.out_features % 2:
            raise ValueError(f"{type(self).__name__}({self.in_features} -> {self.out_features}) takes the SwiGLU of its product only without a "
                             "bias or an activation, with an even number of output features (gate, then up)")  # fmt: skip
        self._plan = self._epilogue_plan = plan(self.recipe, swiglu=True)

    def finish(self, out2d: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The [M, N] product (its SwiGLU [M, N / 2] where fused) back in x's leading dimensions, plus the
        bias, then the activation where the product did not apply it (call_plan)."""
        out = out2d.reshape(*x.shape[:-1], out2d.shape[-1])
        if self.bias is None:
            return out
        return _activated(out + self.bias.to(out.dtype), self.activation.value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = self.rows_of(x)
        histories, histories_filled = self.step_state()
        out = _Float8LinearFunction.apply(x2d, self.weight, *histories, self.call_plan(), histories_filled)
        return self.finish(out, x)

    def extra_repr(self) -> str:
        activation = "" if self.activation is Activation.NONE else f", activation={self.activation.value}"
        swiglu = ", swiglu" if self.swiglu else ""
        return f"{super().extra_repr()}, recipe={self.recipe.name}{activation}{swiglu}"


class _DelayedState:
    """The delayed-scaling state of a region's Float8Linears as its checkpointed forward found it.

    Activation checkpointing runs the region's forward again in the backward. Without this, the recompute
    finds state the forward changed: whether the histories are filled (flipped by the first step's forward,
    so the recompute took another cast path and torch's checkpoint raised), and histories holding the
    forward's amax (the recompute cast with other scales and recorded each amax twice). The forward's
    context keeps a copy; the recompute's puts it back, so the recompute repeats the forward, and on leaving
    puts back the state it found: the forward's, whether or not the recompute ran the casts again (a policy
    keeping the casts returns the forward's outputs without running them). TransformerEngine's checkpoint
    does the same for its modules."""

    def __init__(self, modules: list[Float8Linear]):
        self.modules = modules
        self.kept: list[tuple[bool, list[torch.Tensor]]] = []

    @staticmethod
    def histories(module: Float8Linear) -> list[torch.Tensor]:
        return [module.amax_history(role) for role in module.recipe.delayed_roles()]

    def state(self) -> list[tuple[bool, list[torch.Tensor]]]:
        return [(m._histories_filled, [h.clone() for h in self.histories(m)]) for m in self.modules]

    def restore(self, state: list[tuple[bool, list[torch.Tensor]]]) -> None:
        with torch.no_grad():
            for module, (filled, kept) in zip(self.modules, state):
                module._histories_filled = filled
                torch._foreach_copy_(self.histories(module), kept)

    @contextlib.contextmanager
    def forward(self):
        self.kept = self.state()
        yield

    @contextlib.contextmanager
    def recompute(self):
        found = self.state()
        self.restore(self.kept)
        try:
            yield
        finally:
            self.restore(found)


def fill_histories_by_step(model: nn.Module) -> Callable[[], None]:
    """Hand whether the delayed-scaling histories of `model`'s Float8Linears are filled to the training loop:
    their forwards no longer set it; the function returned, called after each optimizer step, does. Set in a
    forward, it is a side effect torch.compile cannot trace inside a checkpointed block (the block then ran
    uncompiled: 1.25 s a step against 0.63 for dynamic scaling, full 8B on 4 x H200)."""
    modules = [m for m in model.modules() if isinstance(m, Float8Linear) and not m._histories_filled]
    for module in modules:
        module._filled_in_forward = False

    def after_optimizer_step() -> None:
        for module in modules:
            module._histories_filled = True

    return after_optimizer_step


def recompute_contexts(region: nn.Module) -> Callable[[], tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]] | None:
    """For activation checkpointing of `region` (selective or full alike): a function giving, per checkpointed
    call, the contexts its forward and its recompute in the backward run under, so that the recompute repeats
    the forward (_DelayedState); None where no Float8Linear of the region scales with delay."""
    modules = [m for m in region.modules() if isinstance(m, Float8Linear) and m.recipe.delayed_roles()]
    if not modules:
        return None

    def contexts():
        state = _DelayedState(modules)
        return state.forward(), state.recompute()

    return contexts


@dataclass(frozen=True)
class Float8Conversion:
    """What convert_to_float8 did: the names of the swapped modules, and of those left in BF16 with why."""

    converted: tuple[str, ...]
    left_in_bf16: dict[str, str]


ModuleFilter = Callable[[nn.Module, str], bool]


def convert_to_float8(model: nn.Module, recipe: Recipe, module_filter: ModuleFilter | None = None) -> Float8Conversion:
    """Swap, in place, every nn.Linear of `model` (exactly nn.Linear, not a subclass) for a Float8Linear
    running `recipe`, as torchao's convert_to_float8_training does; returns what was swapped.

    - `module_filter(module, name)`, `name` as model.named_modules() gives it ("layers.0.attention.wq"),
      returning False keeps that linear as it is.
    - A linear whose in/out features the recipe's products cannot run at (shape_problem) stays in BF16
      and is listed in `left_in_bf16` with the reason.
    - The Float8Linear shares the linear's weight and bias (no copy), so an optimizer made before the
      conversion still holds the model's parameters, under the same names; a recipe with delayed
      scaling adds the `amax_history_<tensor>` buffers.
    - At run time each converted linear takes inputs of any leading dimensions whose row count suits the
      recipe (a multiple of 1, 16 or 128), else a ValueError says why. Without a GPU the kernels run only
      under TRITON_INTERPRET=1, set before the first forward imports them.

    ValueError for a recipe our kernels cannot run (recipe_problem) or a lone nn.Linear as `model`."""
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
