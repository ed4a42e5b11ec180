"""Plain PyTorch FP8 quantization: the formulas every quantize kernel is checked against.

Conventions (shared by the kernels, the cuBLAS backend and the tests):
- A scale is the *dequantization* factor, as torch._scaled_mm takes it: x ~= q.float() * scale, with
  scale = amax / FP8_MAX over the scaling group and q = round(x / scale) saturated to +-FP8_MAX.
  The division is done as a multiplication by FP8_MAX / amax in float32, the kernels' formula.
- Groups run along the last dimension (the GEMM's reduction dimension K): `axiswise` gives one scale
  per row, `blockwise` one per 1 x BLOCK or BLOCK x BLOCK tile. A right-hand operand b[K, N] is
  quantized as its transpose b.T[N, K], which is also the K-major layout FP8 tensor cores read.
- Scales come back in their logical shape, keepdim-style: () tensorwise, (R, 1) axiswise,
  (R, C/BLOCK) for 1 x BLOCK and (R/BLOCK, C/BLOCK) for BLOCK x BLOCK.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
AMAX_FLOOR = 1e-12  # an all-zero group gets a tiny finite scale rather than a division by zero


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def scales_from_amax(amax: torch.Tensor, dtype: torch.dtype, power_of_two: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(multiplier applied before the cast, dequantization scale stored beside the data)."""
    multiplier = fp8_max(dtype) / amax.float().clamp(min=AMAX_FLOOR)
    if power_of_two:
        multiplier = torch.exp2(torch.floor(torch.log2(multiplier)))
    return multiplier, 1.0 / multiplier


def _cast(x: torch.Tensor, multiplier: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    limit = fp8_max(dtype)
    return (x.float() * multiplier).clamp(-limit, limit).to(dtype)


def quantize_tensorwise(x: torch.Tensor, dtype: torch.dtype = E4M3, power_of_two: bool = False):
    return quantize_with_amax(x, x.abs().amax(), dtype, power_of_two)


def quantize_with_amax(x: torch.Tensor, amax: torch.Tensor, dtype: torch.dtype = E4M3, power_of_two: bool = False):
    """Tensorwise, scaled from a given 0-d amax rather than x's own (delayed scaling: its history's)."""
    multiplier, scale = scales_from_amax(amax, dtype, power_of_two)
    return _cast(x, multiplier, dtype), scale


def quantize_axiswise(x: torch.Tensor, dtype: torch.dtype = E4M3, power_of_two: bool = False):
    """One scale per row of a 2-D tensor (amax over the last dimension)."""
    multiplier, scale = scales_from_amax(x.abs().amax(dim=-1, keepdim=True), dtype, power_of_two)
    return _cast(x, multiplier, dtype), scale


def quantize_blockwise(
    x: torch.Tensor, block_rows: int, block_cols: int, dtype: torch.dtype = E4M3, power_of_two: bool = False
):
    """One scale per block_rows x block_cols tile of a 2-D tensor whose sides the tile divides
    (block_rows = 1 for 1 x 128 groups). Ragged row counts are allowed when block_rows == 1."""
    rows, cols = x.shape
    if cols % block_cols or rows % block_rows:
        raise ValueError(f"{block_rows}x{block_cols} blocks do not tile a {rows}x{cols} tensor")
    tiles = x.reshape(rows // block_rows, block_rows, cols // block_cols, block_cols)
    multiplier, scale = scales_from_amax(tiles.abs().amax(dim=(1, 3), keepdim=True), dtype, power_of_two)
    q = _cast(tiles, multiplier, dtype).reshape(rows, cols)
    return q, scale.reshape(rows // block_rows, cols // block_cols)


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of q under a scale of any of the logical shapes above."""
    rows, cols = q.shape
    if scale.dim() == 2 and scale.shape != (rows, 1):
        block_rows, block_cols = rows // scale.shape[0], cols // scale.shape[1]
        scale = scale.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)
    return q.float() * scale
