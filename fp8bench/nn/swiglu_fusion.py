"""The LLaMa feed-forward's SwiGLU fused into the linear beside it, so that FP8 copies come straight out of
the SwiGLU's kernels:
- into the down projection `w2` where the recipe casts h axiswise or in 1 x 128 groups (swiglu_fusion): the
  SwiGLU writes w2's FP8 input itself (fp8kernels.swiglu_cast), the bf16 h = silu(gate) * up neither
  written nor read back. The feed-forward then becomes a Float8FeedForward, one autograd function over
  both linears, so that the SwiGLU's backward makes w13's grad_output casts too (below);
- into the gate+up projection `w13` otherwise (the tensorwise recipes, and rowwise_with_gw_hp): its backward
  computes the gate+up gradient in one of our kernels that writes w13's tensorwise grad_output casts, or the
  gradient and its amax for them (Float8Linear.fuse_swiglu).

In each fp8bench.nn.llama.FeedForward, `swiglu` turns w13's gate+up product into h and only `w2` reads h:
fuse_swiglu_linears swaps `w2` for a Float8SwiGLULinear (sharing its weight, no copy), which takes the
gate+up product, or makes w13 a Float8Linear returning h; `swiglu` becomes nn.Identity. A Float8FeedForward
replaces the FeedForward holding the same linears. Parameter names do not change.

Where the recipe casts h in one config for both of its uses (the output product reads h, grad_weight
reads h.T), one kernel writes both copies:
- rowwise (axiswise both ways): an amax pass (per row and per column of h), then the cast pass;
- blockwise (1 x 128 groups both ways): one pass; a 128 x 128 tile of h holds whole groups of both copies.
rowwise_with_gw_hp keeps h in bf16 for grad_weight, and tensorwise recipes cast h after the SwiGLU
(_FUSED_GRANULARITIES says why).

The copies equal those Float8Linear casts from the unfused h (the kernel rounds silu and the product to
bf16 as the torch ops do), so a fused FFN's forward computes what the unfused one does, bit for bit. The
backward is Float8Linear's (float8_linear.backward_products) for w2, then d(silu(gate) * up) from the
saved gate+up product in our SwiGLU backward kernel (fp8kernels.swiglu_backward: autograd's values,
bit for bit on a GPU, in one read of its inputs where inductor's kernel for autograd's ops reads them
once for each half of its output). A lone Float8SwiGLULinear returns that gradient in bf16 and w13 casts
it as its grad_output, an amax pass then the cast pass under rowwise scaling; in a Float8FeedForward the
kernel returns the gradient's row and column amaxes with it, so that only the cast pass follows
(float8_linear.swiglu_grad_forms). In 1 x 128 groups the cast follows the gradient either way (one
pass: fp8kernels.swiglu_backward's docstring says why not in the SwiGLU's kernel). Under blockwise
scaling w13 is a Float8LayerNormLinear (fp8bench.nn.norm_fusion), whose RMSNorm the Float8FeedForward
runs as that module does.
"""

from __future__ import annotations

import torch
from torch import nn

from fp8bench.config import BLOCK, Activation, Granularity
from fp8bench.nn import _float8_ops as ops
from fp8bench.nn.float8_layernorm_linear import Float8LayerNormLinear, Normalization, norm_backward, normalized_forms
from fp8bench.nn.float8_linear import (
    Float8Linear,
    Forms,
    _Plan,
    backward_products,
    cast_tensor,
    forward_products,
    in_input_dtype,
    plan,
    recipe_problem,
    shape_problem,
)
from fp8bench.nn.llama import FeedForward, SwiGLU
from fp8bench.nn.norm_fusion import Fusion
from fp8bench.nn.recipes import Recipe

# The kernel's casts. Tensorwise h is cast after the SwiGLU: a tensorwise mode of the kernel gave non-finite
# w2 gradients on an H200 with float32 gate+up (the numerics benchmark's float32 masters), which the CPU
# interpreter did not reproduce, and it gained nothing measurable in the e2e proxy; it was removed.
_FUSED_GRANULARITIES = (Granularity.AXISWISE.value, Granularity.BLOCKWISE.value)


