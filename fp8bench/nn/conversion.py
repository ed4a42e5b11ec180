"""One model, converted per implementation: what `fp8bench e2e` compares.

Every implementation converts the same module tree (fp8bench.nn.llama) in place, each linear but the LM
head (`output`) unless `lm_head_fp8`:
- `bf16`: left as it is;
- `triton` (ours): fp8bench.nn.float8_linear.convert_to_float8 with one of our recipes; under FSDP2 with
  tensorwise scaling the weights are all-gathered in FP8 (fp8bench.nn.fsdp);
- `torchao`: torchao.float8.convert_to_float8_training with Float8LinearConfig.from_recipe_name (its presets
  tensorwise, rowwise, rowwise_with_gw_hp), `enable_fsdp_float8_all_gather` for tensorwise under FSDP2;
- `te`: each nn.Linear swapped for a te.Linear holding the same weight; the step runs under TE's autocast
  with DelayedScaling (our tensorwise-delayed), Float8CurrentScaling (tensorwise) or Float8BlockScaling
  (blockwise), the amax reduced over the data-parallel group.
A conversion an implementation cannot do (library missing, recipe it lacks, GPU it needs) raises
fp8bench.harness.case.Unsupported; every optional library is imported here, lazily.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fp8bench.harness.case import Unsupported
from fp8bench.nn.recipes import Recipe

IMPLEMENTATIONS = ("bf16", "triton", "torchao", "te")
LM_HEAD = "output"  # fp8bench.nn.llama.Llama's LM head
TORCHAO_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")  # Float8LinearConfig.from_recipe_name's presets
# Our recipe -> TransformerEngine's recipe class of the same scaling.
TE_RECIPES = {"tensorwise-delayed": "DelayedScaling", "tensorwise": "Float8CurrentScaling", "blockwise": "Float8BlockScaling"}


@dataclass
class Converted:
    """A converted model: the context every training step runs under (TE's autocast; none for the
    others), what to call after each optimizer step, and what the row records about the conversion."""

    model: nn.Module
    step_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    after_optimizer_step: Callable[[], None] = lambda: None
    options: dict[str, Any] = field(default_factory=dict)


def convert(
    model: nn.Module, implementation: str, recipe: Recipe | None, *, lm_head_fp8: bool = False,
    fp8_all_gather: bool = False, process_group=None,
) -> Converted:  # fmt: skip
    """Convert `model` in place for `implementation` running `recipe` (None: BF16). `fp8_all_gather`:
    the model is about to be sharded by FSDP2 and tensorwise weights should be all-gathered in FP8;
    `process_group` is the data-parallel group TE reduces its amaxes over."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {implementation!r}; choose one of: {', '.join(IMPLEMENTATIONS)}")
    if (implementation == "bf16") != (recipe is None):
        raise ValueError("bf16 takes no recipe, and every FP8 implementation needs one")
    if implementation == "bf16":
        return Converted(model)
    keep_head = lambda name: lm_head_fp8 or name != LM_HEAD  # noqa: E731
    return _CONVERTERS[implementation](model, recipe, keep_head, fp8_all_gather, process_group)


def _ours(model: nn.Module, recipe: Recipe, keep: Callable[[str], bool], fp8_all_gather: bool, process_group) -> Converted:
    from fp8bench.nn.float8_linear import convert_to_float8, recipe_problem

    problem = recipe_problem(recipe)
    if problem:
        raise Unsupported(problem)
    done = convert_to_float8(model, recipe, lambda module, name: keep(name))
    options: dict[str, Any] = {"converted_linears": len(done.converted), "summary": recipe.summary()}
    if done.left_in_bf16:
        options["left_in_bf16"] = done.left_in_bf16
    if fp8_all_gather:
        from fp8bench.nn.fsdp import enable_float8_all_gather

        options["fp8_all_gather"] = enable_float8_all_gather(model)
    return Converted(model, options=options)


