"""fp8bench's own Triton FP8 kernels (imported as `fp8kernels`): quantize/cast and GEMMs.

`fp8kernels.reference` holds the plain PyTorch formulas every kernel is tested against.
"""