def swiglu_fusion(how: _Plan) -> str | None:
    """Why w2's input cast does not fuse into the SwiGLU under this plan, or None where it does: one
    cast makes both copies of h (module docstring)."""
    calls = how.quantize.input
    if len(calls) != 1 or not (calls[0].rowwise and calls[0].columnwise):
        return "the recipe casts h in two configs or keeps it in bf16 for grad_weight; its casts stay after the SwiGLU"
    call = calls[0]
    if call.granularity not in _FUSED_GRANULARITIES:
        return f"h is cast {call.granularity}; the SwiGLU kernel writes axiswise or 1x{BLOCK} casts"
    if call.granularity == Granularity.BLOCKWISE.value and call.block_rows != 1:
        return f"h is cast in {call.block_rows}x{BLOCK} groups; the SwiGLU kernel writes 1x{BLOCK}"
    return None


def _h_like(gate_up: torch.Tensor) -> torch.Tensor:
    """A tensor of h's shape and dtype, for the fake implementations' layouts."""
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


def _spec(fp8_dtype: str, power_of_two: bool):
    from fp8kernels.quantize import QuantizeSpec

    return QuantizeSpec(ops.FP8_DTYPES[fp8_dtype], power_of_two, rowwise=True, columnwise=True)


@torch.library.custom_op("fp8bench::swiglu_quantize", mutates_args=())
def swiglu_quantize(gate_up: torch.Tensor, granularity: str, fp8_dtype: str, power_of_two: bool) -> ops.Quantized:
    """Both copies of h = silu(gate) * up, dynamically scaled (fp8kernels.swiglu_cast), returned as
    fp8bench::quantize returns them."""
    from fp8kernels.swiglu_cast import swiglu_cast_axiswise, swiglu_cast_blockwise

    spec = _spec(fp8_dtype, power_of_two)
    if granularity == Granularity.AXISWISE.value:
        out = swiglu_cast_axiswise(gate_up, spec)
    else:
        out = swiglu_cast_blockwise(gate_up, spec)
    return ops._outputs(out, gate_up, spec)


@swiglu_quantize.register_fake
def _swiglu_quantize_fake(gate_up, granularity, fp8_dtype, power_of_two):
    return ops._quantize_fake(_h_like(gate_up), granularity, 1, fp8_dtype, power_of_two, True, True)


def swiglu_forms(gate_up: torch.Tensor, how: _Plan) -> Forms:
    """Both FP8 forms of h = silu(gate) * up as the plan casts w2's input, from the SwiGLU's kernel."""
    (call,) = how.quantize.input  # one call makes both copies (swiglu_fusion)
    data, scale, data_t, scale_t = swiglu_quantize(gate_up, call.granularity, call.fp8_dtype, call.power_of_two)
    return Forms((data, scale), (data_t, scale if call.shared_scale else scale_t))


class _Float8SwiGLULinearFunction(torch.autograd.Function):
    """silu(gate) * up of gate_up[M, 2K], @ weight[N, K].T, the SwiGLU fused with the input's casts."""

    @staticmethod
    def forward(ctx, gate_up, weight, input_history, weight_history, grad_output_history, how: _Plan, histories_filled: bool):
        out, saved, ctx.weight_tensors = forward_products(None, swiglu_forms(gate_up, how), weight, weight_history, how, histories_filled)
        ctx.save_for_backward(*saved, grad_output_history, gate_up)
        ctx.plan, ctx.histories_filled = how, histories_filled
        return in_input_dtype(out, gate_up)

    @staticmethod
    def backward(ctx, grad_output):
        *saved, grad_output_history, gate_up = ctx.saved_tensors
        needs_gate_up, needs_weight = ctx.needs_input_grad[:2]
        grad_h, grad_weight = backward_products(
            ctx.plan, saved, ctx.weight_tensors, grad_output, grad_output_history, ctx.histories_filled, needs_gate_up, needs_weight
        )
        # Our SwiGLU backward kernel: its amax goes unread, w13 casts its grad_output itself (module docstring).
        grad_gate_up = ops.swiglu_backward_amax(grad_h.contiguous(), gate_up)[0] if needs_gate_up else None
        return grad_gate_up, grad_weight, None, None, None, None, None


