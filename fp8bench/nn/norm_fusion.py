"""The LLaMa blocks' norm -> linear pairs as one module each, so that the RMSNorm writes the linear's FP8
input itself (fp8bench.nn.float8_layernorm_linear, over fp8kernels.layernorm_cast).

In each fp8bench.nn.llama.Block, `attention_norm` feeds `attention.wqkv` and `ffn_norm` feeds
`feed_forward.w13`, and nothing else reads the norms' outputs: fuse_norm_linears swaps each such linear
for a Float8LayerNormLinear (RMSNorm) holding the norm's weight and the linear's (no copy), and the norm
for nn.Identity. The block's forward is unchanged: the fused linear receives the un-normalized x.

It swaps only where the recipe's input cast fuses into the norm (layer_norm_fusion: tensorwise-delayed,
blockwise); every other recipe computes the same with or without the fusion, and keeps its plain
Float8Linear (which FSDP2's FP8 all-gather swaps: fp8bench.nn.fsdp). Call it before convert_to_float8,
which then converts the remaining nn.Linear modules and leaves the fused ones as they are.

The parameters keep their objects (an optimizer made before still holds them) but move under new names:
`layers.0.attention_norm.weight` becomes `layers.0.attention.wqkv.layer_norm_weight`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fp8bench.config import BLOCK
from fp8bench.nn.float8_layernorm_linear import Float8LayerNormLinear, layer_norm_fusion
from fp8bench.nn.float8_linear import Float8Linear, plan, recipe_problem, shape_problem
from fp8bench.nn.llama import Block
from fp8bench.nn.recipes import Recipe

# (norm, the linear it feeds) in a Block, by attribute path.
NORM_LINEAR_PAIRS = (("attention_norm", "attention.wqkv"), ("ffn_norm", "feed_forward.w13"))


@dataclass(frozen=True)
class Fusion:
    """What a fusion of producers into the linears they feed did (fuse_norm_linears, and
    fp8bench.nn.swiglu_fusion's): the names of the linears now fused with their producer, and of those
    left as they were with why."""

    fused: tuple[str, ...]
    unfused: dict[str, str]


def fuse_norm_linears(model: nn.Module, recipe: Recipe) -> Fusion:
    """Swap, in place, the norm -> linear pairs of every llama Block in `model` for Float8LayerNormLinear
    modules running `recipe` (module docstring); returns which linears were fused. A linear the recipe
    cannot run (shape_problem), one already converted to something other than Float8Linear, and every
    pair of a recipe whose input cast does not fuse are left as they are, with the reason.

    ValueError for a recipe our kernels cannot run (recipe_problem)."""
    problem = recipe_problem(recipe)
    if problem:
        raise ValueError(f"recipe {recipe.name!r} cannot run on our kernels: {problem}")
    fuses = layer_norm_fusion(plan(recipe)) is not None
    fused: list[str] = []
    unfused: dict[str, str] = {}
    for block_name, block in model.named_modules():
        if not isinstance(block, Block):
            continue
        for norm_path, linear_path in NORM_LINEAR_PAIRS:
            name = f"{block_name}.{linear_path}" if block_name else linear_path
            norm, linear = block.get_submodule(norm_path), block.get_submodule(linear_path)
            reason = _why_not(norm, linear, recipe, fuses)
            if reason:
                unfused[name] = reason
                continue
            parent_path, _, child = linear_path.rpartition(".")
            setattr(block.get_submodule(parent_path), child, Float8LayerNormLinear.from_modules(norm, linear, recipe))
            setattr(block, norm_path, nn.Identity())
            fused.append(name)
    return Fusion(tuple(fused), unfused)


def _why_not(norm: nn.Module, linear: nn.Module, recipe: Recipe, fuses: bool) -> str | None:
    """Why this norm -> linear pair stays as it is, or None."""
    if not fuses:
        return f"recipe {recipe.name!r} scales the input by its own amax; its cast does not fuse into the norm's kernel"
    if isinstance(norm, nn.Identity) or isinstance(linear, Float8LayerNormLinear):
        return "already fused"
    if type(linear) not in (nn.Linear, Float8Linear):
        return f"the linear is a {type(linear).__name__}, not an nn.Linear"
    return shape_problem(BLOCK, linear.in_features, linear.out_features, recipe)
