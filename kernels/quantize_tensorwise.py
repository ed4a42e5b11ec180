"""Tensorwise FP8 quantization: one scale for the whole tensor (kernels in _quantize_tensorwise.py)."""

from __future__ import annotations

from typing import Optional

import torch
import triton

from fp8kernels._quantize_common import empty_fp8, empty_scales, fp8_constants, launch_config
from fp8kernels._quantize_tensorwise import _amax_kernel, _cast_tensorwise_kernel
from fp8kernels.quantize import QuantizedTensor, QuantizeSpec
from fp8kernels.quantize_configs import QuantizeConfig, QuantizeKernel


def quantize_tensorwise(
    x: torch.Tensor, spec: QuantizeSpec = QuantizeSpec(), config: Optional[QuantizeConfig] = None
) -> QuantizedTensor:
    """x[R, C] (bf16/fp16/fp32, contiguous) -> fp8 copies sharing one 0-d scale.

    Two passes whatever the copies: the amax, then the cast (both copies from one load of each tile)."""
    config = launch_config(x, spec, QuantizeKernel.TENSORWISE, config)
    rows, cols = x.shape
    amax = torch.zeros((), dtype=torch.float32, device=x.device)  # atomic max needs a zero start
    _amax_kernel[(config.amax_programs,)](x, amax, x.numel(), BLOCK=config.amax_block, num_warps=config.amax_warps)

    q, q_t = empty_fp8((rows, cols), spec, x, spec.rowwise), empty_fp8((cols, rows), spec, x, spec.columnwise)
    scale = empty_scales((), x, True)
    grid = (triton.cdiv(rows, config.block_rows), triton.cdiv(cols, config.block_cols))
    _cast_tensorwise_kernel[grid](
        x, q, q_t, scale, amax, rows, cols, **fp8_constants(spec), ROWWISE=spec.rowwise, COLUMNWISE=spec.columnwise,
        BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols, num_warps=config.num_warps,
    )  # fmt: skip
    return QuantizedTensor(q, scale if spec.rowwise else None, q_t, scale if spec.columnwise else None)