class _Float8FeedForwardFunction(torch.autograd.Function):
    """w2(silu(gate) * up) of the gate+up product x[M, K] @ w13.T, or Norm(x) @ w13.T where `eps` is given
    (the norm writing w13's FP8 input: Float8LayerNormLinear's), every FP8 operand written by the kernel
    that produces its tensor (Float8FeedForward). `up` is w13's plan, `up_swiglu` the same returning the
    SwiGLU (its backward takes the SwiGLU's gradient: float8_linear.swiglu_grad_forms), `down` w2's."""

    @staticmethod
    def forward(ctx, x, ln_weight, ln_bias, w13, w2, up: _Plan, up_swiglu: _Plan, down: _Plan, eps: float | None, rms_norm: bool):
        if eps is None:
            forms, mean, rstd = cast_tensor(x, up.quantize.input, None, True), None, None
        else:
            forms, mean, rstd = normalized_forms(x, ln_weight, ln_bias, eps, up, None, rms_norm)
        gate_up, saved_up, ctx.up_weight_tensors = forward_products(x, forms, w13, None, up, True)
        out, saved_down, ctx.down_weight_tensors = forward_products(None, swiglu_forms(gate_up, down), w2, None, down, True)
        ctx.saved_up = len(saved_up)
        ctx.save_for_backward(gate_up, *saved_up, *saved_down, x, mean, rstd, ln_weight, ln_bias)
        ctx.up_swiglu, ctx.down, ctx.normalized, ctx.rms_norm = up_swiglu, down, eps is not None, rms_norm
        return in_input_dtype(out, x)

    @staticmethod
    def backward(ctx, grad_output):
        gate_up, *saved = ctx.saved_tensors
        saved_up, saved_down, (x, mean, rstd, ln_weight, ln_bias) = saved[: ctx.saved_up], saved[ctx.saved_up : -5], saved[-5:]
        needs_x, needs_ln_weight, needs_ln_bias, needs_w13, needs_w2 = ctx.needs_input_grad[:5]
        needs_ln = (needs_x, needs_ln_weight, needs_ln_bias)
        grad_h, grad_w2 = backward_products(ctx.down, saved_down, ctx.down_weight_tensors, grad_output, None, True, True, needs_w2)
        grad_in, grad_w13 = backward_products(
            ctx.up_swiglu, (gate_up, *saved_up), ctx.up_weight_tensors, grad_h, None, True, any(needs_ln), needs_w13
        )
        if not ctx.normalized:
            return grad_in, None, None, grad_w13, grad_w2, None, None, None, None, None
        grad_x, grad_ln_weight, grad_ln_bias = norm_backward(grad_in, x, mean, rstd, ln_weight, ln_bias, needs_ln, ctx.rms_norm)
        return grad_x, grad_ln_weight, grad_ln_bias, grad_w13, grad_w2, None, None, None, None, None


