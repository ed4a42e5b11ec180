"""Axiswise FP8 quantization: one scale per row (rowwise copy) and per column (columnwise copy,
written transposed). Kernels in _quantize_axiswise.py."""

from __future__ import annotations

from typing import Optional

import torch
import triton

from fp8kernels._quantize_axiswise import _amax_rows_cols_kernel, _cast_axiswise_kernel, _quantize_rows_kernel
from fp8kernels._quantize_common import empty_fp8, empty_scales, fp8_constants, launch_config
from fp8kernels.quantize import QuantizedTensor, QuantizeSpec
from fp8kernels.quantize_configs import QuantizeConfig, QuantizeKernel


def axiswise_kernel(columnwise: bool) -> QuantizeKernel:
    """The rowwise copy alone takes the one-pass kernel; the columnwise copy needs the two-pass one."""
    return QuantizeKernel.AXISWISE_TWO_PASS if columnwise else QuantizeKernel.ROWWISE


def quantize_axiswise(
    x: torch.Tensor, spec: QuantizeSpec = QuantizeSpec(), config: Optional[QuantizeConfig] = None
) -> QuantizedTensor:
    """x[R, C] (bf16/fp16/fp32, contiguous) -> `data` (R, C) with `scale` (R, 1), one per row, and/or
    `data_t` (C, R) with `scale_t` (C, 1), one per column of x."""
    kernel = axiswise_kernel(spec.columnwise)
    config = launch_config(x, kernel, spec.columnwise, config)
    rows, cols = x.shape
    q, scale = empty_fp8((rows, cols), spec, x, spec.rowwise), empty_scales((rows, 1), x, spec.rowwise)
    q_t, scale_t = empty_fp8((cols, rows), spec, x, spec.columnwise), empty_scales((cols, 1), x, spec.columnwise)
    tile = dict(BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols, num_warps=config.num_warps)

    if kernel is QuantizeKernel.ROWWISE:
        _quantize_rows_kernel[(triton.cdiv(rows, config.block_rows),)](
            x, q, scale, rows, cols, **fp8_constants(spec), WHOLE_ROWS=config.block_cols >= cols, **tile
        )
        return QuantizedTensor(q, scale, None, None)

    amax = torch.zeros(rows + cols, dtype=torch.float32, device=x.device)  # atomic max needs a zero start
    row_amax, col_amax = amax[:rows], amax[rows:]
    col_blocks = triton.cdiv(cols, config.block_cols)
    # Split the rows so that the amax pass has about `amax_programs` programs in all.
    row_slices = max(1, min(config.amax_programs // col_blocks, triton.cdiv(rows, config.block_rows)))
    rows_per_program = triton.cdiv(triton.cdiv(rows, row_slices), config.block_rows) * config.block_rows
    _amax_rows_cols_kernel[(col_blocks, triton.cdiv(rows, rows_per_program))](
        x, row_amax, col_amax, rows, cols, rows_per_program, ROW_AMAX=spec.rowwise, **tile
    )
    _cast_axiswise_kernel[(triton.cdiv(rows, config.block_rows), col_blocks)](
        x, q, scale, q_t, scale_t, row_amax, col_amax, rows, cols, **fp8_constants(spec),
        ROWWISE=spec.rowwise, COLUMNWISE=spec.columnwise, **tile,
    )  # fmt: skip
    return QuantizedTensor(q, scale, q_t, scale_t)
