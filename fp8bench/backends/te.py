"""NVIDIA TransformerEngine. `te`: its quantizers (no per-row scaling there; `Float8Quantizer` for delayed
scaling, which records the amax too), te.LayerNormLinear for the measured layer, and te.Linear swapped into
the model under TE's autocast for the model level. `te-layer` (model level only): the model's blocks as TE's
own TransformerLayer (fp8bench.nn.te_llama), under TE's autocast or, without a recipe, in BF16."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fp8bench.backends.base import Backend, Converted, LayerStep, Level, RecomputeContexts, nested
from fp8bench.backends.quantize import CastRecipe, Quantizer
from fp8bench.config import Granularity
from fp8bench.harness.case import Unsupported


# Our recipe -> TransformerEngine's recipe class of the same scaling.
TE_RECIPES = {"tensorwise-delayed": "DelayedScaling", "tensorwise": "Float8CurrentScaling", "blockwise": "Float8BlockScaling"}


# cuDNN 9's libraries, each after those it links against (libcudnn_graph is the base; libcudnn.so loads the rest).
_CUDNN_LOAD_ORDER = ("_graph", "_engines_precompiled", "_engines_runtime_compiled", "_heuristic", "_ops", "_cnn", "_adv", "")


def _load_torch_cudnn() -> None:
    """Make TransformerEngine's import use the cuDNN torch ships with (the `nvidia-cudnn` wheel) where torch has one.

    TE's core library names every cuDNN sub-library (libcudnn_ops, _cnn, _adv, ...) as a dependency; those torch has
    not loaded yet resolve through the system's library path, where a GPU host may hold another cuDNN 9 (9.14 from
    a deb beside torch's 9.19). Mixed, either TE's import fails (undefined cudnn::backend symbols) or torch's cuDNN
    reports the system version and SDPA loses cuDNN attention for the rest of the process. Loading all of the
    wheel's sub-libraries first makes each dependency resolve to the copy already loaded; CUDNN_HOME (unless the
    user set it) points TE's own search for libcudnn.so at the same folder."""
    import ctypes
    import glob
    import importlib.util
    import os

    try:
        spec = importlib.util.find_spec("nvidia.cudnn") if importlib.util.find_spec("nvidia") else None
    except (ImportError, ValueError):  # an `nvidia` module that is no package: no wheel to load from
        spec = None
    folders = [os.path.join(root, "lib") for root in (spec.submodule_search_locations or [])] if spec else []
    libraries = [path for folder in folders for path in glob.glob(os.path.join(folder, "libcudnn*.so.*[0-9]"))]
    if not libraries:
        return
    os.environ.setdefault("CUDNN_HOME", os.path.dirname(libraries[0]))
    # Dependencies before their dependents, so that no load resolves one through the system's path.
    libraries.sort(key=lambda path: next((rank for rank, part in enumerate(_CUDNN_LOAD_ORDER) if f"libcudnn{part}.so" in path), len(_CUDNN_LOAD_ORDER)))
    for path in libraries:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass  # a sub-library this host cannot load (e.g. one needing NVRTC) leaves TE's import to say so


def te_module():
    """transformer_engine.pytorch, or Unsupported saying why it does not load."""
    try:
        _load_torch_cudnn()
        import transformer_engine.pytorch as te
    except ImportError:
        raise Unsupported("transformer_engine is not installed") from None
    except Exception as err:  # noqa: BLE001 - a broken install is a row, not a crash
        raise Unsupported(f"transformer_engine does not load: {(str(err).strip().splitlines() or [type(err).__name__])[0][:200]}") from None
    return te


def te_unavailable_reason() -> str | None:
    """Why TransformerEngine does not load here, or None. Importing it is what loads it; a training run calls
    this before its first step, so that a failing import is a row before any case has run."""
    try:
        te_module()
    except Unsupported as err:
        return str(err)
    return None


