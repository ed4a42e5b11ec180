"""Axiswise FP8 quantization: one scale per row (rowwise copy) and per column (columnwise copy,
written transposed). Kernels in _quantize_axiswise.py. `cast_axiswise` is the cast pass alone, for a
caller that has the amaxes already (fp8kernels.swiglu_backward.swiglu_backward_axiswise_amax finds them
while it writes the tensor)."""

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
    tile = _tile(config)

    if kernel is QuantizeKernel.ROWWISE:
        q, scale = empty_fp8((rows, cols), spec, x, True), empty_scales((rows, 1), x, True)
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
    return cast_axiswise(x, row_amax, col_amax, spec, config)


def _tile(config: QuantizeConfig) -> dict:
    return dict(BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols, num_warps=config.num_warps)


def _check_amax(name: str, amax, length: int, x: torch.Tensor) -> None:
    wanted = f"{name} must be a contiguous float32 tensor of shape ({length},) on {x.device}"
    if not isinstance(amax, torch.Tensor):
        raise ValueError(f"{wanted}, got {type(amax).__name__}")
    if amax.dtype != torch.float32 or tuple(amax.shape) != (length,) or amax.device != x.device or amax.stride() != (1,):
        raise ValueError(f"{wanted}, got {amax.dtype} of shape {tuple(amax.shape)}, strides {amax.stride()}, on {amax.device}")


def cast_axiswise(
    x: torch.Tensor, row_amax: torch.Tensor, col_amax: torch.Tensor, spec: QuantizeSpec = QuantizeSpec(),
    config: Optional[QuantizeConfig] = None,
) -> QuantizedTensor:  # fmt: skip
    """quantize_axiswise's cast pass, given the amax of each row, row_amax (R,), and of each column,
    col_amax (C,), of x[R, C], float32 on x's device (both are checked; a copy not asked for leaves its
    own unread). Given x's own amaxes, the result is quantize_axiswise(x, spec)'s bit for bit.
    `config`: the two-pass kernel's (QuantizeKernel.AXISWISE_TWO_PASS), whose tile this pass takes."""
    config = launch_config(x, QuantizeKernel.AXISWISE_TWO_PASS, spec.columnwise, config)
    rows, cols = x.shape
    _check_amax("row_amax", row_amax, rows, x)
    _check_amax("col_amax", col_amax, cols, x)
    q, scale = empty_fp8((rows, cols), spec, x, spec.rowwise), empty_scales((rows, 1), x, spec.rowwise)
    q_t, scale_t = empty_fp8((cols, rows), spec, x, spec.columnwise), empty_scales((cols, 1), x, spec.columnwise)
    _cast_axiswise_kernel[(triton.cdiv(rows, config.block_rows), triton.cdiv(cols, config.block_cols))](
        x, q, scale, q_t, scale_t, row_amax, col_amax, rows, cols, **fp8_constants(spec),
        ROWWISE=spec.rowwise, COLUMNWISE=spec.columnwise, **_tile(config),
    )  # fmt: skip
    return QuantizedTensor(q, scale, q_t, scale_t)
