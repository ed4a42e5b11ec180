"""Blockwise FP8 quantization: one scale per 1 x 128 or 128 x 128 tile (kernel in _quantize_blockwise.py)."""

from __future__ import annotations

from typing import Optional

import torch
import triton

from fp8kernels.scaling import BLOCK
from fp8kernels._quantize_blockwise import _quantize_blocks_kernel
from fp8kernels._quantize_common import empty_fp8, empty_scales, fp8_constants, launch_config
from fp8kernels.quantize import QuantizedTensor, QuantizeSpec
from fp8kernels.quantize_configs import QuantizeConfig, QuantizeKernel


def blockwise_kernel(block_rows: int) -> QuantizeKernel:
    if block_rows not in (1, BLOCK):
        raise ValueError(f"blockwise groups are 1 x {BLOCK} or {BLOCK} x {BLOCK}, got block_rows={block_rows!r}")
    return QuantizeKernel.BLOCKWISE_1X128 if block_rows == 1 else QuantizeKernel.BLOCKWISE_128X128


def quantize_blockwise(
    x: torch.Tensor, block_rows: int, spec: QuantizeSpec = QuantizeSpec(), config: Optional[QuantizeConfig] = None
) -> QuantizedTensor:
    """x[R, C] (bf16/fp16/fp32, contiguous) in block_rows x 128 groups (block_rows 1 or 128).

    The columnwise copy `data_t` (C, R) is x.T quantized in the same groups. C must be a multiple of
    128; so must R for 128 x 128 groups and for the columnwise copy. Scale layouts: fp8kernels.quantize."""
    kernel = blockwise_kernel(block_rows)
    config = launch_config(x, kernel, spec.columnwise, config)
    rows, cols = x.shape
    whole_blocks_of_rows = block_rows == BLOCK or spec.columnwise  # the groups run down the rows too
    if cols % BLOCK or (whole_blocks_of_rows and rows % BLOCK):
        sides = "both sides" if whole_blocks_of_rows else "the number of columns"
        copies = " with the columnwise copy" if spec.columnwise else ""
        raise ValueError(f"{block_rows}x{BLOCK} groups{copies} need {sides} to be multiples of {BLOCK}, got {rows}x{cols}")
    q, q_t = empty_fp8((rows, cols), spec, x, spec.rowwise), empty_fp8((cols, rows), spec, x, spec.columnwise)
    if block_rows == 1:  # outer-dimension-major: allocate the transpose, return its view
        scale = empty_scales((cols // BLOCK, rows), x, spec.rowwise)
        scale_t = empty_scales((rows // BLOCK, cols), x, spec.columnwise)
    else:
        scale = empty_scales((rows // BLOCK, cols // BLOCK), x, spec.rowwise)
        scale_t = empty_scales((cols // BLOCK, rows // BLOCK), x, spec.columnwise)
    _quantize_blocks_kernel[(triton.cdiv(rows, config.block_rows), cols // BLOCK)](
        x, q, scale, q_t, scale_t, rows, cols, **fp8_constants(spec),
        ROWWISE=spec.rowwise, COLUMNWISE=spec.columnwise, GROUP_ROWS=block_rows,
        BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols, num_warps=config.num_warps,
    )  # fmt: skip
    if block_rows == 1:
        scale = scale.t() if spec.rowwise else None
        scale_t = scale_t.t() if spec.columnwise else None
    return QuantizedTensor(q, scale, q_t, scale_t)