def te_recipe(name: str):
    """TransformerEngine's recipe object for our recipe `name` (TE_RECIPES); E4M3 throughout for
    blockwise, TE's HYBRID (E4M3 forward, E5M2 gradients) for the tensorwise ones."""
    from transformer_engine.common import recipe as te_recipes

    return {
        "tensorwise-delayed": lambda: te_recipes.DelayedScaling(fp8_format=te_recipes.Format.HYBRID, amax_history_len=16, amax_compute_algo="max"),
        "tensorwise": lambda: te_recipes.Float8CurrentScaling(fp8_format=te_recipes.Format.HYBRID),
        "blockwise": lambda: te_recipes.Float8BlockScaling(fp8_format=te_recipes.Format.E4M3),
    }[name]()


def _fp8_problem(te, recipe_name: str) -> str | None:
    """Why TransformerEngine cannot run `recipe_name`'s FP8 on this GPU, or None."""
    available, why = (
        te.is_fp8_block_scaling_available(return_reason=True) if recipe_name == "blockwise" else te.is_fp8_available(return_reason=True)
    )
    return None if available else f"transformer_engine: {why}"


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
        import torch

        te = te_module()
        problem = _fp8_problem(te, case.recipe.name) if case.recipe else None
        if problem:
            raise Unsupported(problem)
        layer = te.LayerNormLinear(
            case.shape.K, case.shape.N, eps=1e-5, bias=False, params_dtype=weight.dtype, device=weight.device
        )
        with torch.no_grad():
            layer.weight.copy_(weight)
        recipe = te_recipe(case.recipe.name) if case.recipe else None

        def forward(x):
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                y = layer(x)
            return torch.sigmoid(y)

        options = {"te_recipe": type(recipe).__name__ if recipe else "none", "layernorm": "affine (gamma 1, beta 0), grads computed"}
        return LayerStep(forward, layer.weight, tuple(layer.parameters()), options)

    def convert_model(self, model: Any, recipe: Any, keep: Callable[[str], bool], fp8_all_gather: bool, process_group: Any) -> Converted:
        """Each nn.Linear that `keep` accepts swapped for a te.Linear holding the same weight; every step runs
        under TE's autocast with DelayedScaling (our tensorwise-delayed), Float8CurrentScaling (tensorwise)
        or Float8BlockScaling (blockwise), the amax reduced over the data-parallel group."""
        te = te_fp8(recipe)
        swapped = swap_linears(te, model, keep)
        options = {"te_recipe": TE_RECIPES[recipe.name], "te_linears": swapped}  # TE's version: the run's metadata
        step_context = autocast_context(te, te_recipe(recipe.name), process_group)
        whole = recompute_contexts(step_context)
        return Converted(model, step_context=step_context, options=options, recompute_contexts=lambda region, selective: None if selective else whole,
                         checkpointed_parts=lambda block, selective: parts_between_linears(te, block) if selective else ("",))  # fmt: skip


def te_fp8(recipe: Any):
    """transformer_engine.pytorch for a model-level conversion to `recipe` (our Recipe), or Unsupported: a
    recipe TE lacks, TE not loading, FP8 this GPU lacks."""
    if recipe.name not in TE_RECIPES:
        raise Unsupported(f"TransformerEngine has no {recipe.name} recipe on Hopper (ours maps {', '.join(TE_RECIPES)})")
    te = te_module()
    problem = _fp8_problem(te, recipe.name)
    if problem:
        raise Unsupported(problem)
    return te


def swap_linears(te, model: Any, keep: Callable[[str], bool]) -> int:
    """Each nn.Linear of `model` that `keep` accepts replaced by a te.Linear holding the same weight; how many."""
    import torch
    from torch import nn

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
    return swapped


def autocast_context(te, te_recipe_object: Any, process_group: Any) -> Callable[[], Any]:
    """A training step's context: TE's autocast with `te_recipe_object`, the amax reduced over `process_group`."""
    # TE 2.x names its context `autocast`; earlier 2.x releases only `fp8_autocast`. The group is passed
    # only under FSDP2, so a single-GPU run never depends on the keyword's name.
    if hasattr(te, "autocast"):
        group = {"amax_reduction_group": process_group} if process_group is not None else {}
        return lambda: te.autocast(enabled=True, recipe=te_recipe_object, **group)
    group = {"fp8_group": process_group} if process_group is not None else {}
    return lambda: te.fp8_autocast(enabled=True, fp8_recipe=te_recipe_object, **group)


