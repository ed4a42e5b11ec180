"""FP8 training layers on our kernels (fp8kernels), for the layer benchmark and for models of your own.

- fp8bench.nn.recipes: training recipes per GEMM argument (Recipe, RECIPES, get_recipe), the three
  products of a linear by name (LinearGemms, LinearTensors) and where a recipe cannot run (layer_shape_problem).
- fp8bench.nn.float8_linear: Float8Linear, and convert_to_float8(model, recipe, module_filter), which swaps a
  model's nn.Linear modules for it.
- fp8bench.nn.float8_layernorm_linear: Float8LayerNormLinear, LayerNorm (or RMSNorm) -> Float8Linear as one module.
- fp8bench.nn.norm_fusion: fuse_norm_linears(model, recipe), which makes the LLaMa blocks' RMSNorm -> linear
  pairs such modules where the recipe's input cast fuses into the norm.
- fp8bench.nn.swiglu_fusion: fuse_swiglu_linears(model, recipe), which fuses each LLaMa feed-forward's SwiGLU
  into a linear: into its down projection, a Float8SwiGLULinear whose SwiGLU writes its FP8 input
  (fp8kernels.swiglu_cast), the feed-forward then one Float8FeedForward over both linears whose SwiGLU
  backward serves w13's grad_output casts; or into w13, whose backward then casts the SwiGLU's gradient.

This package imports only fp8bench.config and fp8kernels; the roofline model, the backends and the benchmarks
build on it. Importing it loads no torch: its modules do.
"""
