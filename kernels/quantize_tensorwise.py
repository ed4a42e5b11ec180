"""Tensorwise FP8 quantization: one scale for the whole tensor (kernels in _quantize_tensorwise.py)."""

from __future__ import annotations

from typing import Optional

import torch
import triton

from fp8kernels._quantize_common import empty_fp8, empty_scales, fp8_constants, launch_config
from fp8kernels._quantize_tensorwise import _amax_partials_kernel, _cast_tensorwise_kernel
from fp8kernels.quantize import QuantizedTensor, QuantizeSpec
from fp8kernels.quantize_configs import QuantizeConfig, QuantizeKernel


def quantize_tensorwise(
    x: torch.Tensor, spec: QuantizeSpec = QuantizeSpec(), config: Optional[QuantizeConfig] = None
) -> QuantizedTensor:
    """x[R, C] (bf16/fp16/fp32, contiguous) -> fp8 copies sharing one 0-d scale.

    Two passes whatever the copies: the amax, then the cast (both copies from one load of each tile)."""
    config = launch_config(x, spec, QuantizeKernel.TENSORWISE, config)
    rows, cols = x.shape
    partials = torch.empty(config.amax_programs, dtype=torch.float32, device=x.device)
    _amax_partials_kernel[(config.amax_programs,)](x, partials, x.numel(), BLOCK=config.amax_block, num_warps=config.num_warps)

    q, q_t = empty_fp8((rows, cols), spec, x, spec.rowwise), empty_fp8((cols, rows), spec, x, spec.columnwise)
    scale = empty_scales((), x, True)
    grid = (triton.cdiv(rows, config.block_rows), triton.cdiv(cols, config.block_cols))
    _cast_tensorwise_kernel[grid](
        x, q, q_t, scale, partials, config.amax_programs, rows, cols, **fp8_constants(spec),
        ROWWISE=spec.rowwise, COLUMNWISE=spec.columnwise, PARTIALS=triton.next_power_of_2(config.amax_programs),
        BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols, num_warps=config.num_warps,
    )  # fmt: skip
    return QuantizedTensor(q, scale if spec.rowwise else None, q_t, scale if spec.columnwise else None)