def recompute_contexts(step_context: Callable[[], Any]) -> RecomputeContexts:
    """The contexts of a checkpointed region holding TE modules, recomputed whole (full checkpointing;
    te-layer's blocks, TE's TransformerLayer), as te.distributed.checkpoint puts them around a region: the
    forward in TE's recompute region (each delayed-scaling module keeps its scaling state), the recompute in
    TE's recompute phase (that state put back, no amax recorded again) and under the step's autocast, which
    the backward runs outside of (else TE's modules recompute in BF16)."""

    def contexts():
        from transformer_engine.pytorch.distributed import activation_recompute_forward

        forward = activation_recompute_forward(activation_recompute=True, recompute_phase=False)
        recompute = nested(activation_recompute_forward(activation_recompute=True, recompute_phase=True), step_context())
        return forward, recompute

    return contexts


def parts_between_linears(te, block: Any) -> tuple[str, ...]:
    """The names of `block`'s largest submodules holding no te.Linear (of fp8bench.nn.llama.Block: the norms,
    the attention's RoPE and attention, the SwiGLU): what selective checkpointing wraps in place of the block.

    The per-op policy keeps the outputs of products and attention and recomputes the rest; TE's kernels are
    not torch ops, so the policy would recompute TE's linears whole, GEMMs included (full 8B on 4 x H200:
    0.87-0.91x BF16 compiled). Left outside the checkpoints, TE's linears save what their backward needs
    themselves, as the policy keeps our products, and the checkpointed parts recompute what the policy
    recomputes. torch.compile traces each part (a block holding TE's modules inside one checkpoint ran
    eagerly: of TE's 69 kernels a step only the loss's 3 were compiled)."""

    def parts(module: Any, prefix: str):
        for name, child in module.named_children():
            if not any(type(m) is te.Linear for m in child.modules()):
                yield prefix + name
            else:
                yield from parts(child, f"{prefix}{name}.")

    return tuple(parts(block, ""))


TE_LAYER = "te-layer"

# What an e2e row under selective checkpointing records of TE's modules, by implementation.
TE_SELECTIVE_CHECKPOINTING = {
    "te": "the parts between TE's linears checkpointed (norms, RoPE and attention, SwiGLU), each under the per-op policy; "
          "TE's linears, outside, keep what their backward saves, as the policy keeps our products",
    TE_LAYER: "TE's TransformerLayer holds no op the per-op policy keeps (TE's kernels are not torch ops): recomputed whole",
}


class TeLayerBackend(Backend):
    name = TE_LAYER
    description = "NVIDIA TransformerEngine: the model's blocks as te.TransformerLayer, under te.autocast or in BF16"
    levels = frozenset({Level.MODEL})
    runs_bf16 = True

    def unavailable_reason(self, level: Level = Level.GEMM) -> str | None:
        return super().unavailable_reason(level) or te_unavailable_reason()

    def convert_model(self, model: Any, recipe: Any, keep: Callable[[str], bool], fp8_all_gather: bool, process_group: Any) -> Converted:
        """Each block of `model` (fp8bench.nn.llama.Llama) replaced by te.TransformerLayer holding its
        weights (fp8bench.nn.te_llama); the embedding, the final norm and the LM head stay ours, the LM head
        a te.Linear where `keep` takes it. Recipe None: TE's layers in BF16, no autocast; else every step
        under TE's autocast with the recipe (TE_RECIPES). One GPU: the layers are not sharded here."""
        from fp8bench.nn.te_llama import COMPILE_NOTE, MATH_DIFFERENCES, replace_blocks

        if process_group is not None:
            raise Unsupported(f"{TE_LAYER} runs on one GPU (its layers are not wired to FSDP2 here)")
        te = te_module() if recipe is None else te_fp8(recipe)
        options: dict[str, Any] = {"te_layers": replace_blocks(model, te), "te_layer_compile": COMPILE_NOTE, **MATH_DIFFERENCES}
        if recipe is None:
            return Converted(model, options={**options, "te_recipe": "none"})
        options.update(te_recipe=TE_RECIPES[recipe.name], te_linears=swap_linears(te, model, keep))
        step_context = autocast_context(te, te_recipe(recipe.name), process_group)
        whole = recompute_contexts(step_context)
        return Converted(model, step_context=step_context, options=options, recompute_contexts=lambda region, selective: whole)