class Float8SwiGLULinear(Float8Linear):
    """The down projection with the SwiGLU before it: takes the gate+up product [..., 2 * in_features]
    (gate first) and returns w2(silu(gate) * up) with `recipe`'s products (module docstring). Build it
    with Float8SwiGLULinear.from_linear(w2, recipe), for a recipe swiglu_fusion accepts."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        problem = swiglu_fusion(self._plan)
        if problem:
            raise ValueError(f"Float8SwiGLULinear cannot run recipe {self.recipe.name!r}: {problem}")

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if gate_up.shape[-1] != 2 * self.in_features:
            raise ValueError(f"Float8SwiGLULinear({self.in_features} -> {self.out_features}) takes the gate+up product of "
                             f"{2 * self.in_features} features, got {gate_up.shape[-1]}")  # fmt: skip
        gate_up2d = gate_up.reshape(-1, gate_up.shape[-1])
        if gate_up2d.shape[0] % self._rows_multiple:
            problem = shape_problem(gate_up2d.shape[0], self.in_features, self.out_features, self.recipe)
            raise ValueError(f"Float8SwiGLULinear with recipe {self.recipe.name!r} cannot take {gate_up2d.shape[0]} rows: {problem}")
        histories, histories_filled = self.step_state()
        out = _Float8SwiGLULinearFunction.apply(gate_up2d.contiguous(), self.weight, *histories, self._plan, histories_filled)
        return self.finish(out, gate_up)


class Float8FeedForward(nn.Module):
    """LLaMa's feed-forward w2(silu(gate) * up) of w13's gate+up product as one autograd function over its
    two linears (TransformerEngine's LayerNormMLP is the like), so that each FP8 operand is written by the
    kernel producing its tensor, both ways (module docstring): w13 a Float8Linear, or a
    Float8LayerNormLinear whose norm writes its input; w2 a Float8SwiGLULinear of the same recipe. The
    parameters stay theirs, under the same names (`w13.weight`, `w2.weight`, `w13.layer_norm_weight`).
    Where either linear has hooks or has been swapped since, the two run as their own modules. Build it with
    Float8FeedForward.from_feed_forward (feed_forward_problem says when it cannot)."""

    def __init__(self, w13: Float8Linear, w2: Float8SwiGLULinear):
        super().__init__()
        problem = feed_forward_problem(w13, w2)
        if problem:
            raise ValueError(f"Float8FeedForward cannot run its linears as one: {problem}")
        self.w13, self.swiglu, self.w2 = w13, nn.Identity(), w2
        self._up_swiglu = plan(w13.recipe, swiglu=True)  # w13's plan returning the SwiGLU, for the backward

    @classmethod
    def from_feed_forward(cls, ffn: nn.Module) -> "Float8FeedForward":
        """One over a feed-forward's w13 and w2 (its `swiglu` must already be fused into w2: an nn.Identity)."""
        if not isinstance(getattr(ffn, "swiglu", None), nn.Identity):
            raise ValueError("the feed-forward's SwiGLU is not fused into its w2")
        return cls(ffn.w13, ffn.w2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _hooked(self.w13) or _hooked(self.w2) or _kinds_problem(self.w13, self.w2):
            # A hook on a linear (fp8bench.nn.tensor_stats) sees that linear's own call, and a linear swapped
            # since (fp8bench.nn.fsdp's FP8 all-gather of a custom recipe's weights) runs as it is: the two run
            # one by one, computing the same values (w13 then casts its grad_output after an amax pass of its own).
            return self.w2(self.w13(x))
        x2d = self.w13.rows_of(x)
        if x2d.shape[0] % self.w2._rows_multiple:
            problem = shape_problem(x2d.shape[0], self.w2.in_features, self.w2.out_features, self.w2.recipe)
            raise ValueError(f"Float8FeedForward with recipe {self.w2.recipe.name!r} cannot take {x2d.shape[0]} rows: {problem}")
        norm = (None, None, None, False)
        if isinstance(self.w13, Float8LayerNormLinear):
            norm = (self.w13.layer_norm_weight, self.w13.layer_norm_bias, self.w13.eps, self.w13.normalization is Normalization.RMS_NORM)
        ln_weight, ln_bias, eps, rms_norm = norm
        out = _Float8FeedForwardFunction.apply(
            x2d, ln_weight, ln_bias, self.w13.weight, self.w2.weight, self.w13.call_plan(), self._up_swiglu, self.w2.call_plan(), eps,
            rms_norm,
        )
        return out.reshape(*x.shape[:-1], out.shape[-1])


def _hooked(module: nn.Module) -> bool:
    """Whether the module has forward or backward hooks of its own."""
    return bool(module._forward_pre_hooks or module._forward_hooks or module._backward_pre_hooks or module._backward_hooks)


def _kinds_problem(w13: nn.Module, w2: nn.Module) -> str | None:
    """Why these linears are not of the kinds Float8FeedForward runs as one, or None."""
    if type(w2) is not Float8SwiGLULinear:
        return f"w2 is a {type(w2).__name__}, not a Float8SwiGLULinear"
    if type(w13) not in (Float8Linear, Float8LayerNormLinear):
        return f"w13 is a {type(w13).__name__}, not a Float8Linear or Float8LayerNormLinear"
    return None


def feed_forward_problem(w13: nn.Module, w2: nn.Module) -> str | None:
    """Why Float8FeedForward cannot run these linears as one, or None."""
    kinds = _kinds_problem(w13, w2)
    if kinds:
        return kinds
    if w13.recipe != w2.recipe:
        return f"w13 runs recipe {w13.recipe.name!r}, w2 {w2.recipe.name!r}"
    if w13.bias is not None or w2.bias is not None or w13.activation is not Activation.NONE or w13.swiglu:
        return "a linear has a bias, or w13 an activation or the SwiGLU of its own"
    if w13.recipe.delayed_roles():
        return "the recipe scales with delay; the feed-forward keeps no amax histories"
    if isinstance(w13, Float8LayerNormLinear) and not w13.norm_writes_input(True):
        return "w13's norm does not write its FP8 input under this recipe"
    return None


def fuse_swiglu_linears(model: nn.Module, recipe: Recipe) -> Fusion:
    """Fuse, in place, the SwiGLU of every llama FeedForward in `model` into its w2 (a Float8SwiGLULinear
    running `recipe`) where the recipe's cast of h fuses (swiglu_fusion), and then make the feed-forward a
    Float8FeedForward, whose w13 takes the SwiGLU's backward; else into its w13 (a Float8Linear running
    `recipe`, or the one it already is, returning the SwiGLU: Float8Linear.fuse_swiglu). Returns which
    linears took it. A linear the recipe cannot run (shape_problem) or that is already converted to
    something other than a Float8Linear is left as it is, with the reason. Call it after
    fp8bench.nn.norm_fusion's fuse_norm_linears (a Float8FeedForward takes w13's fused norm with it) and
    before convert_to_float8, which then leaves the fused modules as they are.

    ValueError for a recipe our kernels cannot run (recipe_problem)."""
    problem = recipe_problem(recipe)
    if problem:
        raise ValueError(f"recipe {recipe.name!r} cannot run on our kernels: {problem}")
    into_w2 = swiglu_fusion(plan(recipe)) is None
    fused: list[str] = []
    unfused: dict[str, str] = {}
    for ffn_name, ffn in list(model.named_modules()):
        if not isinstance(ffn, (FeedForward, Float8FeedForward)):
            continue
        path = lambda child: f"{ffn_name}.{child}" if ffn_name else child  # noqa: E731
        child = "w2" if into_w2 else "w13"
        reason = _why_not(ffn, getattr(ffn, child), recipe)
        if reason:
            unfused[path(child)] = reason
            continue
        w13_reason = _why_not(ffn, ffn.w13, recipe) if into_w2 else None  # before the SwiGLU leaves the feed-forward
        if into_w2:
            ffn.w2 = Float8SwiGLULinear.from_linear(ffn.w2, recipe)
        else:
            if type(ffn.w13) is nn.Linear:
                ffn.w13 = Float8Linear.from_linear(ffn.w13, recipe)
            ffn.w13.fuse_swiglu()
        ffn.swiglu = nn.Identity()
        fused.append(path(child))
        if into_w2:
            reason = w13_reason or _as_one(model, ffn_name, ffn, recipe)
            if reason:
                unfused[path("w13")] = reason
            else:
                fused.append(path("w13"))
    return Fusion(tuple(fused), unfused)


def _as_one(model: nn.Module, ffn_name: str, ffn: FeedForward, recipe: Recipe) -> str | None:
    """Replace the feed-forward (its SwiGLU fused into w2, its w13 one _why_not accepts) by a
    Float8FeedForward over its linears, w13 converted to a Float8Linear first where it is an nn.Linear;
    None where done, else why not."""
    if not ffn_name:
        return "the feed-forward is the model itself, which cannot be replaced"
    w13 = Float8Linear.from_linear(ffn.w13, recipe) if type(ffn.w13) is nn.Linear else ffn.w13
    problem = feed_forward_problem(w13, ffn.w2)
    if problem:
        return problem
    ffn.w13 = w13
    parent_name, _, child = ffn_name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, Float8FeedForward.from_feed_forward(ffn))
    return None


def _why_not(ffn: FeedForward, linear: nn.Module, recipe: Recipe) -> str | None:
    """Why this FeedForward's SwiGLU stays out of `linear` (its w2 or w13), or None."""
    if not isinstance(ffn.swiglu, SwiGLU):
        return "already fused"
    if not (type(linear) is nn.Linear or isinstance(linear, Float8Linear)):  # a fused w2 comes with the SwiGLU's Identity
        return f"the linear is a {type(linear).__name__}, not an nn.Linear or Float8Linear"
    if linear.bias is not None:
        return "the linear has a bias"
    return shape_problem(BLOCK, linear.in_features, linear.out_features, recipe)
