"""`triton`: ours. The persistent TMA FP8 GEMM (fp8kernels.gemm) for all three granularities, the quantize
kernels (fp8kernels.quantize_*) for every cast recipe, Float8LayerNormLinear for the measured layer, and
convert_to_float8 (Float8Linear) for the model level, after fusing each LLaMa block's RMSNorm and SwiGLU
into the linears they feed (fp8bench.nn.norm_fusion, fp8bench.nn.swiglu_fusion).

Operands are quantized untimed with fp8kernels.reference; the timed call is the GEMM alone. The chosen
kernel config (kernels/gemm_configs.py) is recorded in the row's options. Blockwise always promotes the
FP32 sum per 128 of K (each K-tile has its own scales), so it has no fast-accumulation switch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fp8bench.backends.base import Backend, Converted, LayerStep, Level, Operands, PreparedGemm, fp8_device_problem, quantize_operands
from fp8bench.backends.quantize import CastRecipe, Quantizer, dequantize_ours
from fp8bench.backends.torch_bf16 import compiled, torch_layer, weight_of
from fp8bench.config import Activation, FastAccum, Granularity
from fp8bench.harness.case import Unsupported
from fp8bench.nn.recipes import GemmRole

def quantize_config(recipe: CastRecipe, x) -> dict[str, int]:
    """The launch config our kernel picks for x (recorded in the row's options)."""
    from fp8kernels.quantize_axiswise import axiswise_kernel
    from fp8kernels.quantize_blockwise import blockwise_kernel
    from fp8kernels.quantize_configs import QuantizeKernel, choose, multiprocessors

    if recipe.granularity is Granularity.TENSORWISE:
        kernel = QuantizeKernel.TENSORWISE
    elif recipe.granularity is Granularity.AXISWISE:
        kernel = axiswise_kernel(recipe.columnwise)
    else:
        kernel = blockwise_kernel(recipe.block_rows)
    rows, cols = x.shape
    return {"kernel": kernel.value, **choose(kernel, rows, cols, recipe.columnwise, multiprocessors(x)).as_dict()}


def kernel_operands(operands: Operands, granularity: Granularity) -> tuple[Any, Any, Any, Any]:
    """quantize_operands in the layouts fp8_gemm reads fastest: blockwise activation scales M-major,
    since each K-tile reads one scale per row."""
    qa, qb_t, sa, sb = quantize_operands(operands, granularity)
    if granularity is Granularity.BLOCKWISE:
        sa = sa.t().contiguous().t()
    return qa, qb_t, sa, sb


class TritonBackend(Backend):
    name = "triton"
    description = "fp8kernels.gemm: persistent TMA Triton FP8 GEMM, e4m3 operands, bf16 output"
    granularities = frozenset(Granularity.fp8())
    levels = frozenset({Level.GEMM, Level.CAST, Level.LAYER, Level.MODEL})
    fast_accum_granularities = frozenset({Granularity.TENSORWISE, Granularity.AXISWISE})

    def unavailable_reason(self, level: Level = Level.GEMM) -> str | None:
        # The quantize kernels also run on the CPU under TRITON_INTERPRET=1 (the tests do).
        return None if level is Level.CAST else fp8_device_problem()

    def gemm_config(self, qa, qb_t, sa, sb, granularity: Granularity, fast_accum: bool) -> tuple[Any, str]:
        """The kernel config this backend times on these operands, and where it came from (the row's
        `config_from`): fp8_gemm's own choice, the heuristic's or, under FP8KERNELS_GEMM_AUTOTUNE=1, the tuned one."""
        from fp8kernels.gemm import chosen_config
        from fp8kernels.gemm_autotune import autotune_enabled

        return chosen_config(qa, qb_t, sa, sb, granularity, fast_accum), "autotuned" if autotune_enabled() else "heuristic"

    def prepare_gemm(self, operands: Operands, granularity: Granularity, fast_accum: FastAccum) -> PreparedGemm:
        from fp8kernels.gemm import fp8_gemm

        qa, qb_t, sa, sb = kernel_operands(operands, granularity)
        use_fast_accum = fast_accum is FastAccum.ON
        M, N, K = qa.shape[0], qb_t.shape[0], qa.shape[1]
        config, config_from = self.gemm_config(qa, qb_t, sa, sb, granularity, use_fast_accum)  # tuning (if any) happens here, untimed

        def run():
            return fp8_gemm(qa, qb_t, sa, sb, granularity=granularity, fast_accum=use_fast_accum, config=config)

        return PreparedGemm(run, {"op": "fp8kernels.gemm.fp8_gemm", "dtype": operands.dtype_name, **config.options_for(M, N, K),
                                  "config_from": config_from})

    def quantizer(self, recipe: CastRecipe, spec: Any, history_amax: Any) -> Quantizer:
        import torch

        from fp8kernels._quantize_common import launch_config
        from fp8kernels.quantize_axiswise import quantize_axiswise
        from fp8kernels.quantize_blockwise import quantize_blockwise
        from fp8kernels.quantize_configs import QuantizeKernel
        from fp8kernels.quantize_tensorwise import cast_tensorwise, quantize_tensorwise

        describe = lambda x: {"config": quantize_config(recipe, x)}  # noqa: E731
        if recipe.delayed:  # the cast pass alone, recording x's amax by atomic max (what quantize_delayed runs)
            recorded = torch.zeros((), dtype=torch.float32, device=history_amax.device)

            def cast(x):
                config = launch_config(x, QuantizeKernel.TENSORWISE, spec.columnwise, None)
                return cast_tensorwise(x, history_amax, spec, config, record_amax=recorded)

            return Quantizer(cast, dequantize_ours, describe)
        if recipe.granularity is Granularity.TENSORWISE:
            return Quantizer(lambda x: quantize_tensorwise(x, spec), dequantize_ours, describe)
        if recipe.granularity is Granularity.AXISWISE:
            return Quantizer(lambda x: quantize_axiswise(x, spec), dequantize_ours, describe)
        return Quantizer(lambda x: quantize_blockwise(x, recipe.block_rows, spec), dequantize_ours, describe)

    def layer(self, case: Any, weight: Any, compile_backend: str) -> LayerStep:
        """Our Float8LayerNormLinear (LayerNorm -> our Float8Linear, the sigmoid in the output GEMM's epilogue)."""
        from fp8bench.nn.float8_layernorm_linear import Float8LayerNormLinear, layer_norm_fusion
        from fp8bench.nn.float8_linear import plan, recipe_problem, shape_problem

        if case.recipe is None:
            raise Unsupported("ours is an FP8 layer: the BF16 layer is bf16's")
        problem = recipe_problem(case.recipe) or shape_problem(case.shape.M, case.shape.K, case.shape.N, case.recipe)
        if problem:
            raise Unsupported(problem)
        plain = torch_layer(case.shape, weight)
        layer = type(plain)(Float8LayerNormLinear.from_modules(plain[0], plain[1], case.recipe, activation=Activation.SIGMOID))
        fusion = layer_norm_fusion(plan(case.recipe))
        options = {
            "summary": case.recipe.summary(),
            "sigmoid": "in the output GEMM's epilogue (fp8kernels.gemm activation)",
            "layernorm": f"fused with the input's {fusion} fp8 cast (fp8kernels.layernorm_cast)" if fusion
            else "torch layer_norm, then the input's cast",
        }
        if case.recipe.gemm_granularity(GemmRole.GRAD_WEIGHT) is Granularity.BLOCKWISE:
            options["grad_weight_gemm"] = "torch._scaled_mm (fp8kernels.gemm's 1x128 x 1x128 mode ran at 0.97 of it on an H100)"
        return LayerStep(compiled(layer, case.compiled, compile_backend), weight_of(layer), (weight_of(layer),), options, case.compiled)

    def convert_model(self, model: Any, recipe: Any, keep: Callable[[str], bool], fp8_all_gather: bool, process_group: Any) -> Converted:
        """fp8bench.nn.float8_linear.convert_to_float8 with our recipe; under FSDP2 with tensorwise scaling
        the weights are all-gathered in FP8 (fp8bench.nn.fsdp), their scales computed in one pass after each
        optimizer step. Delayed-scaling histories count as filled from the first optimizer step on, and a
        checkpointed block's recompute finds them as its forward did (float8_linear.recompute_contexts)."""
        from fp8bench.nn.float8_linear import convert_to_float8, fill_histories_by_step, recipe_problem, recompute_contexts
        from fp8bench.nn.norm_fusion import fuse_norm_linears
        from fp8bench.nn.swiglu_fusion import fuse_swiglu_linears

        problem = recipe_problem(recipe)
        if problem:
            raise Unsupported(problem)
        # RMSNorm -> linear pairs become one module whose norm writes the FP8 input (where the recipe's input
        # cast can be fused: delayed and blockwise scaling), and each SwiGLU goes into w2, writing w2's FP8
        # input (rowwise and blockwise), or into w13, whose backward it then casts (fp8bench.nn.swiglu_fusion);
        # convert_to_float8 leaves those modules as they are. Under FP8 all-gather (tensorwise) fp8bench.nn.fsdp
        # swaps the plain Float8Linears, w13 with its SwiGLU among them, for ones whose weights it all-gathers in FP8.
        fusion = fuse_norm_linears(model, recipe)
        swiglu_fused = fuse_swiglu_linears(model, recipe).fused
        done = convert_to_float8(model, recipe, lambda module, name: keep(name))
        options: dict[str, Any] = {
            # every linear now FP8: those convert_to_float8 swapped and those fused with their producer or the
            # SwiGLU (a w13 can be both)
            "converted_linears": len(done.converted) + len(set(fusion.fused) | set(swiglu_fused)), "norm_fused_linears": len(fusion.fused),
            "swiglu_fused_linears": len(swiglu_fused), "summary": recipe.summary(),
        }
        if done.left_in_bf16:
            options["left_in_bf16"] = done.left_in_bf16
        if fp8_all_gather:
            from fp8bench.nn.fsdp import enable_float8_all_gather, precompute_float8_scales

            options["fp8_all_gather"] = enable_float8_all_gather(model)
        fill_histories = fill_histories_by_step(model)  # after the all-gather's swap: the modules that run

        def after_optimizer_step() -> None:
            fill_histories()
            if fp8_all_gather:
                precompute_float8_scales(model)

        return Converted(model, after_optimizer_step=after_optimizer_step, options=options,
                         recompute_contexts=lambda region, selective: recompute_contexts(region))  # fmt: skip


class TunedTritonBackend(TritonBackend):
    """Our GEMM with the autotuner's config for every problem (fp8kernels.gemm_autotune: its cache read, or
    the problem tuned in the build step, untimed), whatever FP8KERNELS_GEMM_AUTOTUNE says: beside `triton` in
    one run, what tuning buys over the heuristic on each shape."""

    name = "triton-tuned"
    description = "fp8kernels.gemm with the autotuner's config per problem (cached per GPU model)"
    levels = frozenset({Level.GEMM})
    opt_in = True  # tuning a new problem times 8-10 configs: seconds per shape and regime

    def gemm_config(self, qa, qb_t, sa, sb, granularity: Granularity, fast_accum: bool) -> tuple[Any, str]:
        from fp8kernels.gemm_autotune import autotuned_config

        return autotuned_config(qa, qb_t, sa, sb, granularity, fast_accum), "autotuned"