def _torchao(model: nn.Module, recipe: Recipe, keep: Callable[[str], bool], fp8_all_gather: bool, process_group) -> Converted:
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp
    except ImportError as err:
        raise Unsupported(f"torchao is not installed ({err.name})") from None
    if recipe.name not in TORCHAO_RECIPES:
        raise Unsupported(f"torchao has no {recipe.name} recipe (its presets: {', '.join(TORCHAO_RECIPES)})")
    config = Float8LinearConfig.from_recipe_name(recipe.name)
    all_gather = fp8_all_gather and recipe.name == "tensorwise"
    if all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda module, name: keep(name))
    options = {"torchao_recipe": recipe.name, "fp8_all_gather": all_gather}
    # With FP8 all-gather torchao computes every weight's scale in one pass after the optimizer step.
    after = (lambda: precompute_float8_dynamic_scale_for_fsdp(model)) if all_gather else (lambda: None)
    return Converted(model, after_optimizer_step=after, options=options)


def te_recipe(name: str):
    """TransformerEngine's recipe object for our recipe `name` (TE_RECIPES); E4M3 throughout for
    blockwise, TE's HYBRID (E4M3 forward, E5M2 gradients) for the tensorwise ones."""
    from transformer_engine.common import recipe as te_recipes

    return {
        "tensorwise-delayed": lambda: te_recipes.DelayedScaling(fp8_format=te_recipes.Format.HYBRID, amax_history_len=16, amax_compute_algo="max"),
        "tensorwise": lambda: te_recipes.Float8CurrentScaling(fp8_format=te_recipes.Format.HYBRID),
        "blockwise": lambda: te_recipes.Float8BlockScaling(fp8_format=te_recipes.Format.E4M3),
    }[name]()


def te_module():
    """transformer_engine.pytorch, or Unsupported saying why it does not load."""
    try:
        import transformer_engine.pytorch as te
    except ImportError:
        raise Unsupported("transformer_engine is not installed") from None
    except Exception as err:  # noqa: BLE001 - a broken install is a row, not a crash
        raise Unsupported(f"transformer_engine does not load: {(str(err).splitlines() or [''])[0]}") from None
    return te


def _te(model: nn.Module, recipe: Recipe, keep: Callable[[str], bool], fp8_all_gather: bool, process_group) -> Converted:
    if recipe.name not in TE_RECIPES:
        raise Unsupported(f"TransformerEngine has no {recipe.name} recipe on Hopper (ours maps {', '.join(TE_RECIPES)})")
    te = te_module()
    available, why = (
        te.is_fp8_block_scaling_available(return_reason=True) if recipe.name == "blockwise" else te.is_fp8_available(return_reason=True)
    )
    if not available:
        raise Unsupported(f"transformer_engine: {why}")
    swapped = 0
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or not keep(name):
            continue
        weight = module.weight
        linear = te.Linear(module.in_features, module.out_features, bias=False, params_dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            linear.weight.copy_(weight)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, linear)
        swapped += 1
    te_recipe_object = te_recipe(recipe.name)
    # TE 2.x names its context `autocast`; earlier 2.x releases only `fp8_autocast`. The group is passed only
    # under FSDP2, so a single-GPU run never depends on the keyword's name.
    if hasattr(te, "autocast"):
        group = {"amax_reduction_group": process_group} if process_group is not None else {}
        context = lambda: te.autocast(enabled=True, recipe=te_recipe_object, **group)  # noqa: E731
    else:
        group = {"fp8_group": process_group} if process_group is not None else {}
        context = lambda: te.fp8_autocast(enabled=True, fp8_recipe=te_recipe_object, **group)  # noqa: E731
    options = {"te_recipe": TE_RECIPES[recipe.name], "te_linears": swapped, "te_version": getattr(te, "__version__", "?")}
    return Converted(model, step_context=context, options=options)


_CONVERTERS = {"triton": _ours, "torchao": _torchao, "te": _te}
